"""``full_like`` of a number joins the group that reads it (a constant of its input's shape:
a compiled lerp's weight, ``torch._foreach_lerp_`` traced), with eager's values; a fill of
another kind (a float into an integer tensor, another device) stays an op of its own."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import codegens, compiled


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("fill", [0.1, 2, -0.0, math.nan])
@pytest.mark.parametrize("shape", [(37,), (2, 3, 17)])
def test_full_like_fuses_with_eager_values(dtype, fill, shape, tmp_path):
    if not dtype.is_floating_point and isinstance(fill, float):
        fill = 3  # an integer tensor's fill

    def f(m, g):
        d = g - m
        if not dtype.is_floating_point:  # (addcmul has no integer row)
            return m + torch.full_like(d, fill) * d, torch.full_like(m, fill) * m
        return torch.addcmul(m, torch.full_like(d, fill), d), torch.full_like(m, fill) * m

    if dtype.is_floating_point:
        m, g = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    else:
        m, g = torch.randint(-9, 9, shape), torch.randint(-9, 9, shape)
    compiler, cf = compiled(f, tmp_path)
    for got, want in zip(cf(m, g), f(m, g)):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert codegens(compiler) == ["cpu"]  # one kernel: both fills inside it


def test_a_float_fill_of_an_integer_tensor_is_left_out(tmp_path):
    def f(x):
        return torch.full_like(x, 2.7) + x, torch.full_like(x, 1.5, dtype=torch.float32) * x

    x = torch.arange(12).reshape(3, 4)
    compiler, cf = compiled(f, tmp_path)
    for got, want in zip(cf(x), f(x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    region_ops = [n.op for comp in compiler.compilations for c in comp.compiled.choices
                  for n in c.node.region.nodes]
    # the integer one (2.7 truncated to 2 by eager) runs as eager runs it; the float
    # fill of an f32 result fuses
    assert region_ops.count("aten.full_like.default") == 1
