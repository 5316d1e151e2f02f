"""Row-form reductions over tensors lying across their rows run over staged blocks of rows
(staging.py): Whisper's layer_norm of its permuted residual stream, a softmax of a
transposed input, ConvNeXt's layer_norm over the channels of its images. Every element is
computed by the statements of the unstaged kernel (checked against it with staging turned
off: equal but for the order in which SIMD lanes sum a row, where the unstaged row loop,
reading across the rows, did not vectorize), close to eager, at every size (partial
blocks, runs not a multiple of the block), dtype and thread count; tensors along the
rows, small nests and rows shorter than a stride keep the row walk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import thread_count, codegens, compiled, group_text
from torchloom.frontend import dense_layouts
from torchloom_codegen_cpu import staging


def _norm_text(rows: int, cols: int, dtype: str = "f32") -> str:
    """A layer_norm-like row (var_mean, then the normalized row) of ``a.t() + b``, also
    summed, and the transposed sum as an output."""
    t = f"{dtype}[{rows}, {cols}]"
    return group_text(f"%a: {dtype}[{cols}, {rows}], %b: {t}", f"""
        %t = aten.t.default(%a) : {t}
        %h = aten.add.Tensor(%t, %b) : {t}
        %v, %m = aten.var_mean.correction(%h) {{dim = [1], correction = 0, keepdim = true}} : {dtype}[{rows}, 1], {dtype}[{rows}, 1]
        %d = aten.sub.Tensor(%h, %m) : {t}
        %y = aten.mul.Tensor(%d, %v) : {t}
        %s = aten.sum.dim_IntList(%h) {{dim = [1]}} : {dtype}[{rows}]""",
        f"%y: {t}, %s: {dtype}[{rows}]")


def _inputs(rows: int, cols: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(cols, rows, generator=g).to(dtype),
            torch.randn(rows, cols, generator=g).to(dtype)]


@pytest.mark.parametrize("dtype, name", [(torch.float32, "f32"), (torch.bfloat16, "bf16"),
                                         (torch.float64, "f64")])
@pytest.mark.parametrize("rows, cols", [(32, 16), (100, 70), (512, 256), (257, 96)])
def test_rows_read_across_are_staged_and_match_eager(check, dtype, name, rows, cols):
    text = _norm_text(rows, cols, name)
    source = check.source(text)
    staged = 16 * cols * {"f32": 4, "bf16": 2, "f64": 8}[name] <= staging.MOST_BYTES
    assert ("(staged)" in source and "st_in_a[" in source) == staged
    check(text, *_inputs(rows, cols, dtype), exact=name == "bf16", rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows, cols, staged", [
    (31, 256, False),     # fewer than two blocks of rows
    (512, 15, False),     # a row shorter than the stride that makes it worth it
    (64, 2048, False),    # a block of rows past the buffer's bytes
    (64, 128, True),
])
def test_only_nests_with_blocks_worth_staging(check, rows, cols, staged):
    text = _norm_text(rows, cols)
    assert ("(staged)" in check.source(text)) == staged
    check(text, *_inputs(rows, cols), rtol=1e-4, atol=1e-4)


def test_rows_along_memory_keep_the_row_walk(check):
    text = group_text("%a: f32[256, 256], %b: f32[256]", """
        %h = aten.add.Tensor(%a, %b) : f32[256, 256]
        %s = aten.sum.dim_IntList(%h) {dim = [1]} : f32[256]""", "%h: f32[256, 256], %s: f32[256]")
    assert "(staged)" not in check.source(text)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_thread_count_writes_every_row(check, threads):
    text = _norm_text(300, 130)
    with thread_count(threads):
        check(text, *_inputs(300, 130, seed=threads), rtol=1e-4, atol=1e-4)


def _permuted_norm(a, pos, w, b):
    """Whisper's encoder input: a [B, C, T] convolution output permuted to [B, T, C],
    plus positions, layer-normed; the sum (the residual) kept in eager's permuted layout."""
    h = a.permute(0, 2, 1) + pos
    return torch.nn.functional.layer_norm(h, (a.shape[1],), w, b), h, h.softmax(-1)


def _layout(t: torch.Tensor) -> list[int]:
    """Strides of the dims longer than 1 (any stride addresses a dim of one element)."""
    return [s for s, n in zip(t.stride(), t.shape) if n > 1]


@pytest.mark.slow
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(batch=st.integers(1, 2), channels=st.integers(1, 300), length=st.integers(1, 200),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_permuted_layer_norms_through_torch_compile_match_unstaged_and_eager(
        check, tmp_path, monkeypatch, batch, channels, length, dtype):
    g = torch.Generator().manual_seed(channels * 1000 + length)
    args = [torch.randn(batch, channels, length, generator=g).to(dtype),
            torch.randn(length, channels, generator=g).to(dtype),
            torch.randn(channels, generator=g).to(dtype),
            torch.randn(channels, generator=g).to(dtype)]
    compiler, fn = compiled(_permuted_norm, tmp_path / "staged")
    got = fn(*args)
    assert set(codegens(compiler)) == {"cpu"}
    # rows (pixels of every image) worth it, the runs one image's: layer_norm, softmax
    staged = check.sources(compiler)
    assert any("(staged)" in s for s in staged) == (
        batch * length >= 2 * staging.BLOCK and length > 1 and channels >= staging.STRIDED)
    want = _permuted_norm(*args)
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}
    for x, y in zip(got, want, strict=True):
        assert _layout(x) == _layout(y)  # (eager's permuted layout kept)
        torch.testing.assert_close(x, y, **tolerance)
    with monkeypatch.context() as patch:  # (undone before the next example)
        patch.setattr(staging, "worth_it", lambda *a: False)
        plain_compiler, unstaged = compiled(_permuted_norm, tmp_path / "unstaged")
        plain = unstaged(*args)
        assert not any("(staged)" in s for s in check.sources(plain_compiler))
    # (a lane order of its own: a few ulp of the row's sums; bf16 rounds them once more)
    lanes = {"rtol": 1e-2, "atol": 1e-2} if dtype == torch.bfloat16 else \
        {"rtol": 2e-6, "atol": 1e-6}
    for x, y in zip(got, plain, strict=True):
        torch.testing.assert_close(x, y, equal_nan=True, **lanes)
    torch._dynamo.reset()


def test_whisper_shaped_norm_is_staged_end_to_end(tmp_path):
    compiler, fn = compiled(_permuted_norm, tmp_path)
    fn(torch.randn(1, 256, 512), torch.randn(512, 256), torch.randn(256), torch.randn(256))
    assert set(codegens(compiler)) == {"cpu"}
    kernels = list((Path(os.environ["TORCHLOOM_CACHE_DIR"]) / "cpu").glob("*.c"))
    assert kernels and any("(staged)" in k.read_text() for k in kernels)
    torch._dynamo.reset()


@pytest.mark.parametrize("shape", [(2, 64, 56, 56), (2, 96, 7, 7), (3, 32, 14, 14),
                                   (1, 48, 1, 40)])
def test_channels_of_images_are_staged_per_image(tmp_path, check, shape):
    """ConvNeXt's layer_norm over the channels of ``x.permute(0, 2, 3, 1)``: rows are
    pixels, a run is one image's (blocks never cross into the next image), and a run
    not a multiple of the block ends in a short block."""
    def norm(x, w, b):
        return torch.nn.functional.layer_norm(x.permute(0, 2, 3, 1), (shape[1],), w, b)
    g = torch.Generator().manual_seed(sum(shape))
    args = [torch.randn(*shape, generator=g), torch.randn(shape[1], generator=g),
            torch.randn(shape[1], generator=g)]
    compiler, fn = compiled(norm, tmp_path)
    got = fn(*args)
    torch.testing.assert_close(got, norm(*args), rtol=1e-5, atol=1e-5)
    sources = check.sources(compiler)
    assert any("(staged)" in s for s in sources)
    torch._dynamo.reset()


def test_a_nest_stages_at_most_its_bytes_in_all():
    found = [staging.Staged(f"in_{k}", f"st_in_{k}", ("x", "r"), (1, 1024), (1024, 512),
                            "f32", False, 1024) for k in range(5)]
    # each 16 x 512 f32 block is 32 KB: four of them fit, five do not
    assert staging.worth_it(1024, 512, found[:4]) and not staging.worth_it(1024, 512, found)


def test_an_output_also_stored_along_its_rows_is_never_staged():
    class T:  # a tensor type's strides, shape and dtype
        def __init__(self, strides, shape):
            self.shape, self.dtype, self._strides = shape, "f32", strides

        def actual_strides(self):
            return self._strides
    row, kept = ("x",), (512,)
    along = staging.entry(None, "out_t0", ("x", "r"), T((256, 1), (512, 256)), True, row, kept)
    assert along is not None and along.coords == ()
    across = T((1, 512), (512, 256))
    assert staging.entry(along, "out_t0", ("x", "r"), across, True, row, kept) is None
    assert staging.usable({"out_t0": along}) == []
    # an input read along its rows first is recorded once it is read across them
    assert staging.entry(None, "in_a", ("x", "r"), T((256, 1), (512, 256)), False, row,
                         kept) is None
    assert staging.entry(None, "in_a", ("x", "r"), across, False, row, kept).run == 512


def _norm_backward_text(rows: int, cols: int) -> str:
    """layer_norm's backward over ``a.t()`` (lying across the rows): the row sums of the
    input gradient, the weight and bias gradients as column sums, and ``g * w`` (of the
    rows' shape, depending on no sum) also an output."""
    t = f"f32[{rows}, {cols}]"
    return group_text(f"%a: f32[{cols}, {rows}], %g: {t}, %w: f32[{cols}]", f"""
        %t = aten.t.default(%a) : {t}
        %gw = aten.mul.Tensor(%g, %w) : {t}
        %p = aten.mul.Tensor(%gw, %t) : {t}
        %s1 = aten.sum.dim_IntList(%p) {{dim = [1], keepdim = true}} : f32[{rows}, 1]
        %s2 = aten.sum.dim_IntList(%gw) {{dim = [1], keepdim = true}} : f32[{rows}, 1]
        %q = aten.mul.Tensor(%g, %t) : {t}
        %c1 = aten.sum.dim_IntList(%q) {{dim = [0]}} : f32[{cols}]
        %c2 = aten.sum.dim_IntList(%g) {{dim = [0]}} : f32[{cols}]""",
        f"%gw: {t}, %s1: f32[{rows}, 1], %s2: f32[{rows}, 1], %c1: f32[{cols}], "
        f"%c2: f32[{cols}]")


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("rows, cols", [(512, 256), (100, 256), (48, 512)])
def test_column_sums_ride_in_the_staged_row_nest(check, rows, cols, threads):
    """Whisper's layer_norm backward: one nest reads each tensor once, its column sums
    carried in each thread's partials (rows_and_columns.py) over staged blocks of rows, each
    thread's share whole blocks; ``g * w`` (no sum of it) stored by that nest too."""
    text = _norm_backward_text(rows, cols)
    source = check.source(text)
    assert "(staged)" in source and "colpart[" in source and "st_in_a[" in source
    assert "(columns)" not in source  # (no column nest of its own)
    g = torch.Generator().manual_seed(rows + threads)
    args = [torch.randn(cols, rows, generator=g), torch.randn(rows, cols, generator=g),
            torch.randn(cols, generator=g)]
    with thread_count(threads):
        check(text, *args, rtol=1e-4, atol=1e-4)


def test_whisper_shaped_norm_backward_matches_eager(tmp_path, check, monkeypatch):
    # the transposed sum kept as eager lays it out (the backend would make it row-major
    # before tracing: torchloom.frontend.dense_layouts), so that the kernels stage it
    monkeypatch.setattr(dense_layouts, "MIN_NUMEL", 1 << 62)

    def norm(a, pos, w, b):
        return torch.nn.functional.layer_norm(a.permute(0, 2, 1) + pos, (256,), w, b)
    g = torch.Generator().manual_seed(3)
    args = [torch.randn(1, 256, 512, generator=g), torch.randn(512, 256, generator=g),
            torch.randn(256, generator=g), torch.randn(256, generator=g)]
    for a in (args[0], args[2], args[3]):
        a.requires_grad_(True)
    compiler, fn = compiled(norm, tmp_path)
    out = fn(*args)
    grad = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, (args[0], args[2], args[3]), grad)
    want = torch.autograd.grad(norm(*args), (args[0], args[2], args[3]), grad)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert set(codegens(compiler)) == {"cpu"}
    sources = check.sources(compiler)
    assert any("(staged)" in s and "colpart[" in s for s in sources)
    torch._dynamo.reset()
