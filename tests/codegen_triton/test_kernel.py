"""Pointwise kernels (kernel.py): broadcasting, promotion, casts, scalars, strides, views,
edge values. Each case runs on the Triton interpreter and is compared with eager."""

from __future__ import annotations

import pytest
import torch

from conftest import Checker, group_text
from torchloom.testing.pointwise import CASES as POINTWISE_CASES

g = torch.Generator().manual_seed(0)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


#: the shared cases (torchloom.testing.pointwise)
CASES = POINTWISE_CASES


@pytest.mark.parametrize("name", sorted(CASES))
def test_pointwise_matches_eager(check, name):
    text, inputs = CASES[name]
    got, compiled = check(text, *inputs())
    assert len(compiled.choices) == 1


def test_scalar_arguments_are_not_baked_into_the_kernel(check):
    """One compiled kernel serves other scalar values (they are kernel arguments)."""
    text, inputs = CASES["scalar_arguments"]
    a, _, _ = inputs()
    _, compiled = check(text, a, 2.5, 3)
    (got,) = compiled(a, -1.25, 7)
    torch.testing.assert_close(got, a * -1.25 + 7)
    assert "in_s" in check.codegen.generate(compiled.choices[0].node, check.registry).source


def test_explicit_cast_is_bit_exact(check):
    text, inputs = CASES["explicit_cast_rounds_as_eager"]
    check(text, *inputs(), exact=True)


def test_negative_zero_and_nan_positions_match_eager(check):
    text, inputs = CASES["nan_inf_propagation"]
    args = inputs()
    got, _ = check(text, *args)
    relu = got[2]
    assert torch.equal(torch.signbit(relu), torch.signbit(torch.relu(args[0])))
    assert torch.equal(torch.isnan(got[0]), torch.isnan(torch.maximum(*args)))


def test_unexpected_input_strides_are_fixed_up(check):
    """A tensor whose strides differ from the declared ones is copied, not misread."""
    text, inputs = CASES["strided_input_and_output"]
    a, b = inputs()
    check(text, a.contiguous(), b)  # declared strided[1, 8], given contiguous


def test_transposed_layouts_are_walked_in_memory_order(check):
    """Input and output both column-major: the kernel walks memory order, so both are
    addressed by the flat index (coalesced), not by a strided logical walk."""
    text = group_text("%a: f32[5, 6] strided[1, 5]", """
        %e = aten.exp.default(%a) : f32[5, 6] strided[1, 5]""", "%e: f32[5, 6] strided[1, 5]")
    (out,), compiled = check(text, randn(6, 5).t())
    source = check.codegen.generate(compiled.choices[0].node, check.registry).source
    assert "in_a + (xindex)" in source and "out_e + (xindex)" in source
    assert out.stride() == (1, 5)


def test_output_has_declared_strides(check):
    text = group_text("%a: f32[4, 6]", """
        %e = aten.exp.default(%a) : f32[4, 6] strided[1, 4]""", "%e: f32[4, 6] strided[1, 4]")
    (out,), _ = check(text, randn(4, 6))
    assert out.stride() == (1, 4)


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(CASES))
def test_pointwise_matches_eager_on_cuda(registry, codegen, name):
    text, inputs = CASES[name]
    Checker(registry, codegen, "cuda")(text, *inputs())
