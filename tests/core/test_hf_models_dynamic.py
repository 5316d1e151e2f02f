"""Real Hugging Face models (transformers, tiny configs built locally: nothing is
downloaded) trained one step per sequence length through ``torch.compile(backend=
"torchloom", dynamic=True)`` against eager: loss, logits and every parameter's gradient
(``test_hf_models.py`` has the same steps under automatic dynamic shapes).

Also counted: no graph falls back to eager, and nearly every fusion group is a C kernel
(these models found five codegen gaps: groups returning a broadcast operand, dropout's
backward, masked_fill, true_divide, and symbolic outputs with permuted strides)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # in the test extra: always installed

from hf_tiny import check_training_step  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [True], ids=["dynamic"])
@pytest.mark.parametrize("kind", ["gpt2", "bert", "llama", "t5", "vit"])
def test_training_step_matches_eager(kind, dynamic):
    check_training_step(kind, dynamic)
