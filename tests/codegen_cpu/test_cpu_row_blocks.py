"""Rows over several reduced dims (row_blocks.py): a batch norm's sums over dims 0, 2 and 3
of ``[N, C, H, W]`` and its gradient's pointwise output, in NCHW and channels-last, at
sizes whose trailing run is whole 16-lane blocks (the lanes' coordinates by block: no
division per element) and at others (the coordinates from ``r``, as before): eager's
values, NaN, inf and -0.0 included, for f32, f64 and bf16."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchloom.api import expr, indexing, stmt

from torchloom_codegen_cpu import row_blocks

from conftest import group_text

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16}


def _strides(shape, last: bool) -> list[int]:
    n, c, h, w = shape
    return [c * h * w, 1, w * c, c] if last else [c * h * w, h * w, w, 1]


def _norm_backward_text(shape, dtype: str, last: bool) -> str:
    """The gradient of a batch norm through a ReLU (ResNet's backward group): two sums
    over dims 0, 2, 3 and the input gradient, every tensor in the layout ``last`` says."""
    n, c, h, w = shape
    layout = "" if not last else f" strided[{', '.join(map(str, _strides(shape, True)))}]"
    t, k, v = f"{dtype}[{n}, {c}, {h}, {w}]{layout}", f"{dtype}[1, {c}, 1, 1]", f"{dtype}[{c}]"
    scale = 1.0 / (n * h * w)
    return group_text(f"%g: {t}, %y: {t}, %x: {t}, %m: {k}, %s: {v}", f"""
        %d = aten.threshold_backward.default(%g, %y) {{threshold = 0}} : {t}
        %c = aten.sub.Tensor(%x, %m) : {t}
        %p = aten.mul.Tensor(%d, %c) : {t}
        %a = aten.sum.dim_IntList(%p) {{dim = [0, 2, 3]}} : {v}
        %b = aten.sum.dim_IntList(%d) {{dim = [0, 2, 3]}} : {v}
        %a1 = aten.mul.Tensor(%a) {{other = {scale!r}}} : {v}
        %b1 = aten.mul.Tensor(%b) {{other = {scale!r}}} : {v}
        %a2 = aten.mul.Tensor(%a1, %s) : {v}
        %a3 = aten.view.default(%a2) {{size = [1, {c}, 1, 1]}} : {k}
        %b3 = aten.view.default(%b1) {{size = [1, {c}, 1, 1]}} : {k}
        %e = aten.mul.Tensor(%c, %a3) : {t}
        %f = aten.sub.Tensor(%d, %e) : {t}
        %o = aten.sub.Tensor(%f, %b3) : {t}""", f"%a: {v}, %b: {v}, %o: {t}")


def _inputs(shape, dtype, last: bool, seed: int, special=None):
    g = torch.Generator().manual_seed(seed)
    n, c, h, w = shape
    fmt = torch.channels_last if last else torch.contiguous_format
    make = lambda s: (torch.randn(s, generator=g, dtype=torch.float64) * 2).to(
        DTYPES[dtype])
    grad, y, x = (make(shape).contiguous(memory_format=fmt) for _ in range(3))
    if special is not None:
        grad[tuple(int(i) for i in torch.unravel_index(torch.tensor(seed % grad.numel()),
                                                       shape))] = special
        x[tuple(int(i) for i in torch.unravel_index(torch.tensor(seed * 7 % x.numel()),
                                                    shape))] = special
    return grad, y, x, make((1, c, 1, 1)), make((c,))


def _tolerance(dtype: str) -> dict:
    return {"f32": dict(rtol=1e-4, atol=1e-4), "f64": {},
            "bf16": dict(rtol=2e-2, atol=2e-2)}[dtype]


@pytest.mark.parametrize("shape", [(2, 4, 112, 112), (2, 3, 56, 56), (3, 5, 28, 28),
                                   (2, 8, 4, 4), (2, 4, 14, 14), (2, 4, 7, 7), (1, 2, 16, 3)])
@pytest.mark.parametrize("last", [False, True])
def test_batch_norm_gradients_give_eagers_values(check, shape, last):
    text = _norm_backward_text(shape, "f32", last)
    check(text, *_inputs(shape, "f32", last, 0), rtol=1e-4, atol=1e-4)


def test_a_row_of_whole_blocks_reads_its_lanes_without_dividing(check):
    """ResNet's stem: rows of 2 x 112 x 112 (a channel's), blocks of 16 lanes: the block
    index gives the image, the run of 12,544 pixels the lane; no ``r / `` per lane."""
    source = check.source(_norm_backward_text((2, 4, 112, 112), "f32", False))
    assert "const int64_t r0 = rb / 784;" in source
    assert "const int64_t rs1 = (rb % 784) * 16 + rl;" in source
    assert "r / 12544" not in source and "r % 112" not in source
    assert "[r0 * 50176 + x * 12544 + rs1]" in source


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 3), c=st.integers(1, 5), h=st.integers(1, 12), w=st.integers(1, 20),
       dtype=st.sampled_from(sorted(DTYPES)), last=st.booleans(), seed=st.integers(0, 999),
       special=st.sampled_from([None, float("nan"), float("inf"), -0.0]))
def test_any_sizes_layouts_and_values_give_eagers_values(check, n, c, h, w, dtype, last,
                                                         seed, special):
    shape = (n, c, h, w)
    check(_norm_backward_text(shape, dtype, last), *_inputs(shape, dtype, last, seed, special),
          **_tolerance(dtype))


def test_blocks_of_a_row_by_its_dims():
    header = [stmt.Declare("int64_t", f"r{k}", expr.as_node(0)) for k in (0, 2, 3)]
    (run,) = row_blocks.runs("r", (2, 1, 112, 112))
    assert run == row_blocks.Run("rs2", (2, 3), (112, 112), 12544)
    blocks = row_blocks.blocked("r", (2, 1, 112, 112), header, [run])
    # r0 and r2 span whole blocks (12,544 and 112 elements): the block's; r3 the lane's
    assert [(s.name, s.expr.text) for s in blocks.block] == [
        ("r0", "rb / 784"), ("r2", "(rb / 7) % 112")]
    assert [s.name for s in blocks.lane] == ["r", "r3"] and blocks.width == 16
    assert blocks.header == tuple(header)
    assert row_blocks.runs("r", (4, 16)) == [] and row_blocks.runs("r", (2, "s0", 16)) == []
    assert row_blocks.blocked("r", (64,), header[:1], []) is None  # one dim: r itself
    assert row_blocks.blocked("r", (3, 5, 7), header, []) is None  # nothing spans a block


def test_address_folds_a_known_run_laid_out_end_to_end():
    ix = indexing.IndexMath(indexing.C, {})
    coords = [expr.Name(n) for n in ("r0", "x", "r1", "r2")]
    known: dict = {}
    ix.remember(known, coords[2:], (112, 112), "rs2")
    shape = (2, 32, 112, 112)
    nchw = ix.address(coords, (401408, 12544, 112, 1), shape, known)
    assert nchw.text == "r0 * 401408 + x * 12544 + rs2"
    last = ix.address(coords, (401408, 1, 3584, 32), shape, known)  # channels-last
    assert last.text == "r0 * 401408 + rs2 * 32 + x"
    gappy = ix.address(coords, (401408, 1, 7168, 32), shape, known)  # rows with gaps
    assert "rs2" not in gappy.text
    assert ix.address(coords, (401408, 1, 3584, 32), shape, {}).text == \
        "r0 * 401408 + r1 * 3584 + r2 * 32 + x"


@pytest.mark.parametrize("shape", [(2, 3, 32, 32), (3, 2, 16, 48), (2, 2, 14, 14)])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_other_reductions_over_several_dims_give_eagers_values(check, shape, dtype):
    """Maxima, minima, means and variances over dims 0, 2, 3 (lanes.py's blocks, the
    variance's two passes) beside a pointwise output of the rows' shape."""
    n, c, h, w = shape
    t, k = f"{dtype}[{n}, {c}, {h}, {w}]", f"{dtype}[1, {c}, 1, 1]"
    text = group_text(f"%a: {t}", f"""
        %m = aten.amax.default(%a) {{dim = [0, 2, 3], keepdim = true}} : {k}
        %l = aten.amin.default(%a) {{dim = [0, 2, 3], keepdim = true}} : {k}
        %u = aten.mean.dim(%a) {{dim = [0, 2, 3], keepdim = true}} : {k}
        %v = aten.var.correction(%a) {{dim = [0, 2, 3], correction = 1, keepdim = true}} : {k}
        %d = aten.sub.Tensor(%a, %u) : {t}
        %o = aten.div.Tensor(%d, %v) : {t}""", f"%m: {k}, %l: {k}, %v: {k}, %o: {t}")
    g = torch.Generator().manual_seed(3)
    a = torch.randn(shape, generator=g, dtype=DTYPES[dtype])
    a[0, 0, 1, 2] = float("nan")
    a[1, 1, 0, 0] = float("-inf")
    check(text, a, **_tolerance(dtype))
