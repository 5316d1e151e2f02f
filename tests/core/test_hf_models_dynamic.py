"""The Hugging Face training steps of ``test_hf_models.py`` under ``torch.compile(...,
dynamic=True)``: in a file of their own, so that two parallel workers share the models."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")  # in the test extra: always installed

from hf_tiny import check_training_step  # noqa: E402

KINDS = ["gpt2", "bert", "llama", "t5", "vit"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_training_step_matches_eager(kind):
    check_training_step(kind, dynamic=True)
