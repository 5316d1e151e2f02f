"""Masked attention over one block of keys (``attention.KEY_BLOCK`` or fewer: Swin's windows
of 49): a block the mask hides whole would leave its queries no key, which eager's op
decides, so the blocked path never skips one there; such calls go to eager's op without
the C side counting the mask, with eager's values; longer rows are still offered."""

from __future__ import annotations

import pytest
import torch

from torchloom_codegen_cpu import attention

from test_cpu_attention import FORWARD, causal_mask, qkv


@pytest.mark.parametrize("Lk", [1, 49, 64])
def test_a_mask_over_one_block_of_keys_goes_to_eagers_op(Lk):
    q, k, v, _ = qkv(2, 4, 4, 98, Lk, 16, seed=Lk)
    mask = causal_mask(98, Lk)
    assert not attention._fast(q, k, v, (), 0.0, False, mask)
    assert attention._fast(q, k, v, (), 0.0, True, None)  # a causal flag: still offered
    blocked = attention.Attention(lambda direction: pytest.fail("the C side was asked"))
    with torch.no_grad():
        got = blocked.forward(q, k, v, 0.0, False, attn_mask=mask)
        want = FORWARD(q, k, v, 0.0, False, attn_mask=mask)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_mask_over_more_keys_is_offered():
    q, k, v, _ = qkv(1, 2, 2, 128, attention.KEY_BLOCK + 1, 16)
    assert attention._fast(q, k, v, (), 0.0, False, causal_mask(128, attention.KEY_BLOCK + 1))
