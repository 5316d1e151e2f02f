"""Where eager computes bf16/f16 ops in their own type, and what the cpu codegen must do
the same (found by a hostile test run, 2026-11-26): a division's rounding modes (trunc of
the rounded quotient; floor division with every step rounded), a scalar exponent
converted to the tensor's type, an operand of another type (a 0-d f32 tensor, an int
tensor) converted to the op's type before the op, and f16 ``x ** 0.5`` at -inf. Each
through C vs eager, bit for bit, on many random values of every magnitude."""

from __future__ import annotations

import pytest
import torch
from torchloom.api import DTYPES

from conftest import group_text

N = 4096
LOW = ["bf16", "f16"]


def _spread(dtype: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, generator=g) * torch.exp(torch.randn(N, generator=g) * 3)
    x[:8] = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0, 3.0])
    return x.to(DTYPES[dtype])


@pytest.mark.parametrize("mode", ["trunc", "floor"])
@pytest.mark.parametrize("dtype", LOW)
def test_division_rounding_modes_round_as_eager(check, dtype, mode):
    t = f"{dtype}[{N}]"
    text = group_text(f"%a: {t}, %b: {t}",
                      f'%o = aten.div.Tensor_mode(%a, %b) {{rounding_mode = "{mode}"}} : {t}',
                      f"%o: {t}")
    check(text, _spread(dtype, 1), _spread(dtype, 2), exact=True)


@pytest.mark.parametrize("exponent", [1 / 3, 1.7, -0.3, 2.2, 0.1])
@pytest.mark.parametrize("dtype", LOW)
def test_a_scalar_exponent_is_converted_to_the_tensor_type(check, dtype, exponent):
    t = f"{dtype}[{N}]"
    text = group_text(f"%a: {t}",
                      f"%o = aten.pow.Tensor_Scalar(%a) {{exponent = {exponent!r}}} : {t}",
                      f"%o: {t}")
    x = _spread(dtype, 3).abs()
    x[:4] = torch.tensor([3.0e38, 1e-30, 8.0, 65504.0]).to(DTYPES[dtype])
    check(text, x)  # libm's powf and eager's may differ by an f32 ulp: not exact


def test_f16_square_root_power_of_minus_inf_is_inf(check):
    t = f"f16[{N}]"
    text = group_text(f"%a: {t}", f"%o = aten.pow.Tensor_Scalar(%a) {{exponent = 0.5}} : {t}",
                      f"%o: {t}")
    x = torch.tensor([float("-inf"), 4.0, -1.0, -0.0, 0.0, float("nan"), 2.0, 1e-7] * (N // 8),
                     dtype=torch.float16)
    got, _ = check(text, x, exact=True)
    assert got[0][0].item() == float("inf")


OPS = ["aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor",
       'aten.div.Tensor_mode {rounding_mode = "trunc"}',
       'aten.div.Tensor_mode {rounding_mode = "floor"}']


def _operand_cases():
    """(dtype, op, operand first, its shape, its dtype) where the result is bf16/f16 and
    eager takes the operands (a dimensioned f32 operand makes the result f32; bool
    subtraction is an error)."""
    for dtype in LOW:
        for op in OPS:
            for first in (False, True):
                for shape in ([], [1], [N]):
                    for other in ("f32", "f64", "i64", "i32", "b8", dtype):
                        if (shape and other in ("f32", "f64")) or (
                                op == "aten.sub.Tensor" and other == "b8"):
                            continue
                        yield dtype, op, first, shape, other


@pytest.mark.slow
@pytest.mark.parametrize("dtype, op, first, shape, other", list(_operand_cases()))
def test_an_operand_of_another_type_or_a_scalar_as_eager(check, dtype, op, first, shape, other):
    """bf16 x + 0-d f32 y: eager adds bf16(y), not y (the whole tensor moved by one ulp in
    a third of its elements); x * y and x / y use y as it is (eager's CPU kernels take a
    one-element second operand as an f32 scalar), and so divide in f32 for trunc and
    floor too, where two bf16 tensors divide in bf16."""
    name, _, attrs = op.partition(" ")
    t, y_t = f"{dtype}[{N}]", f"{other}[{', '.join(map(str, shape))}]"
    operands = "%y, %a" if first else "%a, %y"
    text = group_text(f"%a: {t}, %y: {y_t}", f"%o = {name}({operands}) {attrs} : {t}".replace(
        "  ", " "), f"%o: {t}")
    values = {"f32": 0.3, "f64": 1.0000001, "i64": 257, "i32": 4099, "b8": True,
              "bf16": 0.0103, "f16": 0.0103}
    y = torch.full(shape, values[other], dtype=DTYPES[other])
    if shape == [N]:
        y = _spread(other, 6) if other in LOW else (torch.arange(N) % 7 + 1).to(DTYPES[other])
    check(text, _spread(dtype, 4), y, exact=True)


@pytest.mark.parametrize("dtype", LOW)
def test_where_converts_its_other_operand_first(check, dtype):
    t = f"{dtype}[{N}]"
    text = group_text(f"%c: b8[{N}], %a: {t}, %y: f32[]",
                      f"%o = aten.where.self(%c, %a, %y) : {t}", f"%o: {t}")
    c = torch.arange(N) % 3 == 0
    check(text, c, _spread(dtype, 5), torch.tensor(0.3), exact=True)


@pytest.mark.parametrize("target", ["i64", "i32", "i16", "i8", "u8"])
@pytest.mark.parametrize("source", ["f32", "f64", "bf16", "f16"])
def test_float_to_int_of_nan_inf_and_out_of_range_as_eager(check, source, target):
    """Undefined in C; eager on x86 gives the most negative int64/int32 (narrower ints wrap
    from int32). A fused chain gave 0 for NaN where the same cast alone gave INT32_MIN."""
    t = f"{source}[52]"
    text = group_text(f"%a: {t}, %b: {t}",
                      f"%m = aten.mul.Tensor(%a, %b) : {t}\n"
                      f"%o = aten._to_copy.default(%m) {{dtype = #{target}}} : {target}[52]",
                      f"%o: {target}[52]")
    x = torch.tensor([float("nan"), 300.7, -1e10, 1e10, float("inf"), -3.5, 2.5e9, -2.5e9,
                      float("-inf"), -0.0, 9999999999.0, 3000000007.0, -9999999999.0] * 4,
                     dtype=torch.float64).to(DTYPES[source])  # (uint8 wraps from int64)
    check(text, x, torch.ones_like(x), exact=True)


SCALAR_CASES = [
    ("aten.add.Tensor", "{other = %s}"), ("aten.sub.Tensor", "{other = %s}"),
    ("aten.rsub.Scalar", "{other = %s}"), ("aten.mul.Tensor", "{other = %s}"),
    ("aten.div.Tensor", "{other = %s}"), ("aten.fmod.Scalar", "{other = %s}"),
    ("aten.remainder.Scalar", "{other = %s}"),
    ("aten.div.Tensor_mode", '{other = %s, rounding_mode = "trunc"}'),
    ("aten.div.Tensor_mode", '{other = %s, rounding_mode = "floor"}'),
]


@pytest.mark.slow
@pytest.mark.parametrize("value", [1.0001, 0.3, -7.77, 1 / 3, 257, 2.7])
@pytest.mark.parametrize("op, attrs", SCALAR_CASES)
@pytest.mark.parametrize("dtype", LOW)
def test_a_python_number_operand_as_eager(check, dtype, op, attrs, value):
    """bf16 x + 1.0001 adds bf16(1.0001) = 1.0 in eager (add, sub, rsub, fmod, remainder and
    comparisons convert the number to the tensor's type); mul and div use it as it is, and
    div's trunc / floor then work on the f32 quotient (eager's scalar path)."""
    t = f"{dtype}[{N}]"
    text = group_text(f"%a: {t}", f"%o = {op}(%a) {attrs % repr(value)} : {t}", f"%o: {t}")
    check(text, _spread(dtype, 7), exact=True)


@pytest.mark.parametrize("value", [1.0001, 0.3, -7.77, 257])
@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
@pytest.mark.parametrize("dtype", LOW)
def test_a_comparison_with_a_python_number_as_eager(check, dtype, op, value):
    t = f"{dtype}[{N}]"
    text = group_text(f"%a: {t}", f"%o = aten.{op}.Scalar(%a) {{other = {value!r}}} : b8[{N}]",
                      f"%o: b8[{N}]")
    x = _spread(dtype, 8)
    x[8:16] = torch.tensor(float(value)).to(DTYPES[dtype])  # equal to the rounded number
    check(text, x, exact=True)


@pytest.mark.parametrize("alpha", [0.3, 1.0001, -2.7])
@pytest.mark.parametrize("dtype", LOW)
def test_add_alpha_is_converted_as_eager(check, dtype, alpha):
    t = f"{dtype}[{N}]"
    text = group_text(f"%a: {t}, %b: {t}", f"%o = aten.add.Tensor(%a, %b) {{alpha = {alpha!r}}}"
                      f" : {t}", f"%o: {t}")
    check(text, _spread(dtype, 9), _spread(dtype, 10), exact=True)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32", "f64"])
def test_signbit_of_a_vectorized_widened_value(check, dtype):
    """gcc 12 hit an internal compiler error vectorizing C's signbit() of a float widened
    from bf16 (64 elements): the sign is read from the bits."""
    t = f"{dtype}[64]"
    text = group_text(f"%a: {t}", f"%o = aten.signbit.default(%a) : b8[64]", "%o: b8[64]")
    x = _spread(dtype, 11)[:64].contiguous()
    check(text, x, exact=True)
