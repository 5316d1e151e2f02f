"""max/min over rows shorter than a vector (reduction.short_odd_row): rows of 1-7 and 9-15
values reduce in a plain loop, rows of 8, 16 and more in a SIMD one, and every length gives
eager's values (NaN anywhere in a row, +-inf, -0.0 against 0.0, denormals; amax, amin,
softmax and logsumexp, which reduce with max first)."""

from __future__ import annotations

import re

import pytest
import torch
from torchloom.api import parse_graph

from conftest import compiled, group_text, softmax_text

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16,
          "f16": torch.float16}
MAX_PRAGMA = re.compile(r"#pragma omp simd reduction\((max|min):")


def amax(op: str, dtype: str, rows: int, cols: int) -> str:
    return group_text(f"%a: {dtype}[{rows}, {cols}]", f"""
        %r = aten.{op}.default(%a) {{dim = [-1], keepdim = true}} : {dtype}[{rows}, 1]""",
                      f"%r: {dtype}[{rows}, 1]")


def edge_rows(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Random rows, and rows where NaN, +-inf, -0.0/0.0 and denormals sit at each position
    (first, middle, last) of the row."""
    torch.manual_seed(cols)
    x = torch.randn(rows, cols, dtype=torch.float64) * 4
    specials = [float("nan"), float("inf"), -float("inf"), -0.0, 1e-310, -1e-41]
    row = 0
    for value in specials:
        for pos in sorted({0, cols // 2, cols - 1}):
            x[row, pos] = value
            row += 1
    x[row] = -0.0  # a row of -0.0 ...
    x[row, cols - 1] = 0.0  # ... but its last
    x[row + 1] = -float("inf")
    x[row + 2, :] = float("nan")
    return x.to(dtype)


@pytest.mark.parametrize("cols", [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24])
@pytest.mark.parametrize("op", ["amax", "amin"])
def test_short_rows_reduce_as_eager(codegen, registry, check, op, cols):
    rows = 24
    text = amax(op, "f32", rows, cols)
    source = codegen.generate(next(parse_graph(text).nodes), registry).source
    simd = bool(MAX_PRAGMA.search(source))
    assert simd == (cols >= 16 or cols % 8 == 0), source
    got, _ = check(text, edge_rows(rows, cols, torch.float32), exact=True)
    assert got[0].isnan().any()  # the NaN rows stayed NaN


@pytest.mark.parametrize("dtype", ["f64", "bf16", "f16"])
@pytest.mark.parametrize("cols", [3, 6, 13])
def test_short_rows_of_other_dtypes(check, dtype, cols):
    rows = 24
    check(amax("amax", dtype, rows, cols), edge_rows(rows, cols, DTYPES[dtype]), exact=True)


@pytest.mark.parametrize("cols", [2, 4, 6, 11, 16, 33])
@pytest.mark.parametrize("fn", [lambda x: torch.softmax(x, -1), lambda x: torch.logsumexp(x, -1),
                                lambda x: x.amax(-1) - x.amin(-1)],
                         ids=["softmax", "logsumexp", "range"])
def test_short_rows_through_torch_compile(tmp_path, fn, cols):
    compiler, f = compiled(fn, tmp_path)
    x = edge_rows(40, cols, torch.float32)
    x[-4] = 88.0  # exp overflows unless the max is taken out first
    got, want = f(x), fn(x)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert any(c.codegen == "cpu" for comp in compiler.compilations
               for c in comp.compiled.choices)


HIDDEN = re.compile(r'__asm__\("" : "\+r"\((r_n\w*)\)\);')


@pytest.mark.parametrize("cols, hidden", [(8, False), (16, True), (24, False), (32, True),
                                          (48, True), (64, True), (80, False), (128, False)])
def test_rows_of_one_to_four_vectors_hide_their_length(codegen, registry, check, cols, hidden):
    """Every row loop of a softmax over rows of 16-64 values (whole vectors) counts to a
    copy of the length gcc cannot see (Emitter._trip_count); other lengths count to the
    number itself; values stay eager's either way."""
    text = softmax_text("f32", 33, cols)
    source = codegen.generate(next(parse_graph(text).nodes), registry).source
    names = HIDDEN.findall(source)
    loops = re.findall(r"for \(int64_t r = \w+; r < (\w+); r\+\+\)", source)
    if hidden:
        assert len(names) == len(loops) == 3 and sorted(loops) == sorted(names), source
    else:
        assert not names and str(cols) in loops, source
    x = edge_rows(33, cols, torch.float32)
    check(text, x)


def row_sum(rows: int, cols: int, dtype: str = "f32") -> str:
    return group_text(f"%a: {dtype}[{rows}, {cols}]", f"""
        %b = aten.mul.Tensor(%a, %a) : {dtype}[{rows}, {cols}]
        %r = aten.sum.dim_IntList(%b) {{dim = [-1], keepdim = true}} : {dtype}[{rows}, 1]""",
                      f"%r: {dtype}[{rows}, 1]")


@pytest.mark.parametrize("cols", [24, 40, 56, 1032])
def test_half_vector_remainders(codegen, registry, check, cols):
    """A row of whole vectors and half a vector (n % 16 == 8) runs a cheap loop whole (gcc
    ends it with one half-width iteration) and a costly or max/min one as blocks and a
    masked last block (Emitter._cheap); values stay eager's either way."""
    def loops(text):
        source = codegen.generate(next(parse_graph(text).nodes), registry).source
        return re.findall(r"for \(int64_t r = (\d+); r < (\d+); r\+\+\)", source)

    whole, blocks = ("0", str(cols)), ("0", str(cols - 8))
    tail = (str(cols - 16), str(cols))
    assert loops(row_sum(24, cols)) == [whole]
    # max, exp (each blocks and a masked last block), div (whole)
    assert loops(softmax_text("f32", 24, cols)) == [blocks, tail, blocks, tail, whole]
    x = edge_rows(24, cols, torch.float32)
    check(row_sum(24, cols), x)
    check(softmax_text("f32", 24, cols), x)
    check(row_sum(24, cols, "bf16"), x.bfloat16())
