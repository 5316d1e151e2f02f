"""Reductions over the first dims of a tensor laid out with those dims innermost in memory
(a transposed input: BERT's ``sum(a.t(), 0)`` of ``[512, 256]`` with strides ``[1, 512]``)
take the row form, which reads each row contiguously; the column form (chosen by shape,
kept dims innermost) read one element per cache line there (0.62 ms a call in BERT's
training step). Where another tensor of the reduction's shape lies the other way (an
output stored contiguously), or an input is read through a view, the choice is by shape
as before."""

from __future__ import annotations

import pytest
import torch

from conftest import codegens, compiled, group_text, thread_count

REDUCTIONS = {
    "sum": ("aten.sum.dim_IntList", "{dim = [0]}"),
    "amax": ("aten.amax.default", "{dim = [0]}"),
    "mean": ("aten.mean.dim", "{dim = [0]}"),
}


def _text(op: str, rows: int, cols: int, dtype: str, also_full: bool) -> str:
    name, attrs = REDUCTIONS[op]
    t = f"{dtype}[{rows}, {cols}] strided[1, {rows}]"
    outs = f"%s: {dtype}[{cols}]" + (f", %p: {dtype}[{rows}, {cols}]" if also_full else "")
    return group_text(f"%a: {t}, %b: {t}", f"""
        %p = aten.mul.Tensor(%a, %b) : {dtype}[{rows}, {cols}]
        %s = {name}(%p) {attrs} : {dtype}[{cols}]""", outs)


def _transposed(rows: int, cols: int, dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(cols, rows, generator=g).to(dtype).t() for _ in range(2)]


@pytest.mark.parametrize("op", list(REDUCTIONS))
@pytest.mark.parametrize("rows, cols", [(512, 256), (300, 70), (33, 16), (4096, 3)])
@pytest.mark.parametrize("dtype, name", [(torch.float32, "f32"), (torch.float64, "f64"),
                                         (torch.bfloat16, "bf16")])
def test_transposed_inputs_reduce_along_memory(check, op, rows, cols, dtype, name):
    text = _text(op, rows, cols, name, also_full=False)
    source = check.source(text)
    assert "(columns)" not in source and f"reduction over {cols} rows" in source
    tol = {"rtol": 2e-2, "atol": 2e-2} if name == "bf16" else {"rtol": 1e-4, "atol": 1e-4}
    check(text, *_transposed(rows, cols, dtype, rows + cols), **tol)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_thread_count(check, threads):
    text = _text("sum", 700, 130, "f32", also_full=False)
    with thread_count(threads):
        check(text, *_transposed(700, 130, torch.float32, threads), rtol=1e-4, atol=1e-4)


def test_a_full_output_stored_contiguously_keeps_the_choice_by_shape(check):
    text = _text("sum", 512, 256, "f32", also_full=True)  # %p: contiguous [512, 256]
    assert "(columns)" in check.source(text)
    check(text, *_transposed(512, 256, torch.float32, 1), rtol=1e-4, atol=1e-4)


def test_contiguous_inputs_keep_the_column_form(check):
    text = group_text("%a: f32[512, 256]", """
        %s = aten.sum.dim_IntList(%a) {dim = [0]} : f32[256]""", "%s: f32[256]")
    assert "(columns)" in check.source(text)
    check(text, torch.randn(512, 256), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch, length", [(2, 40), (3, 17)])
def test_symbolic_sizes_compile_on_cpu(tmp_path, batch, length):
    """At symbolic sizes a group's inputs include sizes (scalars: GPT-2's bias gradient
    sums ``g.view(-1, 32)``, its size an input): no tensor of the reduction's shape, and
    strides unknown, so the choice is by shape, and the group stays on ``cpu``."""
    def f(x, w):
        v = (x * 2).view(-1, x.shape[-1])
        return v.sum(0, keepdim=True), v @ w
    compiler, fn = compiled(f, tmp_path, dynamic=True)
    g = torch.Generator().manual_seed(batch)
    w = torch.randn(32, 8, generator=g)
    for b, n in ((batch, length), (batch + 1, length + 3)):
        x = torch.randn(b, n, 32, generator=g)
        torch.testing.assert_close(fn(x, w), f(x, w), rtol=1e-4, atol=1e-4)
    assert set(codegens(compiler)) == {"cpu"}
    torch._dynamo.reset()
