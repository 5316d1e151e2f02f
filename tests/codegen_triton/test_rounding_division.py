"""Division with a rounding mode (``aten.div.Tensor_mode``) as eager divides: floor division
by c10's div_floor_floating (Python's ``a // b``: ``1.0 // 0.1`` is 9, ``floor(1.0 / 0.1)``
is 10), in bf16/f16 every step rounded to the type, and trunc of the quotient rounded to it;
run in the Triton interpreter against eager, bit for bit."""

from __future__ import annotations

import pytest
import torch

from conftest import group_text, on_device

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16,
          "f16": torch.float16}


def _operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Dividends and divisors: random ones, multiples of a tenth (quotients that round onto
    an integer), signs and zeros of both signs, infinities, NaN."""
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(512, generator=g) * 20).to(dtype)
    b = torch.randn(512, generator=g).to(dtype)
    edges_a = [1.0, -1.0, 0.3, -0.3, 0.0, -0.0, 0.0, 5.0, -5.0, float("inf"), float("nan"),
               3.0, 7.0, -7.0, 2.5, 1e-3]
    edges_b = [0.1, 0.1, 0.1, 0.1, 3.0, 3.0, -3.0, 0.0, 0.0, 2.0, 1.0, 1.0 / 3, -0.7, 0.7,
               -0.5, float("inf")]
    a[:len(edges_a)] = torch.tensor(edges_a, dtype=dtype)
    b[:len(edges_b)] = torch.tensor(edges_b, dtype=dtype)
    a[16:64] = (torch.arange(48) * 0.1).to(dtype)  # 0.0, 0.1, ..., 4.7 by 0.1
    b[16:64] = torch.tensor(0.1, dtype=dtype)
    return a, b


@pytest.mark.parametrize("mode", ["floor", "trunc"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_tensor_by_tensor_matches_eager_bit_for_bit(check, dtype, mode):
    a, b = _operands(DTYPES[dtype])
    text = group_text(f"%a: {dtype}[512], %b: {dtype}[512]",
                      f'%o = aten.div.Tensor_mode(%a, %b) {{rounding_mode = "{mode}"}} '
                      f": {dtype}[512]", f"%o: {dtype}[512]")
    check(text, a, b, exact=True)


@pytest.mark.parametrize("other", [0.1, 1.0 / 3, -0.7, 2.0])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_tensor_by_a_number_matches_eager(check, dtype, other):
    a, _ = _operands(DTYPES[dtype])
    text = group_text(f"%a: {dtype}[512]",
                      f'%o = aten.div.Tensor_mode(%a) {{other = {other!r}, '
                      f'rounding_mode = "floor"}} : {dtype}[512]', f"%o: {dtype}[512]")
    check(text, a, exact=True)


def test_the_floor_helper_is_defined_once_and_only_where_used(codegen, registry):
    from torchloom.api import parse_graph
    text = group_text("%a: f32[8], %b: f32[8]",
                      '%o = aten.div.Tensor_mode(%a, %b) {rounding_mode = "floor"} : f32[8]\n'
                      '%p = aten.div.Tensor_mode(%o, %b) {rounding_mode = "floor"} : f32[8]',
                      "%p: f32[8]")
    source = codegen.generate(next(parse_graph(text).nodes), registry).source
    assert source.count("def _div_floor(") == 1 and source.count("_div_floor(") == 3
    plain = group_text("%a: f32[8], %b: f32[8]", "%o = aten.div.Tensor(%a, %b) : f32[8]",
                       "%o: f32[8]")
    assert "_div_floor" not in codegen.generate(next(parse_graph(plain).nodes),
                                                registry).source


@pytest.mark.parametrize("mode", ["floor", "trunc"])
def test_integer_division_by_a_tensor_is_left_to_eager(codegen, registry, mode):
    """Eager raises ZeroDivisionError for an integer divided by 0, which a kernel cannot:
    a group dividing by an integer tensor (or by 0) is declined, saying so (a CPU group
    dividing by 0 with eager's error, ``rejected_by_eager``; by a tensor, and a CUDA group,
    which that check does not run, by the template)."""
    from torchloom.api import Unsupported, parse_graph
    for params, args in (("%a: i64[64], %b: i64[64]", "%a, %b"), ("%a: i64[64]", "%a")):
        attrs = f'rounding_mode = "{mode}"' + ("" if "%b" in args else ", other = 0")
        text = group_text(params, f"%o = aten.div.Tensor_mode({args}) {{{attrs}}} : i64[64]",
                          "%o: i64[64]")
        reason = codegen.supports(next(parse_graph(text).nodes), registry)
        assert reason is not None and ("ZeroDivisionError" in str(reason) or
                                       "raises for a zero divisor" in str(reason)), reason
        with pytest.raises(Unsupported, match="raises for a zero divisor"):
            codegen.generate(next(on_device(parse_graph(text), "cuda").nodes), registry)


@pytest.mark.parametrize("other", [3, -3, 1, -7])
@pytest.mark.parametrize("mode", ["floor", "trunc"])
@pytest.mark.parametrize("dtype", ["i64", "i32", "i16", "i8"])
def test_integers_by_a_number_match_eager(check, dtype, mode, other):
    a = torch.arange(-60, 60).to({"i64": torch.int64, "i32": torch.int32, "i16": torch.int16,
                                  "i8": torch.int8}[dtype])
    text = group_text(f"%a: {dtype}[120]",
                      f'%o = aten.div.Tensor_mode(%a) {{other = {other}, '
                      f'rounding_mode = "{mode}"}} : {dtype}[120]', f"%o: {dtype}[120]")
    check(text, a, exact=True)
