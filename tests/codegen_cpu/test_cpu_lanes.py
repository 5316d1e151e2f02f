"""Row sums with their lanes combined as a tree (lanes.py): static rows of whole 16-lane
vectors (and 8-lane rows, emitter.narrow_row) run as blocks into an explicit array of lanes
combined in halves; other rows (a max or min, a symbolic length, a masked tail) keep gcc's
reduction clause. Values stay eager's at every such length and dtype, with NaN, inf and
-0.0 anywhere in the row."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torchloom.api import expr, stmt

from torchloom_codegen_cpu.lanes import lane_loop
from torchloom_codegen_cpu.render import Simd

from conftest import group_text, softmax_text

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
    assert source.count(f"for (int64_t rb = 0; rb < {blocks}; rb++)") == 3, source
    assert "reduction(+:" not in source
    half = lanes // 2
    while half:
        assert f"_lanes[rl + {half}];" in source
        half //= 2


@pytest.mark.parametrize("cols", [17, 40 + 3, 152, 1000])
def test_other_rows_keep_the_reduction_clause(check, cols):
    """Rows that are not whole vectors (masked tails, 8-lane blocks with a masked last one,
    gcc's remainder) keep ``reduction(+:...)``."""
    source = check.source(_norm_text("f32", 5, cols))
    assert "_lanes[" not in source and "reduction(+:" in source


def test_max_keeps_its_clause_beside_a_tree_sum(check):
    """A softmax's max keeps ``reduction(max:...)``; its sum is a tree."""
    source = check.source(softmax_text("f32", 3, 64))
    assert "reduction(max:" in source and source.count("_lanes[16];") == 1


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cols=st.sampled_from([16, 24, 32, 40, 48, 64, 72, 96, 128, 136, 256, 512, 768]),
       dtype=st.sampled_from(sorted(DTYPES)), seed=st.integers(0, 2**16),
       special=st.sampled_from([None, float("nan"), float("inf"), -float("inf"), -0.0]),
       at=st.integers(0, 2**16))
def test_tree_sums_match_eager(check, cols, dtype, seed, special, at):
    x = _rows(6, cols, seed, special, at, DTYPES[dtype])
    tolerances = {"f32": (1e-5, 1e-5), "f64": (1e-12, 1e-12), "bf16": (2e-2, 2e-2)}[dtype]
    check(_norm_text(dtype, 6, cols), x, atol=tolerances[0], rtol=tolerances[1])
    check(softmax_text(dtype, 6, cols), x, atol=tolerances[0], rtol=tolerances[1])


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


def _ctype(name: str) -> str | None:
    return "float" if name == "acc" else None


@pytest.mark.parametrize("pragma, n, body, why", [
    (Simd((("+", ("acc",)),)), "s0", _body(), "a symbolic row"),
    (Simd((("+", ("acc",)),)), 40, _body(), "not whole blocks"),
    (Simd((("+", ("acc",)),)), 8, _body(), "shorter than the lanes"),
    (Simd((("max", ("acc",)),)), 64, _body(), "a max"),
    (Simd(), 64, _body(), "no reduction"),
    (None, 64, _body(), "no pragma"),
    (Simd((("+", ("acc",)),)), 64, _body("other"), "a name the pragma does not reduce"),
    (Simd((("+", ("acc",)),)), 64, _body(mask="r >= 8"), "a masked update"),
    (Simd((("+", ("acc",)),)), 64, _body(op="*="), "another operator"),
    (Simd((("+", ("nope",)),)), 64, _body("nope"), "an accumulator not declared"),
])
def test_lane_loop_declines(pragma, n, body, why):
    assert lane_loop(pragma, n, [], body, _ctype, 16) is None, why


def test_lane_loop_writes_blocks_and_halves():
    lines = lane_loop(Simd((("+", ("acc",)),)), 64, [], _body(), _ctype, 16)
    assert lines is not None
    loops = [s for s in lines if isinstance(s, stmt.Loop)]
    blocks = next(s for s in loops if s.var == "rb")
    assert blocks.end == "4" and blocks.body[0].end == "16"
    assert [s.end for s in loops if s.var == "rl" and s.annotation == Simd()] == \
        ["8", "4", "2", "1"]
    assert isinstance(lines[-1], stmt.Update) and lines[-1].target == "acc"
