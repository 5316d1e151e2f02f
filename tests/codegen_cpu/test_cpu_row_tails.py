"""Row loops as whole blocks of 16 and a masked tail over the last 16 (emitter.py
``row_loops.shaped``): every element stored and accumulated exactly once, at every row length
(static and symbolic), with NaN, inf and -0.0 placed where the two loops overlap, in the
tail, and in the blocks."""

from __future__ import annotations

import re

import pytest
import torch
from torchloom.api import parse_graph

from torchloom_codegen_cpu.row_loops import SCALAR_REMAINDER, TAIL, narrow_odd_row

from conftest import group_text

LENGTHS = [1, 3, 15, 16, 17, 19, 20, 23, 31, 32, 33, 46, 47, 48, 50, 63, 66, 100, 1000]


def _reductions(cols) -> tuple[str, str]:
    """sum, max, min, prod, mean and var of a row, and softmax: each its own loops."""
    t, r = f"f32[4, {cols}]", "f32[4, 1]"
    body = f"""
    %s = aten.sum.dim_IntList(%a) {{dim = [1], keepdim = true}} : {r}
    %m = aten.amax.default(%a) {{dim = [1], keepdim = true}} : {r}
    %n = aten.amin.default(%a) {{dim = [1], keepdim = true}} : {r}
    %p = aten.prod.dim_int(%a) {{dim = 1, keepdim = true}} : {r}
    %v, %u = aten.var_mean.correction(%a) {{dim = [1], correction = 1, keepdim = true}} : {r}, {r}
    %d = aten.sub.Tensor(%a, %m) : {t}
    %e = aten.exp.default(%d) : {t}
    %z = aten.sum.dim_IntList(%e) {{dim = [1], keepdim = true}} : {r}
    %y = aten.div.Tensor(%e, %z) : {t}"""
    return body, f"%s: {r}, %m: {r}, %n: {r}, %p: {r}, %v: {r}, %u: {r}, %y: {t}"


def _row(n: int, seed: int, special: str | None, at: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(4, n, generator=g) * 0.4 + 0.8  # a product of 1000 stays finite
    if special is not None and n > 0:
        a[seed % 4, at % n] = {"nan": float("nan"), "inf": float("inf"),
                               "-inf": float("-inf"), "-0": -0.0}[special]
    return a


def _places(n: int) -> list[int]:
    """The last element, the first and last the tail loop re-reads (masked off), the
    first element of the tail, and the first element."""
    blocks = n // TAIL * TAIL
    return sorted({n - 1, max(n - TAIL, 0), max(blocks - 1, 0), blocks % max(n, 1), 0})


@pytest.mark.slow
@pytest.mark.parametrize("n", LENGTHS)
def test_static_rows_match_eager(check, n):
    body, results = _reductions(n)
    text = group_text(f"%a: f32[4, {n}]", body, results)
    check(text, _row(n, 0, None, 0), atol=1e-5, rtol=1.3e-6)
    for special in ("nan", "inf", "-inf", "-0"):
        for k, at in enumerate(_places(n)):
            check(text, _row(n, k + 1, special, at), atol=1e-5, rtol=1.3e-6)


def test_symbolic_rows_match_eager_at_every_length(check):
    body, results = _reductions("s0")
    text = group_text("%a: f32[4, s0]", body, results)
    for n in LENGTHS:
        check(text, _row(n, n, None, 0), atol=1e-5, rtol=1.3e-6)
        for special in ("nan", "-inf"):
            for k, at in enumerate(_places(n)):
                check(text, _row(n, k + 3, special, at), atol=1e-5, rtol=1.3e-6)


@pytest.mark.parametrize("n, lanes", [(16, None), (32, None), (17, 8), (19, 8), (20, 8),
                                      (100, 8), (109, 16), (1000, 16), (8, None), (98, 8)])
def test_a_tail_loop_only_where_the_remainder_is_long_enough(codegen, registry, n, lanes):
    """Rows of 17-104 values not a multiple of 8 run 8-lane blocks and a masked last 8
    (row_loops.narrow_odd_row); longer ones 16-lane blocks and a masked last 16 where the
    remainder is at least SCALAR_REMAINDER; whole vectors and short rows no tail."""
    body, results = _reductions(n)
    graph = parse_graph(group_text(f"%a: f32[4, {n}]", body, results))
    source = codegen.generate(next(iter(graph.nodes)), registry).source
    masked = re.search(r"r >= \d+ \?", source)  # a side effect masked to the tail
    assert bool(masked) == (lanes is not None), source
    if lanes == 8:
        assert narrow_odd_row(n)
    elif lanes == 16:
        assert not narrow_odd_row(n) and n % TAIL >= SCALAR_REMAINDER and n > TAIL
    if lanes == 8:  # the blocks' loops end at the last whole block; the tail is the last
        assert f"for (int64_t r = 0; r < {n // lanes * lanes}; r++)" in source
        assert f"for (int64_t r = {n - lanes}; r < {n}; r++)" in source
    if lanes:
        assert ("simdlen(8)" in source) == (lanes == 8)
    if lanes == 16:  # sums, maxes and mins: blocks into lanes, the last block over them
        assert f"rb < {n // 16}; rb++" in source and f"{n - 16} + rl;" in source


def test_a_bf16_row_stores_each_element_once(check):
    """bf16 in and out: the tail's stores blend 16-bit elements."""
    t, r = "bf16[3, 37]", "bf16[3, 1]"
    text = group_text(f"%a: {t}", f"""
    %m = aten.amax.default(%a) {{dim = [1], keepdim = true}} : {r}
    %d = aten.sub.Tensor(%a, %m) : {t}
    %e = aten.exp.default(%d) : {t}""", f"%e: {t}")
    a = torch.randn(3, 37).to(torch.bfloat16)
    a[1, 36] = float("nan")
    a[2, 21] = float("inf")
    check(text, a, exact=True)
