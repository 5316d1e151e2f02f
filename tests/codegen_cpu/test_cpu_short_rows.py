"""Reductions over short rows. max/min/prod over rows shorter than a vector
(reduction.short_odd_row): rows of 1-7 and 9-15 values reduce in a plain loop, rows of 8, 16
and more in a SIMD one; kernels with only per-row outputs over rows of 1-4 values lose
their SIMD row loops (reduction.across_rows); rows of 16-64 hide their length
(row_loops._trip_count); cheap loops over rows of 16k+8 run whole (row_loops._cheap). Every
length gives eager's values (NaN anywhere in a row, +-inf, -0.0 against 0.0, denormals,
ints, bool)."""

from __future__ import annotations

import re

import pytest
import torch
from torchloom.api import parse_graph
from torchloom_codegen_cpu.row_loops import NARROW_ROWS, NARROW_ROWS_MIXED, narrow_row

from conftest import compiled, group_text, softmax_text, tree_loops

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "i32": torch.int32,
          "i64": torch.int64,
          "f16": torch.float16}
MAX_PRAGMA = re.compile(r"#pragma omp simd reduction\((max|min|\*):")


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
    # whole vectors and 8-lane rows: lanes combined as a tree (lanes.py), no clause
    assert simd == ((cols >= 16 or cols % 8 == 0) and not tree(cols)), source
    assert bool(tree_loops(source)) == tree(cols), source
    got, _ = check(text, edge_rows(rows, cols, torch.float32), exact=True)
    assert got[0].isnan().any()  # the NaN rows stayed NaN


def tree(cols: int) -> bool:
    """Whether a row of ``cols`` values in a kernel of 4-byte elements runs its sums, maxes
    and mins as lanes combined as a tree (lanes.py): whole 16-lane vectors, 8-lane rows."""
    return cols % 16 == 0 or narrow_row(cols)


def prod_or_min(op: str, dtype: str, rows: int, cols: int) -> str:
    """A full-row output beside the reduction keeps the row loops SIMD (across_rows)."""
    return group_text(f"%a: {dtype}[{rows}, {cols}]", f"""
        %r = aten.{op}(%a) {{dim = [-1], keepdim = true}} : {dtype}[{rows}, 1]
        %y = aten.sub.Tensor(%a, %r) : {dtype}[{rows}, {cols}]""",
                      f"%y: {dtype}[{rows}, {cols}], %r: {dtype}[{rows}, 1]")


@pytest.mark.parametrize("cols", [3, 5, 7, 8, 12, 16, 21])
@pytest.mark.parametrize("op, dtype", [("prod.dim_int", "f32"), ("amin.default", "i32"),
                                       ("amax.default", "i64"), ("prod.dim_int", "i64")])
def test_prod_and_integer_rows(codegen, registry, check, op, dtype, cols):
    text = prod_or_min(op, dtype, 24, cols)
    if op.startswith("prod"):
        text = text.replace("{dim = [-1], keepdim = true}", "{dim = -1, keepdim = true}")
    source = codegen.generate(next(parse_graph(text).nodes), registry).source
    whole = tree(cols) and not op.startswith("prod")  # (a product keeps its clause)
    assert bool(MAX_PRAGMA.search(source)) == ((cols >= 16 or cols % 8 == 0) and not whole), \
        source
    torch.manual_seed(cols)
    if dtype == "f32":
        x = edge_rows(24, cols, torch.float32)
        x[-1] = 3e38  # a product that overflows
    else:
        x = torch.randint(-9, 10, (24, cols), dtype=DTYPES[dtype])
        x[0] = torch.iinfo(x.dtype).min
        x[1] = torch.iinfo(x.dtype).max
    check(text, x, exact=dtype != "f32")


@pytest.mark.parametrize("cols", [2, 3, 4, 5])  # rows of 1: the output is the row's shape
@pytest.mark.parametrize("op", ["amax", "sum", "var", "logsumexp"])
def test_per_row_outputs_reduce_across_rows(codegen, registry, check, op, cols):
    """Rows of 1-4 values whose kernel stores only per-row results have no SIMD row loop
    (gcc vectorizes the rows); rows of 5 keep theirs (but a max's, short_odd_row)."""
    text = group_text(f"%a: f32[40, {cols}]", {
        "amax": f"%r = aten.amax.default(%a) {{dim = [-1], keepdim = true}} : f32[40, 1]",
        "sum": f"%r = aten.sum.dim_IntList(%a) {{dim = [-1], keepdim = true}} : f32[40, 1]",
        "var": f"%r = aten.var.correction(%a) {{dim = [-1], correction = 1, keepdim = true}}"
               f" : f32[40, 1]",
        "logsumexp": f"""
            %m = aten.amax.default(%a) {{dim = [-1], keepdim = true}} : f32[40, 1]
            %s = aten.sub.Tensor(%a, %m) : f32[40, {cols}]
            %e = aten.exp.default(%s) : f32[40, {cols}]
            %t = aten.sum.dim_IntList(%e) {{dim = [-1], keepdim = true}} : f32[40, 1]
            %l = aten.log.default(%t) : f32[40, 1]
            %r = aten.add.Tensor(%l, %m) : f32[40, 1]"""}[op], "%r: f32[40, 1]")
    source = codegen.generate(next(parse_graph(text).nodes), registry).source
    simd_rows = re.findall(r"#pragma omp simd[^\n]*\n\s*for \(int64_t r", source)
    assert bool(simd_rows) == (cols > 4 and op != "amax"), source  # amax: short_odd_row
    x = edge_rows(40, cols, torch.float32)
    check(text, x, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["f64", "bf16", "f16"])
@pytest.mark.parametrize("cols", [3, 6, 13])
def test_short_rows_of_other_dtypes(check, dtype, cols):
    rows = 24
    check(amax("amax", dtype, rows, cols), edge_rows(rows, cols, DTYPES[dtype]), exact=True)


@pytest.mark.slow
@pytest.mark.parametrize("cols", [2, 4, 6, 11, 16, 20, 24, 33, 40, 77, 136])
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


@pytest.mark.parametrize("cols, hidden", [(8, False), (16, True), (24, True), (32, True),
                                          (48, True), (64, True), (80, False), (128, False)])
def test_rows_of_one_to_four_vectors_hide_their_length(codegen, registry, check, cols, hidden):
    """Every row loop of a softmax over rows of 16-64 values (whole vectors), or of an
    8-lane row (24: row_loops.narrow_row), counts to a copy of the length gcc cannot see
    (row_loops._trip_count); other lengths count to the number itself; values stay eager's
    either way."""
    text = softmax_text("f32", 33, cols)
    source = codegen.generate(next(parse_graph(text).nodes), registry).source
    names = HIDDEN.findall(source)
    loops = re.findall(r"for \(int64_t r = \w+; r < (\w+); r\+\+\)", source)
    if hidden:  # the div; the max's and the sum's lanes are combined as a tree (lanes.py)
        assert len(names) == len(loops) == 1 and sorted(loops) == sorted(names), source
    else:
        assert not names and str(cols) in loops, source
    lanes = 16 if cols % 16 == 0 else 8 if narrow_row(cols) else None  # (8: one vector)
    assert tree_loops(source) == ([(lanes, cols // lanes)] * 2 if lanes else []), source
    x = edge_rows(33, cols, torch.float32)
    check(text, x)


def row_sum(rows: int, cols: int, dtype: str = "f32") -> str:
    return group_text(f"%a: {dtype}[{rows}, {cols}]", f"""
        %b = aten.mul.Tensor(%a, %a) : {dtype}[{rows}, {cols}]
        %r = aten.sum.dim_IntList(%b) {{dim = [-1], keepdim = true}} : {dtype}[{rows}, 1]""",
                      f"%r: {dtype}[{rows}, 1]")


def row_loops(codegen, registry, text: str) -> list[tuple[str, str, str]]:
    """(pragma, first, bound) of each row loop of the group's C function."""
    source = codegen.generate(next(parse_graph(text).nodes), registry).source
    loop = r"(#pragma omp simd[^\n]*)\n\s*for \(int64_t r = (\w+); r < (\w+); r\+\+\)"
    return re.findall(loop, source)


@pytest.mark.slow
@pytest.mark.parametrize("cols", [16, 24, 40, 56, 136, 152, 1032])
def test_half_vector_remainders(codegen, registry, check, cols):
    """A row of whole 16-lane vectors and half a vector (n % 16 == 8) up to
    ``NARROW_ROWS`` values, and a row of 16, runs each loop whole on 8-lane vectors
    (``simdlen(8)``) counting to a hidden copy of its length (row_loops.narrow_row); kernels
    with 2- or 8-byte elements do so up to ``NARROW_ROWS_MIXED`` values. Longer rows run a
    cheap loop whole (gcc ends it with one half-width iteration) and a costly or max/min
    one as blocks into lanes and a masked last block over them (row_loops._cheap, lanes.py).
    Values stay eager's."""
    for dtype, limit in (("f32", NARROW_ROWS), ("bf16", NARROW_ROWS_MIXED),
                         ("f64", NARROW_ROWS_MIXED)):
        sums, softmax = (row_loops(codegen, registry, text)
                         for text in (row_sum(24, cols, dtype), softmax_text(dtype, 24, cols)))
        if cols == 16 or cols <= limit:
            for pragma, first, bound in sums + softmax:
                assert "simdlen(8)" in pragma and first == "0" and bound.startswith("r_n")
            # sums and maxes run as blocks of lanes combined as a tree (lanes.py)
            assert (len(sums), len(softmax)) == (0, 1)
            lanes = 16 if cols % 16 == 0 else 8
            for text, trees in ((row_sum(24, cols, dtype), 1), (softmax_text(dtype, 24, cols), 2)):
                source = codegen.generate(next(parse_graph(text).nodes), registry).source
                assert tree_loops(source) == [(lanes, cols // lanes)] * trees, source
            continue
        assert not any("simdlen" in pragma for pragma, _, _ in sums + softmax)
        if cols % 16 == 0 or dtype != "f32":  # bf16 loads call tl_bf16_to_f32: not cheap
            continue
        whole = ("0", str(cols))
        assert [loop[1:] for loop in sums] == [whole]
        # max, exp: blocks into lanes and a masked last block over them (lanes.py); div whole
        assert [loop[1:] for loop in softmax] == [whole]
        source = codegen.generate(next(parse_graph(softmax_text(dtype, 24, cols)).nodes),
                                  registry).source
        assert source.count("_lanes[16];") == 3 and f"{cols - 16} + rl;" in source, source
    x = edge_rows(24, cols, torch.float32)
    check(row_sum(24, cols), x)
    check(softmax_text("f32", 24, cols), x)
    check(row_sum(24, cols, "bf16"), x.bfloat16())
    check(softmax_text("bf16", 24, cols), x.bfloat16())
    check(softmax_text("f64", 24, cols), x.double())
