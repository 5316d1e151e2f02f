"""The rows a compiled optimizer step brought, on the Triton interpreter: ``full_like`` of
a number (a block of the fill, NaN and -0.0 included), ``pow.Scalar`` (a number to a
tensor's powers, the bias correction) and addcdiv with a value, against eager."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import group_text


@pytest.mark.parametrize("fill", [0.1, -0.0, math.nan, 3])
def test_fill_power_and_addcdiv_match_eager(check, fill):
    text = group_text("%m: f32[4, 9], %g: f32[4, 9], %s: f32[4, 9]", f"""
        %d = aten.sub.Tensor(%g, %m) : f32[4, 9]
        %w = aten.full_like.default(%d) {{fill_value = {fill!r}, pin_memory = false}} : f32[4, 9]
        %a = aten.addcmul.default(%m, %w, %d) : f32[4, 9]
        %b = aten.pow.Scalar(%s) {{self = 0.9}} : f32[4, 9]
        %c = aten.addcdiv.default(%a, %g, %b) {{value = -0.3}} : f32[4, 9]""",
                      "%w: f32[4, 9], %c: f32[4, 9]")
    gen = torch.Generator().manual_seed(0)
    m, g = torch.randn(4, 9, generator=gen), torch.randn(4, 9, generator=gen)
    steps = torch.arange(1, 37, dtype=torch.float32).reshape(4, 9)
    got, compiled = check(text, m, g, steps)
    assert [c.codegen for c in compiled.choices] == ["triton"]
