"""Masks the blocked attention declines for themselves (too few blocks hidden whole, a NaN
or +inf) are remembered by identity (``attention.Declined``): a model's later layers, which
get the same mask, go straight to eager's op; a mask changed in place, another mask of the
same values, or a decline for the other inputs' sake (keys that are not finite) are judged
again."""

from __future__ import annotations

import pytest
import torch

from torchloom_codegen_cpu import attention

ATEN = torch.ops.aten
FORWARD = ATEN._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = ATEN._scaled_dot_product_flash_attention_for_cpu_backward.default
MIN = torch.finfo(torch.float32).min


@pytest.fixture
def blocked(codegen, monkeypatch):
    """A fresh Attention on the codegen's libraries, and the list of the answers its C
    calls gave (a tuple where the blocked path ran), both directions."""
    found = attention.Attention(lambda d: codegen._attention._libraries[d].path())
    for direction in attention.DIRECTIONS:  # (loading checks cases through _forward)
        assert found._loaded(direction) is not None
    answers: list = []
    for name in ("_forward", "_backward"):
        real = getattr(attention, name)

        def counted(*args, real=real):
            answer = real(*args)
            answers.append(answer if not isinstance(answer, tuple) else "blocked")
            return answer
        monkeypatch.setattr(attention, name, counted)
    return found, answers


def _inputs(L=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, go = (torch.randn(1, L, 4, 32, generator=g).transpose(1, 2) for _ in range(4))
    return q, k, v, go


def _padding(L=512, padded=64):
    """BERT's padding mask: the last ``padded`` keys hidden, broadcast over queries (an
    eighth of the blocks hidden whole: the C side declines it)."""
    pad = torch.zeros(1, 1, 1, L)
    pad[..., L - padded:] = MIN
    return pad.expand(1, 1, L, L)


def _same(got, want):
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5, equal_nan=True)


def test_a_declined_mask_is_judged_once_for_every_layer(blocked):
    att, answers = blocked
    q, k, v, go = _inputs()
    mask = _padding()
    with torch.no_grad():
        for layer in range(4):
            got = att.forward(q, k, v, 0.0, False, attn_mask=mask)
            want = FORWARD(q, k, v, 0.0, False, attn_mask=mask)
            assert all(torch.equal(a, b) for a, b in zip(got, want))  # eager's op's own
            grads = att.backward(go, q, k, v, *want, 0.0, False, attn_mask=mask)
            assert all(torch.equal(a, b) for a, b in zip(
                grads, BACKWARD(go, q, k, v, *want, 0.0, False, attn_mask=mask)))
    assert answers == [attention._MASK_DECLINED]  # the backward knew it from the forward


def test_a_mask_changed_in_place_or_another_mask_is_judged_again(blocked):
    att, answers = blocked
    q, k, v, go = _inputs()
    base = torch.zeros(1, 1, 1, 512)
    base[..., -64:] = MIN
    mask = base.expand(1, 1, 512, 512)
    with torch.no_grad():
        att.forward(q, k, v, 0.0, False, attn_mask=mask)
        base[..., 128:] = MIN  # now 3/4 of the keys hidden: the blocked path's
        got = att.forward(q, k, v, 0.0, False, attn_mask=mask)
        _same(got, FORWARD(q, k, v, 0.0, False, attn_mask=mask))
        att.forward(q, k, v, 0.0, False, attn_mask=_padding())  # new object, declined
        mask = _padding()
        att.forward(q, k, v, 0.0, False, attn_mask=mask)
        att.forward(q[:, :, :256], k, v, 0.0, False, attn_mask=mask[:, :, :256])  # a view
        att.forward(q, k, v, 0.0, False, attn_mask=mask)  # (kept)
    assert answers == [attention._MASK_DECLINED, "blocked", attention._MASK_DECLINED,
                       attention._MASK_DECLINED, attention._MASK_DECLINED]


def test_a_decline_for_the_keys_sake_is_not_kept_for_the_mask(blocked):
    att, answers = blocked
    q, k, v, go = _inputs()
    mask = torch.full((512, 512), MIN).triu(1)  # causal: the blocked path's
    bad = k.clone()
    bad[0, 1, 500, 3] = float("nan")
    with torch.no_grad():
        got = att.forward(q, bad, v, 0.0, False, attn_mask=mask)
        _same(got, FORWARD(q, bad, v, 0.0, False, attn_mask=mask))
        got = att.forward(q, k, v, 0.0, False, attn_mask=mask)
        _same(got, FORWARD(q, k, v, 0.0, False, attn_mask=mask))
    assert answers == [4, "blocked"]


def test_the_memory_of_masks_is_bounded_and_weak():
    seen = attention.Declined()
    q = k = torch.zeros(1, 1, 8, 4)
    masks = [torch.zeros(8, 8) for _ in range(40)]
    for m in masks:
        seen.add(m, q, k)
    assert len(seen._seen) <= attention.Declined._MOST
    assert seen.has(masks[-1], q, k) and not seen.has(masks[0], q, k)
    last = masks.pop()
    del last  # a freed mask's id may come back for another tensor: never the same entry
    fresh = torch.zeros(8, 8)
    assert not seen.has(fresh, q, k)


def test_inference_tensors_are_judged_each_call(blocked):
    """An inference tensor keeps no version (reading it raises): its mask is judged on
    every call, and every call gives eager's values."""
    att, answers = blocked
    q, k, v, go = _inputs()
    with torch.inference_mode():
        mask = _padding().clone()
        for _ in range(2):
            got = att.forward(q, k, v, 0.0, False, attn_mask=mask)
            assert all(torch.equal(a, b) for a, b in
                       zip(got, FORWARD(q, k, v, 0.0, False, attn_mask=mask)))
    assert answers == [attention._MASK_DECLINED] * 2
