"""Row sums, maxes and mins with their lanes combined as a tree (lanes.py): static rows of
whole 16-lane vectors (and 8-lane rows, row_loops.narrow_row) and symbolic rows (whole blocks,
then a masked last block) run as blocks into an explicit array of lanes combined in halves;
other rows (a product, a static row with a masked tail) keep gcc's reduction clause. Values stay eager's at every such length and dtype, with NaN, inf and
-0.0 anywhere in the row."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torchloom.api import expr, stmt

from torchloom_codegen_cpu.lanes import lane_loop
from torchloom_codegen_cpu.render import Simd

from conftest import group_text, softmax_text, tree_loops

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16}


def _norm_text(dtype: str, rows: int, cols: int) -> str:
    """A layer norm's statistics and normalized row, and a row's sum and mean: the
    one-pass var's two sums, a plain sum, a sum of squares."""
    t, r = f"{dtype}[{rows}, {cols}]", f"{dtype}[{rows}, 1]"
    return group_text(f"%a: {t}", f"""
        %v, %m = aten.var_mean.correction(%a) {{dim = [1], correction = 0, keepdim = true}} : {r}, {r}
        %c = aten.sub.Tensor(%a, %m) : {t}
        %e = aten.add.Tensor(%v) {{other = 1e-05}} : {r}
        %q = aten.rsqrt.default(%e) : {r}
        %y = aten.mul.Tensor(%c, %q) : {t}
        %s = aten.sum.dim_IntList(%a) {{dim = [1], keepdim = true}} : {r}
        %p = aten.mul.Tensor(%a, %a) : {t}
        %u = aten.mean.dim(%p) {{dim = [1], keepdim = true}} : {r}""",
                      f"%y: {t}, %s: {r}, %u: {r}, %m: {r}")


def _rows(rows: int, cols: int, seed: int, special: float | None, at: int,
          dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(rows, cols, generator=g, dtype=torch.float64) * 3 + 1
    if special is not None:
        a[seed % rows, at % cols] = special
    return a.to(dtype)


@pytest.mark.parametrize("cols, lanes, blocks", [(16, 16, 1), (24, 8, 3), (32, 16, 2),
                                                 (256, 16, 16), (1024, 16, 64)])
def test_whole_rows_sum_into_lanes_combined_as_a_tree(check, cols, lanes, blocks):
    """Every sum of the group takes the tree form; its lanes halve down to one."""
    source = check.source(_norm_text("f32", 5, cols))
    assert tree_loops(source) == [(lanes, blocks)] * 3, source
    assert "reduction(+:" not in source
    half = lanes // 2
    while half:
        assert f"_lanes[rl + {half}];" in source
        half //= 2


@pytest.mark.parametrize("cols", [17, 40 + 3, 99, 16 * 9 + 2])
def test_other_rows_keep_the_reduction_clause(check, cols):
    """Rows that are not whole vectors and end in no masked 16-lane block (8-lane blocks
    with a masked last one, gcc's short remainder) keep ``reduction(+:...)``."""
    source = check.source(_norm_text("f32", 5, cols))
    assert "_lanes[" not in source and "reduction(+:" in source


@pytest.mark.parametrize("cols", [152, 197, 1000])
def test_static_rows_with_a_masked_last_block_take_the_tree(check, cols):
    """Rows of 16-lane blocks and a masked last block: the last block adds into the same
    lanes, masked to the elements the blocks left; no reduction clause."""
    source = check.source(softmax_text("f32", 5, cols))
    assert "reduction(" not in source and source.count("_lanes[16];") == 3, source
    assert f"r >= {cols // 16 * 16} ?" in source and f"{cols - 16} + rl" in source


def test_a_softmax_takes_its_max_and_its_sum_as_trees(check):
    """The max (its NaN flag beside it) and the sum: three lane arrays, no clause."""
    source = check.source(softmax_text("f32", 3, 64))
    assert "reduction(" not in source and source.count("_lanes[16];") == 3
    assert "acc_max1_lanes[rl + 8] > acc_max1_lanes[rl] ?" in source, source


def _extremes_text(dtype: str, rows: int, cols: int) -> str:
    """amax, amin and logsumexp of a row, each its own loop."""
    t, r = f"{dtype}[{rows}, {cols}]", f"{dtype}[{rows}, 1]"
    return group_text(f"%a: {t}", f"""
        %hi = aten.amax.default(%a) {{dim = [1], keepdim = true}} : {r}
        %lo = aten.amin.default(%a) {{dim = [1], keepdim = true}} : {r}
        %d = aten.sub.Tensor(%a, %hi) : {t}
        %e = aten.exp.default(%d) : {t}
        %s = aten.sum.dim_IntList(%e) {{dim = [1], keepdim = true}} : {r}
        %l = aten.log.default(%s) : {r}
        %z = aten.add.Tensor(%l, %hi) : {r}""", f"%hi: {r}, %lo: {r}, %z: {r}")


@pytest.mark.parametrize("dtype", ["f32", "i32", "i64"])
def test_integer_and_float_extremes_are_eagers(check, dtype):
    """amax and amin exactly eager's over whole rows: NaN anywhere (float), the type's
    limits (int), -0.0 beside 0.0."""
    cols = 48
    if dtype == "f32":
        x = _rows(8, cols, 3, None, 0, torch.float32)
        x[1, 5], x[2, 47], x[3, 0] = float("nan"), float("inf"), -float("inf")
        x[4] = -x[4].abs()
        x[4, 7], x[4, 40] = -0.0, 0.0
        check(_extremes_text("f32", 8, cols), x, exact=False, atol=1e-6, rtol=1e-6)
        got, _ = check(group_text(f"%a: f32[8, {cols}]", """
            %hi = aten.amax.default(%a) {dim = [1], keepdim = true} : f32[8, 1]
            %lo = aten.amin.default(%a) {dim = [1], keepdim = true} : f32[8, 1]""",
            "%hi: f32[8, 1], %lo: f32[8, 1]"), x, exact=True)
        assert got[0][1].isnan() and got[0][2] == float("inf") and got[1][3] == -float("inf")
        return
    info = torch.iinfo(DTYPES_INT[dtype])
    x = torch.randint(-50, 50, (8, cols), dtype=DTYPES_INT[dtype])
    x[0, 13], x[1, 40], x[2] = info.max, info.min, info.min
    text = group_text(f"%a: {dtype}[8, {cols}]", f"""
        %hi = aten.amax.default(%a) {{dim = [1], keepdim = true}} : {dtype}[8, 1]
        %lo = aten.amin.default(%a) {{dim = [1], keepdim = true}} : {dtype}[8, 1]""",
        f"%hi: {dtype}[8, 1], %lo: {dtype}[8, 1]")
    assert check.source(text).count("_lanes[16];") == 2
    check(text, x, exact=True)


DTYPES_INT = {"i32": torch.int32, "i64": torch.int64}


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cols=st.sampled_from([16, 24, 32, 40, 48, 64, 72, 96, 128, 136, 152, 197, 256, 300,
                             512, 768, 1000]),
       dtype=st.sampled_from(sorted(DTYPES)), seed=st.integers(0, 2**16),
       special=st.sampled_from([None, float("nan"), float("inf"), -float("inf"), -0.0]),
       at=st.integers(0, 2**16))
def test_tree_sums_match_eager(check, cols, dtype, seed, special, at):
    x = _rows(6, cols, seed, special, at, DTYPES[dtype])
    tolerances = {"f32": (1e-5, 1e-5), "f64": (1e-12, 1e-12), "bf16": (2e-2, 2e-2)}[dtype]
    check(_norm_text(dtype, 6, cols), x, atol=tolerances[0], rtol=tolerances[1])
    check(softmax_text(dtype, 6, cols), x, atol=tolerances[0], rtol=tolerances[1])
    check(_extremes_text(dtype, 6, cols), x, atol=tolerances[0], rtol=tolerances[1])


def test_a_sum_of_equal_values_is_exact(check):
    """A row of values whose partial sums are all exact in f32 sums to the exact total in
    any order: the tree drops no lane and adds none twice."""
    x = torch.full((4, 4096), 0.375)
    got, _ = check(group_text("%a: f32[4, 4096]", """
        %s = aten.sum.dim_IntList(%a) {dim = [1], keepdim = true} : f32[4, 1]""",
        "%s: f32[4, 1]"), x)
    assert got[0].flatten().tolist() == [1536.0] * 4


def _body(target: str = "acc", op: str = "+=", mask=None) -> list:
    v = stmt.Declare("float", "v", expr.Load("in_a", expr.Name("r")))
    return [v, stmt.Update(target, op, expr.Name("v"), mask)]


def _declared(name: str) -> stmt.Var | None:
    return stmt.Var("float", name, "-INFINITY") if name == "acc" else None


def _max_body(cond=None) -> list:
    v = stmt.Declare("float", "v", expr.Load("in_a", expr.Name("r")))
    if cond is None:
        cond = expr.Op("{0} > {1}", expr.LOWEST, (expr.Name("v"), expr.Name("acc")))
    return [v, stmt.Select("acc", cond, expr.Name("v"))]


@pytest.mark.parametrize("pragma, n, body, why", [
    (Simd((("+", ("acc",)),)), "s0", _body(mask="r >= 8"), "a symbolic row, masked"),
    (Simd((("+", ("acc",)),)), 40, _body(), "not whole blocks"),
    (Simd((("+", ("acc",)),)), 8, _body(), "shorter than the lanes"),
    (Simd((("max", ("acc",)),)), 64, _body(), "a max's accumulator updated by +="),
    (Simd((("+", ("acc",)),)), 64, _max_body(), "a sum's accumulator selected"),
    (Simd((("max", ("acc",)),)), 64, _max_body("v > acc"), "its accumulator in opaque text"),
    (Simd((("*", ("acc",)),)), 64, _body(op="*="), "a product"),
    (Simd(), 64, _body(), "no reduction"),
    (None, 64, _body(), "no pragma"),
    (Simd((("+", ("acc",)),)), 64, _body("other"), "a name the pragma does not reduce"),
    (Simd((("+", ("acc",)),)), 64, _body(mask="r >= 8"), "a masked update"),
    (Simd((("+", ("acc",)),)), 64, _body(op="*="), "another operator"),
    (Simd((("+", ("nope",)),)), 64, _body("nope"), "an accumulator not declared"),
])
def test_lane_loop_declines(pragma, n, body, why):
    assert lane_loop(pragma, n, [], body, _declared, 16) is None, why


def test_a_max_starts_its_lanes_at_its_identity_and_selects_them():
    lines = lane_loop(Simd((("max", ("acc",)),)), 32, [], _max_body(), _declared, 16)
    assert lines is not None
    start = next(s for s in lines if isinstance(s, stmt.Loop) and s.var == "rl")
    assert str(start.body[0].value) == "-INFINITY"
    blocks = next(s for s in lines if isinstance(s, stmt.Loop) and s.var == "rb")
    select = blocks.body[0].body[-1]
    assert isinstance(select, stmt.Select) and "acc_lanes[rl]" in str(select.cond)
    assert "acc" not in {n for n in expr.names(select.cond)}
    assert isinstance(lines[-1], stmt.Select) and lines[-1].target == "acc"


def test_lane_loop_writes_blocks_and_halves():
    lines = lane_loop(Simd((("+", ("acc",)),)), 64, [], _body(), _declared, 16)
    assert lines is not None
    loops = [s for s in lines if isinstance(s, stmt.Loop)]
    blocks = next(s for s in loops if s.var == "rb")
    assert blocks.end == "4" and blocks.body[0].end == "16"
    assert [s.end for s in loops if s.var == "rl" and s.annotation == Simd()] == \
        ["8", "4", "2", "1"]
    assert isinstance(lines[-1], stmt.Update) and lines[-1].target == "acc"


def test_a_symbolic_row_runs_whole_blocks_then_a_masked_last_block():
    """Blocks over ``s0 / 16``; when ``s0`` is not whole blocks, 16 lanes over its last 16
    elements with the update masked to the elements after the blocks (its value bound
    first), or on a row shorter than 16 the row itself, unmasked; then the halves."""
    lines = lane_loop(Simd((("+", ("acc",)),)), expr.Name("s0"), [], _body(), _declared, 16)
    assert lines is not None
    blocks = next(s for s in lines if isinstance(s, stmt.Loop) and s.var == "rb")
    assert str(blocks.end) == "s0 / 16" and blocks.body[0].end == "16"
    tail = next(s for s in lines if isinstance(s, stmt.If))
    assert str(tail.cond) == "s0 % 16 != 0"
    edge, split = tail.then
    assert edge.name == "r_edge" and str(edge.expr) == "s0 / 16 * 16"
    assert str(split.cond) == "s0 >= 16"
    (last,), (short,) = split.then, split.orelse
    assert last.end == "16" and str(last.head[0].expr) == "s0 - 16 + rl"
    held, update = last.body[1:]
    assert str(held.expr) == "r >= r_edge ? v : 0" and str(update.value) == held.name
    assert str(short.end) == "s0" and str(short.head[0].expr) == "rl"
    assert short.body[1].mask is None
    assert [s.end for s in lines if isinstance(s, stmt.Loop) and s.var == "rl"
            and s.annotation == Simd()] == ["8", "4", "2", "1"]


@pytest.mark.parametrize("maker", [_norm_text, softmax_text, _extremes_text])
def test_symbolic_rows_take_the_tree(check, maker):
    """Every sum, max and min of a symbolic row combines its lanes as a tree: no reduction
    clause is left in the kernel."""
    source = check.source(maker("f32", 6, "s0"))
    assert "_lanes[16];" in source and "reduction(" not in source, source
    assert "r_edge" in source


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cols=st.one_of(st.integers(1, 70), st.sampled_from([95, 96, 97, 130, 257, 1000])),
       dtype=st.sampled_from(sorted(DTYPES)), seed=st.integers(0, 2**16),
       special=st.sampled_from([None, float("nan"), float("inf"), -float("inf"), -0.0]),
       at=st.integers(0, 2**16))
def test_symbolic_tree_rows_match_eager(check, cols, dtype, seed, special, at):
    """One kernel per group over a symbolic row length, run at lengths around and between
    whole blocks, with NaN, inf or -0.0 anywhere (the overlap of the last block with the
    blocks included)."""
    x = _rows(6, cols, seed, special, at, DTYPES[dtype])
    tolerances = {"f32": (1e-5, 1e-5), "f64": (1e-12, 1e-12), "bf16": (2e-2, 2e-2)}[dtype]
    for maker in (_norm_text, softmax_text, _extremes_text):
        check(maker(dtype, 6, "s0"), x, atol=tolerances[0], rtol=tolerances[1])


def test_a_symbolic_sum_of_equal_values_is_exact(check):
    """The last block's lanes that overlap the blocks add nothing, at every length."""
    text = group_text("%a: f32[3, s0]", """
        %s = aten.sum.dim_IntList(%a) {dim = [1], keepdim = true} : f32[3, 1]""",
        "%s: f32[3, 1]")
    for n in (1, 5, 15, 16, 17, 31, 33, 47, 64, 65, 200):
        got, _ = check(text, torch.full((3, n), 0.375))
        assert got[0].flatten().tolist() == [0.375 * n] * 3, n
