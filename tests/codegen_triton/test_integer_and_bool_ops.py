"""Pointwise ops and reductions over bools, integers and f64 as eager computes them, found by
running the cpu codegen's recorded groups through the triton codegen in the interpreter:
bool sums and products are eager's or and and (``True + True`` is True, not 0), an
integer addcmul converts its value to the integer type (0.5 is 0), ceil, floor, round and
trunc of an integer are the integer, f64's square root is Triton's ``tl.sqrt`` (its
``sqrt_rn`` takes f32 only), and max/min over an int32, int16, int8 or uint8 row start at
that type's limits (an int64 one does not fit it)."""

from __future__ import annotations

import pytest
import torch

from torchloom.api import Unsupported

from conftest import group_text, on_device

TORCH = {"i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
         "u8": torch.uint8, "b8": torch.bool, "f64": torch.float64}


def _values(dtype: str, n: int = 40) -> torch.Tensor:
    g = torch.Generator().manual_seed(len(dtype) + n)
    if dtype == "b8":
        return torch.rand(n, generator=g) > 0.5
    if dtype == "f64":
        return torch.rand(n, generator=g, dtype=torch.float64) * 9
    low = 0 if dtype == "u8" else -20
    return torch.randint(low, 20, (n,), generator=g).to(TORCH[dtype])


@pytest.mark.parametrize("op", ["aten.add.Tensor", "aten.mul.Tensor"])
def test_bool_sums_and_products_are_or_and_and(check, op):
    text = group_text("%a: b8[40], %b: b8[40]", f"%o = {op}(%a, %b) : b8[40]", "%o: b8[40]")
    a, b = _values("b8"), torch.flip(_values("b8"), [0])
    check(text, a, b, exact=True)


def test_a_bool_sum_scaled_by_alpha_is_left_to_eager(codegen, registry):
    from torchloom.api import parse_graph
    text = group_text("%a: b8[40], %b: b8[40]",
                      "%o = aten.add.Tensor(%a, %b) {alpha = 0} : b8[40]", "%o: b8[40]")
    reason = codegen.supports(next(parse_graph(text).nodes), registry)
    assert reason is not None and "bool arithmetic" in str(reason)


@pytest.mark.parametrize("value", [0.5, -1.5, 2.0, 3])
@pytest.mark.parametrize("op", ["aten.addcmul.default"])
@pytest.mark.parametrize("dtype", ["i32", "i64", "u8"])
def test_integer_addcmul_converts_its_value(check, codegen, registry, dtype, op, value):
    text = group_text(f"%a: {dtype}[40], %b: {dtype}[40], %c: {dtype}[40]",
                      f"%o = {op}(%a, %b, %c) {{value = {value!r}}} : {dtype}[40]",
                      f"%o: {dtype}[40]")
    if dtype == "u8" and value < 0:  # (a negative constant with uint8: left to eager)
        from torchloom.api import parse_graph
        # a CPU group: eager's own error (rejected_by_eager); a CUDA one: the template's
        reason = codegen.supports(next(parse_graph(text).nodes), registry)
        assert reason is not None and "cannot be converted to type uint8_t" in str(reason)
        cuda = next(on_device(parse_graph(text), "cuda").nodes)
        with pytest.raises(Unsupported, match="negative value"):
            codegen.generate(cuda, registry)
        return
    b = _values(dtype) % 4 if dtype == "u8" else _values(dtype)
    check(text, _values(dtype), b, b, exact=True)


@pytest.mark.parametrize("op", ["ceil", "floor", "round", "trunc"])
@pytest.mark.parametrize("dtype", ["i64", "i32", "u8"])
def test_rounding_an_integer_is_the_integer(check, dtype, op):
    text = group_text(f"%a: {dtype}[40]", f"%o = aten.{op}.default(%a) : {dtype}[40]",
                      f"%o: {dtype}[40]")
    check(text, _values(dtype), exact=True)


@pytest.mark.parametrize("body", ["%o = aten.sqrt.default(%a) : f64[40]",
                                  "%o = aten.pow.Tensor_Scalar(%a) {exponent = 0.5} : f64[40]"])
def test_f64_square_roots(check, body):
    check(group_text("%a: f64[40]", body, "%o: f64[40]"), _values("f64"), exact=True)


@pytest.mark.parametrize("op", ["aten.amin.default", "aten.amax.default"])
@pytest.mark.parametrize("dtype", ["i32", "i16", "i8", "u8"])
@pytest.mark.parametrize("length", [7, 21])
def test_integer_max_and_min_rows(check, dtype, op, length):
    text = group_text(f"%a: {dtype}[24, {length}]", f"""
        %r = {op}(%a) {{dim = [-1], keepdim = true}} : {dtype}[24, 1]
        %y = aten.sub.Tensor(%a, %r) : {dtype}[24, {length}]""",
                      f"%y: {dtype}[24, {length}], %r: {dtype}[24, 1]")
    check(text, _values(dtype, 24 * length).view(24, length), exact=True)


def test_a_uint8_clamp_with_a_negative_bound_is_left_to_eager(check, codegen, registry):
    from torchloom.api import parse_graph
    text = group_text("%a: u8[40]", "%o = aten.clamp.default(%a) {max = 2, min = -1} : u8[40]",
                      "%o: u8[40]")
    reason = codegen.supports(next(parse_graph(text).nodes), registry)
    assert reason is not None and "negative bound" in str(reason)
    check(group_text("%a: u8[40]", "%o = aten.clamp.default(%a) {max = 9, min = 2} : u8[40]",
                     "%o: u8[40]"), _values("u8"), exact=True)


@pytest.mark.parametrize("length", [8, 5000])
def test_f64_standard_deviations(check, length):
    text = group_text(f"%a: f64[4, {length}]", """
        %v = aten.var.correction(%a) {correction = 1, dim = [1]} : f64[4]
        %s = aten.std.correction(%a) {correction = 0, dim = [1]} : f64[4]""",
                      "%v: f64[4], %s: f64[4]")
    check(text, torch.randn(4, length, dtype=torch.float64), rtol=1e-12, atol=1e-12)


#: one group per template this file and test_rounding_division.py check in the
#: interpreter: (parameters, body, results)
BUILT = {
    "floor_f64": ("%a: f64[64], %b: f64[64]",
                  '%o = aten.div.Tensor_mode(%a, %b) {rounding_mode = "floor"} : f64[64]'),
    "floor_bf16": ("%a: bf16[64], %b: bf16[64]",
                   '%o = aten.div.Tensor_mode(%a, %b) {rounding_mode = "floor"} : bf16[64]'),
    "floor_f16": ("%a: f16[64], %b: f16[64]",
                  '%o = aten.div.Tensor_mode(%a, %b) {rounding_mode = "floor"} : f16[64]'),
    "floor_f16_by_a_number": (
        "%a: f16[64]", '%o = aten.div.Tensor_mode(%a) {other = 0.1, rounding_mode = "floor"} '
                       ": f16[64]"),
    "trunc_bf16": ("%a: bf16[64], %b: bf16[64]",
                   '%o = aten.div.Tensor_mode(%a, %b) {rounding_mode = "trunc"} : bf16[64]'),
    "floor_i64_by_a_number": (
        "%a: i64[64]", '%o = aten.div.Tensor_mode(%a) {other = 3, rounding_mode = "floor"} '
                       ": i64[64]"),
    "floor_bf16_by_an_int": (
        "%a: bf16[64]", '%o = aten.div.Tensor_mode(%a) {other = 257, rounding_mode = "floor"} '
                        ": bf16[64]"),
    "pow_f64": ("%a: f64[64]",
                "%o = aten.pow.Tensor_Scalar(%a) {exponent = 0.3333333333333333} : f64[64]"),
    "pow_f64_tensors": ("%a: f64[64], %b: f64[64]",
                        "%o = aten.pow.Tensor_Tensor(%a, %b) : f64[64]"),
    "bool_sum": ("%a: b8[64], %b: b8[64]", "%o = aten.add.Tensor(%a, %b) : b8[64]"),
    "int_addcmul": ("%a: i32[64], %b: i32[64]",
                    "%o = aten.addcmul.default(%a, %b, %b) {value = 0.5} : i32[64]"),
    "ceil_i64": ("%a: i64[64]", "%o = aten.ceil.default(%a) : i64[64]"),
    "sqrt_f64": ("%a: f64[64]", "%o = aten.sqrt.default(%a) : f64[64]"),
    "std_f64": ("%a: f64[8, 64]",
                "%o = aten.std.correction(%a) {correction = 0, dim = [1]} : f64[8]"),
    "amin_i32": ("%a: i32[8, 21]", "%o = aten.amin.default(%a) {dim = [-1]} : i32[8]"),
}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_the_kernels_build_for_sm90(tmp_path, registry, name):
    """Triton's front end refuses some constants and argument types only when it builds
    (the interpreter takes more): each kernel above is built for an H100 ahead of time,
    here on the CPU, as ``explain --target sm_90`` builds them."""
    from torchloom.api import parse_graph
    from torchloom_codegen_triton import TritonCodegen
    params, body = BUILT[name]
    result = body.split(" = ")[0] + ": " + body.rsplit(": ", 1)[1]
    group = next(on_device(parse_graph(group_text(params, body, result)), "cuda").nodes)
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False, target="sm_90")
    usage = codegen.compile_for_target(codegen.generate(group, registry))
    assert usage["registers"] > 0 and usage["spills"] == 0


@pytest.mark.parametrize("body", [
    "%o = aten.pow.Tensor_Scalar(%a) {exponent = 0.3333333333333333} : f64[40]",
    "%o = aten.pow.Tensor_Tensor(%a, %a) : f64[40]",
    "%o = aten.pow.Scalar(%a) {self = 1.0000001} : f64[40]"])
def test_f64_powers(check, body):
    check(group_text("%a: f64[40]", body, "%o: f64[40]"), _values("f64"), rtol=1e-12,
          atol=1e-12)


def test_integer_powers_of_tensors_are_left_to_eager(codegen, registry):
    from torchloom.api import parse_graph
    text = group_text("%a: i64[40], %b: i64[40]",
                      "%o = aten.pow.Tensor_Tensor(%a, %b) : i64[40]", "%o: i64[40]")
    reason = codegen.supports(next(parse_graph(text).nodes), registry)
    assert reason is not None and "integer pow" in str(reason)


def test_floor_division_of_bf16_by_an_int(check):
    a, _ = torch.randn(512) * 3000, None
    text = group_text("%a: bf16[512]", '%o = aten.div.Tensor_mode(%a) {other = 257, '
                      'rounding_mode = "floor"} : bf16[512]', "%o: bf16[512]")
    check(text, a.to(torch.bfloat16), exact=True)


def test_uint8_arithmetic_with_a_negative_number_is_left_to_eager(codegen, registry):
    from torchloom.api import parse_graph
    text = group_text("%a: u8[40]", "%o = aten.mul.Scalar(%a) {other = -2} : u8[40]",
                      "%o: u8[40]")
    reason = codegen.supports(next(parse_graph(text).nodes), registry)
    assert reason is not None and "negative number" in str(reason)


@pytest.mark.parametrize("length", [7, 5000])
def test_an_arg_reduction_over_symbolic_rows_builds_and_matches_eager(check, tmp_path,
                                                                      registry, length):
    """Over rows of a symbolic length the looped form's index is int64 (from the size
    argument) where its accumulator starts int32: cast, it builds for sm_90 (Triton
    refused the loop-carried type change) and matches eager in the interpreter."""
    from torchloom.api import parse_graph
    from torchloom_codegen_triton import TritonCodegen
    text = group_text("%a: f32[s0, s1]", """
        %v, %i = aten.min.dim(%a) {dim = -1} : f32[s0], i64[s0]""", "%v: f32[s0], %i: i64[s0]")
    check(text, torch.randn(6, length), exact=True)
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False, target="sm_90")
    group = next(on_device(parse_graph(text), "cuda").nodes)
    assert codegen.compile_for_target(codegen.generate(group, registry))["registers"] > 0
