"""Pointwise walks that read an input across its rows run in tiles (tiles.py): ``a.t() + b``
walks 32 x 32 tiles, each element computed as before (bitwise eager's), at every size
(partial tiles), dtype and thread count; walks whose loads follow the rows, small walks
and long (chunked) rows keep the row walk. Rows of a few elements read across (an NCHW
image copied to channels-last) are walked turned: the input's dim innermost."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import thread_count, compiled, group_text
from torchloom_codegen_cpu import tiles

TYPES = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16",
         torch.int64: "i64"}


def _transposed_add(rows: int, cols: int, dtype: str = "f32") -> str:
    return group_text(f"%a: {dtype}[{cols}, {rows}], %b: {dtype}[{rows}, {cols}]", f"""
        %t = aten.t.default(%a) : {dtype}[{rows}, {cols}]
        %s = aten.add.Tensor(%t, %b) : {dtype}[{rows}, {cols}]
        %m = aten.mul.Tensor(%s, %b) : {dtype}[{rows}, {cols}]""",
        f"%m: {dtype}[{rows}, {cols}]")


def _inputs(rows, cols, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.int64:
        return [torch.randint(-50, 50, s, generator=g) for s in ((cols, rows), (rows, cols))]
    return [torch.randn(*s, generator=g).to(dtype) for s in ((cols, rows), (rows, cols))]


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("rows, cols", [(64, 64), (100, 70), (257, 96), (2048, 2048)])
def test_transposed_reads_walk_tiles_and_match_eager_exactly(check, dtype, rows, cols):
    text = _transposed_add(rows, cols, TYPES[dtype])
    assert "const int64_t xt0 = xt / " in check.source(text)
    check(text, *_inputs(rows, cols, dtype), exact=True)


@pytest.mark.parametrize("rows, cols, tiled", [
    (40, 4096, False),    # fewer than 2 tiles of rows
    (4096, 40, False),    # fewer than 2 tiles of columns
    (64, 9000, False),    # a chunked row
    (128, 128, True),
])
def test_only_walks_of_two_tiles_each_way_and_unchunked_rows(check, rows, cols, tiled):
    text = _transposed_add(rows, cols)
    assert ("xt0" in check.source(text)) == tiled
    check(text, *_inputs(rows, cols, torch.float32), exact=True)


def test_loads_along_the_rows_keep_the_row_walk(check):
    text = group_text("%a: f32[256, 256], %b: f32[256]", """
        %s = aten.add.Tensor(%a, %b) : f32[256, 256]""", "%s: f32[256, 256]")
    assert "xt0" not in check.source(text)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_thread_count_writes_every_element(check, threads):
    text = _transposed_add(300, 130)
    with thread_count(threads):
        check(text, *_inputs(300, 130, torch.float32, seed=threads), exact=True)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 150), st.integers(1, 150)),
       perm=st.permutations([0, 1, 2]), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_permuted_inputs_through_torch_compile_match_eager(tmp_path_factory, shape, perm,
                                                           dtype):
    """End to end: a permuted input combined with a contiguous one (sigmoid: within the
    codegen's exp bound of eager's)."""
    a = torch.randn(*shape).to(dtype)
    b = torch.randn(*[shape[p] for p in perm]).to(dtype)

    def fn(a, b):
        return torch.sigmoid(a.permute(*perm)) * b + 1

    _, compiled_fn = compiled(fn, tmp_path_factory.mktemp("tiles"))
    torch.testing.assert_close(compiled_fn(a, b), fn(a, b))


def test_the_core_plan_decides_and_short_steps_keep_the_row_walk(check):
    """cpu renders the core's tile plan (torchloom.codegen.tiles.Tiles) where the input
    read across the walk steps over at least STRIDED elements per element of the row:
    ``a.permute(0, 2, 1)`` of ``[16, 128, c]`` walked as ``[16, c, 128]`` steps ``c``
    elements per element; at c = 8 two elements share a cache line and the row walk stays,
    at c = 32 it is tiled. Both walks are 2 tiles or more each way."""
    for c, tiled in ((8, False), (32, True)):
        text = group_text(f"%a: f32[16, 128, {c}]", f"""
        %p = aten.permute.default(%a) {{dims = [0, 2, 1]}} : f32[16, {c}, 128] strided[{128 * c}, 1, {c}]
        %e = aten.exp.default(%p) : f32[16, {c}, 128]""", f"%e: f32[16, {c}, 128]")
        assert ("xt0" in check.source(text)) == tiled
        g = torch.Generator().manual_seed(c)
        check(text, torch.randn(16, 128, c, generator=g))


def test_a_nest_after_the_rows_reads_their_results_and_a_transposed_input(check):
    """A pointwise nest after a row nest reads the rows' sums back from memory beside an
    input read across its walk: the tile plan's probe stops at the stored sums (it would
    otherwise broadcast the walk's coordinates into the sum's input) and the walk is
    tiled, every element as eager's."""
    text = group_text("%x: f32[128, 300], %y: f32[128, 96]", """
        %s = aten.sum.dim_IntList(%x) {dim = [1], keepdim = true} : f32[128, 1]
        %e = aten.expand.default(%s) {size = [128, 96]} : f32[128, 96] strided[1, 0]
        %t = aten.t.default(%e) : f32[96, 128] strided[0, 1]
        %u = aten.t.default(%y) : f32[96, 128] strided[1, 96]
        %z = aten.add.Tensor(%t, %u) : f32[96, 128]""", "%z: f32[96, 128], %s: f32[128, 1]")
    assert "xt0" in check.source(text)
    g = torch.Generator().manual_seed(3)
    check(text, torch.randn(128, 300, generator=g), torch.randn(128, 96, generator=g))


def _to_channels_last(n: int, c: int, h: int, w: int, dtype: str = "f32") -> str:
    """An NCHW input copied channels-last (the first convolution's input), plus one."""
    return group_text(f"%a: {dtype}[{n}, {c}, {h}, {w}]", f"""
        %p = aten.permute.default(%a) {{dims = [0, 2, 3, 1]}} : {dtype}[{n}, {h}, {w}, {c}] strided[{c * h * w}, {w}, 1, {h * w}]
        %o = aten.add.Tensor(%p) {{other = 1}} : {dtype}[{n}, {h}, {w}, {c}]""",
        f"%o: {dtype}[{n}, {h}, {w}, {c}]")


@pytest.mark.parametrize("c, w, turned", [
    (3, 224, True),   # an RGB image: rows of 3 channels, each from another plane
    (2, 64, True), (4, 64, True),
    (5, 64, False),   # rows longer than tiles.SHORT
    (3, 63, False),   # the input's run shorter than two tiles
])
def test_short_rows_read_across_walk_the_inputs_dim_innermost(check, c, w, turned):
    n, h = 2, 5
    text = _to_channels_last(n, c, h, w)
    rows = n * c * h if turned else n * h * w
    assert f"pointwise over {rows} rows" in check.source(text)
    g = torch.Generator().manual_seed(c * w)
    check(text, torch.randn(n, c, h, w, generator=g), exact=True)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", list(TYPES))
def test_turned_walks_match_eager_exactly_at_every_dtype_and_thread_count(check, dtype,
                                                                          threads):
    text = _to_channels_last(2, 3, 7, 100, TYPES[dtype])
    x = _inputs(2 * 3 * 7, 100, dtype, seed=threads)[1].reshape(2, 3, 7, 100)
    with thread_count(threads):
        check(text, x, exact=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 9),
                       st.integers(1, 200)),
       perm=st.permutations([0, 1, 2, 3]), layout=st.sampled_from(["last", "first"]))
def test_images_laid_out_and_permuted_through_torch_compile_match_eager(
        tmp_path_factory, shape, perm, layout):
    """End to end: an image copied to channels-last (or, given channels-last, back to
    contiguous) and permuted, times a contiguous tensor of the permuted shape: eager's
    values and layouts."""
    x = torch.randn(*shape)
    if layout == "first":  # (a contiguous input's contiguous() copies nothing)
        x = x.contiguous(memory_format=torch.channels_last)
    b = torch.randn(*[shape[p] for p in perm])

    def fn(x, b):
        fmt = torch.channels_last if layout == "last" else torch.contiguous_format
        y = x.contiguous(memory_format=fmt) * 2
        return y, y.permute(*perm) * b

    _, compiled_fn = compiled(fn, tmp_path_factory.mktemp("turned"))
    for got, want in zip(compiled_fn(x, b), fn(x, b)):
        assert got.stride() == want.stride()
        torch.testing.assert_close(got, want, rtol=0, atol=0)
