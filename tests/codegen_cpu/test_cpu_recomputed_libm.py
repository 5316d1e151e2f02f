"""A value a row's loops all read, computed from a libm call (log, sin, expm1, erf, ...),
is the same value in each of them (kernel._plan_buffers keeps it in a row buffer). Without
that, a SIMD loop's libmvec lanes and a plain loop's scalar call (the max of a short row,
reduction.short_odd_row) rounded it differently: amax's gradient, ``y == max(y)``, found no
maximum in its row, counted 0 and divided by it (NaN gradients of ``log_softmax(x, 0)
.amax(2)``, found by the random checkpointed programs). Each kernel's outputs are checked
against themselves (the mask is exactly ``y == amax(y)`` of the ``y`` it wrote, the count
its sum, never 0 in a row without NaN) and against eager's."""

from __future__ import annotations

import pytest
import torch

from conftest import group_text

#: libm-calling ops, broadcast along the rows (one value per column) or on the element
FUNCTIONS = ["log", "sin", "expm1", "log1p", "erf", "tanh", "exp"]


def amax_mask(dtype: str, rows: int, cols: int, functions: list[str], along: str) -> str:
    """A group: ``y = x - f(c)`` (each of ``functions`` applied in turn to ``c``, a
    ``[cols]`` vector, or to ``x`` itself where ``along`` is "element"), then amax's
    gradient's mask: ``e = y == amax(y)`` and its count per row."""
    shape = f"{dtype}[{rows}, {cols}]"
    of = f"{dtype}[{cols}]" if along == "column" else shape
    lines, last = [], "%c" if along == "column" else "%x"
    for k, fn in enumerate(functions):
        lines.append(f"%f{k} = aten.{fn}.default({last}) : {of}")
        last = f"%f{k}"
    lines += [f"%y = aten.sub.Tensor(%x, {last}) : {shape}",
              f"%m = aten.amax.default(%y) {{dim = [-1], keepdim = true}} : {dtype}[{rows}, 1]",
              f"%e = aten.eq.Tensor(%m, %y) : b8[{rows}, {cols}]",
              f"%n = aten.sum.dim_IntList(%e) {{dim = [-1], keepdim = true}} : i64[{rows}, 1]"]
    params = f"%x: {shape}" + (f", %c: {of}" if along == "column" else "")
    return group_text(params, "\n".join(lines), f"%n: i64[{rows}, 1], %e: b8[{rows}, {cols}], "
                      f"%y: {shape}")


def _consistent(n, e, y) -> None:
    mask = y == y.amax(-1, keepdim=True)
    assert torch.equal(e, mask), (e, y)
    assert torch.equal(n, mask.sum(-1, keepdim=True))
    finite_rows = ~y.isnan().any(-1, keepdim=True)
    assert (n[finite_rows] >= 1).all(), (n, y)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("cols", [1, 2, 3, 4, 5, 6, 7, 9, 11, 12, 13, 15, 17, 24, 33])
def test_a_broadcast_libm_value_is_one_value_in_every_loop(check, dtype, cols):
    torch.manual_seed(cols)
    t = {"f32": torch.float32, "f64": torch.float64}[dtype]
    rows = 37
    x = torch.rand(rows, cols, dtype=t) * 0.25
    c = torch.rand(cols, dtype=t) * 0.5 + 0.25
    text = amax_mask(dtype, rows, cols, FUNCTIONS, "column")
    (n, e, y), _ = check(text, x, c, rtol=1e-5, atol=1e-6)
    _consistent(n, e, y)


@pytest.mark.parametrize("cols", [3, 5, 7, 12, 15, 40])
@pytest.mark.parametrize("fn", ["log1p", "sin", "erf"])
def test_an_elementwise_libm_value_read_by_every_loop(check, fn, cols):
    torch.manual_seed(cols)
    x = torch.rand(29, cols) * 2
    x[3, 1 % cols] = float("nan")  # a NaN row: its max NaN, no element equal to it
    text = amax_mask("f32", 29, cols, [fn], "element")
    (n, e, y), _ = check(text, x, rtol=1e-5, atol=1e-6)
    _consistent(n, e, y)


def test_the_shared_value_is_written_once_per_row(check):
    """The short row's plain max loop writes ``y`` (all it reads of log) into a buffer the
    later loops read: log is called in one loop only."""
    source = check.source(amax_mask("f32", 2, 4, ["log"], "column"))
    kernel = source[source.index("void fused_"):]
    assert kernel.count("logf(") == 1, kernel
