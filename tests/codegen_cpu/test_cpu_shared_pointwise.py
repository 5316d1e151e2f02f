"""The shared pointwise cases (torchloom.testing.pointwise, which the Triton and scalar_c
codegens' tests also run) on the cpu codegen, compared with eager."""

from __future__ import annotations

import pytest
from torchloom.testing.pointwise import CASES


@pytest.mark.parametrize("name", sorted(CASES))
def test_shared_pointwise_case_matches_eager(check, name):
    text, inputs = CASES[name]
    _, compiled = check(text, *inputs())
    assert len(compiled.choices) == 1
