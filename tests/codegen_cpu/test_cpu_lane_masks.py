"""A truth value computed once per row combined with one computed per lane (``&``, ``|``,
``^``, bitwise or logical: a pooling window's padding mask with its comparison) is made
once per row as a 32-bit mask of all ones or zeros and combined with the lane's
condition as ints (op_text.lane_masks): gcc 12 built the vector mask of a row's
``_Bool`` bit by bit. The values are eager's, bit for bit, in either operand order, for
bool results stored or selected with, every thread count and dtype."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import compiled, group_text, thread_count

OPS = {"bitwise_and": "aten.bitwise_and.Tensor", "bitwise_or": "aten.bitwise_or.Tensor",
       "bitwise_xor": "aten.bitwise_xor.Tensor", "logical_and": "aten.logical_and.default",
       "logical_or": "aten.logical_or.default", "logical_xor": "aten.logical_xor.default"}
TYPES = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16",
         torch.int64: "i64", torch.int32: "i32"}
MASK = "const int32_t m"


def _select(op: str, rows: int, cols: int, dtype: str = "f32", row_first: bool = True,
            stored: bool = False) -> str:
    """``where(op(m, a > b), a, b)``: ``%m`` one truth value a row (``b8[rows, 1]``),
    the comparison one a lane; ``stored``: the op's bool result is the output."""
    pair = "%m, %c" if row_first else "%c, %m"
    result = "%r" if stored else "%w"
    result_type = f"b8[{rows}, {cols}]" if stored else f"{dtype}[{rows}, {cols}]"
    return group_text(
        f"%m: b8[{rows}, 1], %a: {dtype}[{rows}, {cols}], %b: {dtype}[{rows}, {cols}]", f"""
        %c = aten.gt.Tensor(%a, %b) : b8[{rows}, {cols}]
        %r = {OPS[op]}({pair}) : b8[{rows}, {cols}]
        %w = aten.where.self(%r, %a, %b) : {dtype}[{rows}, {cols}]""",
        f"{result}: {result_type}")


def _inputs(rows: int, cols: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(rows, 1, generator=g) < 0.5
    if dtype.is_floating_point:
        a, b = (torch.randn(rows, cols, generator=g).to(dtype) for _ in range(2))
        a.view(-1)[::7] = float("nan")  # a NaN compares false
        b.view(-1)[3::11] = a.view(-1)[3::11]  # ties
    else:
        a, b = (torch.randint(-3, 4, (rows, cols), generator=g).to(dtype) for _ in range(2))
    return m, a, b


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("row_first", [True, False])
@pytest.mark.parametrize("stored", [False, True])
def test_a_rows_truth_value_is_one_int_mask_before_the_loop(check, op, row_first, stored):
    text = _select(op, 64, 48, row_first=row_first, stored=stored)
    source = check.source(text)
    mask = source.index(MASK)
    loop = source.index("#pragma omp simd", mask)  # declared once a row, before the loop
    assert "-(int32_t)" in source[mask:loop]
    assert ") != 0" in source[loop:]
    check(text, *_inputs(64, 48), exact=True)


@pytest.mark.parametrize("op", ["bitwise_and", "logical_or"])
def test_two_lane_values_and_two_row_values_are_combined_as_before(check, op):
    lanes = group_text("%a: f32[64, 48], %b: f32[64, 48]", f"""
        %c = aten.gt.Tensor(%a, %b) : b8[64, 48]
        %d = aten.lt.Tensor(%a, %b) : b8[64, 48]
        %r = {OPS[op]}(%c, %d) : b8[64, 48]""", "%r: b8[64, 48]")
    rows = group_text("%a: f32[64, 1], %b: f32[64, 1], %x: f32[64, 48]", f"""
        %c = aten.gt.Tensor(%a, %b) : b8[64, 1]
        %d = aten.lt.Tensor(%a, %b) : b8[64, 1]
        %r = {OPS[op]}(%c, %d) : b8[64, 1]
        %w = aten.where.self(%r, %x, %a) : f32[64, 48]""", "%w: f32[64, 48]")
    for text in (lanes, rows):
        assert MASK not in check.source(text)
    g = torch.Generator().manual_seed(1)
    check(lanes, torch.randn(64, 48, generator=g), torch.randn(64, 48, generator=g), exact=True)
    check(rows, torch.randn(64, 1, generator=g), torch.randn(64, 1, generator=g),
          torch.randn(64, 48, generator=g), exact=True)


@pytest.mark.parametrize("op", ["logical_and", "logical_or", "logical_xor"])
def test_logical_ops_of_numbers_compare_them_to_zero(check, op):
    """A logical op's operands may be numbers: the row's is ``x != 0`` (NaN is true)."""
    text = group_text("%s: f32[32, 1], %a: f32[32, 40]", f"""
        %r = {OPS[op]}(%s, %a) : b8[32, 40]""", "%r: b8[32, 40]")
    assert MASK in check.source(text)
    g = torch.Generator().manual_seed(2)
    s = torch.randint(-1, 2, (32, 1), generator=g).float()
    s[3] = float("nan")
    a = torch.randint(-1, 2, (32, 40), generator=g).float()
    a[:, ::9] = float("nan")
    a[1, 5] = -0.0
    check(text, s, a, exact=True)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(list(OPS)), rows=st.integers(1, 70), cols=st.integers(1, 140),
       dtype=st.sampled_from(list(TYPES)), row_first=st.booleans(), stored=st.booleans(),
       threads=st.sampled_from([1, 2, 3]), seed=st.integers(0, 999))
def test_any_shape_dtype_and_thread_count_gives_eagers_values(
        check, op, rows, cols, dtype, row_first, stored, threads, seed):
    text = _select(op, rows, cols, TYPES[dtype], row_first, stored)
    with thread_count(threads):
        check(text, *_inputs(rows, cols, dtype, seed), exact=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_compiled_max_pool_after_batch_norm_masks_its_window_once_a_pixel(
        check, tmp_path, dtype):
    """ResNet's stem: batch norm, ReLU and a padded 3x3 max pool of stride 2 in one
    kernel, its nine window masks made once a pixel; eager's values within rounding (the
    batch norm's decomposition rounds otherwise than eager's kernel, masks or not), NaN
    where eager's are."""
    bn = torch.nn.BatchNorm2d(32).eval().to(dtype)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)

    def f(x):
        return torch.nn.functional.max_pool2d(torch.relu(bn(x)), 3, 2, 1)
    compiler, g = compiled(f, tmp_path)
    x = torch.randn(2, 32, 30, 30, dtype=dtype).contiguous(memory_format=torch.channels_last)
    x[0, 3, 4, 5] = float("nan")
    x[1, :, 0, :] = float("-inf")
    with torch.no_grad():
        got, want = g(x), f(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()
    assert sum(source.count(MASK) for source in check.sources(compiler)) == 9
