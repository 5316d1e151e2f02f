"""rows_and_columns.py: row and column reductions of one shape in one kernel (row statistics and
per-program partial column sums, then a finishing kernel), on the Triton interpreter
against eager: hand-written groups, random ones (hypothesis), and the layer-norm -> GELU
training step end to end (forward and backward)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchloom.api import parse_graph

from conftest import group_text
from torchloom_codegen_triton import TritonCodegen
from torchloom_codegen_triton.kernel import KernelWriter
from torchloom_fusion.fusibility import compatible

g = torch.Generator().manual_seed(3)

#: the layer-norm backward's shape: dx needs the row sums, dw and db the column sums
LN_BACKWARD = group_text(
    "%go: f32[R, C], %xh: f32[R, C], %w: f32[C], %rstd: f32[R, 1]", """
    %gw = aten.mul.Tensor(%go, %w) : f32[R, C]
    %a = aten.sum.dim_IntList(%gw) {dim = [1], keepdim = true} : f32[R, 1]
    %p = aten.mul.Tensor(%gw, %xh) : f32[R, C]
    %b = aten.sum.dim_IntList(%p) {dim = [1], keepdim = true} : f32[R, 1]
    %s = aten.mul.Tensor(%gw) {other = C.0} : f32[R, C]
    %t = aten.sub.Tensor(%s, %a) : f32[R, C]
    %u = aten.mul.Tensor(%xh, %b) : f32[R, C]
    %v = aten.sub.Tensor(%t, %u) : f32[R, C]
    %dx = aten.mul.Tensor(%v, %rstd) : f32[R, C]
    %q = aten.mul.Tensor(%go, %xh) : f32[R, C]
    %dw = aten.sum.dim_IntList(%q) {dim = [0]} : f32[C]
    %db = aten.sum.dim_IntList(%go) {dim = [0]} : f32[C]""",
    "%dx: f32[R, C], %dw: f32[C], %db: f32[C]")


def ln_backward(rows: int, cols: int) -> str:
    return LN_BACKWARD.replace("R", str(rows)).replace("C", str(cols))


def randn(*shape):
    return torch.randn(*shape, generator=g)


@pytest.mark.slow
@pytest.mark.parametrize("rows,cols", [(37, 50), (5, 129), (70, 7)])
def test_layer_norm_backward_in_one_kernel(check, registry, rows, cols):
    text = ln_backward(rows, cols)
    _, compiled = check(text, randn(rows, cols), randn(rows, cols), randn(cols),
                        randn(rows, 1).abs(), atol=1e-4, rtol=1e-4)
    meta = TritonCodegen(autotune=False).generate(compiled.choices[0].node, registry).metadata
    assert meta["form"] == "row and column reduction" and len(meta["scratch"]) == 2
    assert meta["programs"] == min(264, rows) and meta["grid"] == [meta["programs"]]
    assert meta["finish"]["outputs"] == [1, 2]  # dw and db, stored by the finishing kernel
    # every full-size input read once; the partial column sums through the scratch
    full, scratch = rows * cols * 4, meta["programs"] * cols * 4
    assert meta["bytes_read"] == 2 * full + cols * 4 + rows * 4 + 2 * scratch
    assert meta["bytes_written"] == full + 2 * cols * 4 + 2 * scratch


@pytest.mark.slow
def test_column_maxima_minima_and_means_beside_row_sums(check):
    text = group_text("%a: f32[23, 45]", """
        %r = aten.sum.dim_IntList(%a) {dim = [1], keepdim = true} : f32[23, 1]
        %y = aten.div.Tensor(%a, %r) : f32[23, 45]
        %cm = aten.amax.default(%y) {dim = [0]} : f32[45]
        %cn = aten.amin.default(%a) {dim = [0], keepdim = true} : f32[1, 45]
        %ca = aten.mean.dim(%a) {dim = [0]} : f32[45]""",
        "%y: f32[23, 45], %cm: f32[45], %cn: f32[1, 45], %ca: f32[45], %r: f32[23, 1]")
    check(text, randn(23, 45).abs() + 0.1, atol=1e-5, rtol=1e-5)


def test_a_column_result_read_inside_the_group_is_declined(registry):
    text = group_text("%a: f32[6, 8]", """
        %r = aten.sum.dim_IntList(%a) {dim = [1], keepdim = true} : f32[6, 1]
        %c = aten.sum.dim_IntList(%a) {dim = [0], keepdim = true} : f32[1, 8]
        %y = aten.mul.Tensor(%a, %c) : f32[6, 8]""", "%y: f32[6, 8], %r: f32[6, 1]")
    reason = TritonCodegen(autotune=False).supports(next(parse_graph(text).nodes), registry)
    assert reason is not None and "is read inside the group" in str(reason)


@pytest.mark.slow
@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 40), cols=st.integers(1, 70),
       kinds=st.lists(st.sampled_from(["sum", "amax", "amin", "mean"]), min_size=1, max_size=2),
       keepdim=st.booleans())
def test_random_row_and_column_reductions(check, rows, cols, kinds, keepdim):
    ops = {"sum": "aten.sum.dim_IntList", "amax": "aten.amax.default",
           "amin": "aten.amin.default", "mean": "aten.mean.dim"}
    col_type = f"f32[1, {cols}]" if keepdim else f"f32[{cols}]"
    lines = [f"%e = aten.exp.default(%a) : f32[{rows}, {cols}]",
             f"%r = aten.sum.dim_IntList(%e) {{dim = [-1], keepdim = true}} : f32[{rows}, 1]",
             f"%y = aten.div.Tensor(%e, %r) : f32[{rows}, {cols}]"]
    results = [f"%y: f32[{rows}, {cols}]"]
    for k, kind in enumerate(kinds):
        keep = ", keepdim = true" if keepdim else ""
        lines.append(f"%c{k} = {ops[kind]}(%y) {{dim = [0]{keep}}} : {col_type}")
        results.append(f"%c{k}: {col_type}")
    text = group_text(f"%a: f32[{rows}, {cols}]", "\n".join(lines), ", ".join(results))
    check(text, randn(rows, cols), atol=1e-5, rtol=1e-4)


def test_the_fusion_passes_may_group_rows_with_columns():
    rows, cols = ((8, 6), (1,)), ((8, 6), (0,))
    assert compatible([rows, cols])
    assert not compatible([((8, 6), (1,)), ((8, 7), (0,))])  # not the same shape
    assert not compatible([((8, 5000), (1,)), ((8, 5000), (0,))])  # rows too long
    assert not compatible([((2, 3, 4), (2,)), ((2, 3, 4), (0,))])  # not complementary


@pytest.mark.slow
def test_layer_norm_gelu_training_step_matches_eager(monkeypatch, tmp_path):
    from torchloom.tools import Compiler
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(40), torch.nn.GELU())
    x = torch.randn(29, 40, requires_grad=True)
    out = model(x)
    out.sum().backward()
    want = [out.detach(), x.grad.clone(), *(p.grad.clone() for p in model.parameters())]
    model.zero_grad()
    x.grad = None
    compiler = Compiler("default", cache_dir=tmp_path)
    torch._dynamo.reset()
    try:
        got_out = torch.compile(model, backend="torchloom", options={"compiler": compiler})(x)
        got_out.sum().backward()
    finally:
        torch._dynamo.reset()
    got = [got_out.detach(), x.grad, *(p.grad for p in model.parameters())]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    backward = compiler.compilations[1]
    assert [c.codegen for c in backward.compiled.choices] == ["triton"]  # one kernel
    (group,) = [c.node for c in backward.compiled.choices]
    assert KernelWriter(group, compiler.registry).col is not None


def test_the_row_and_column_kernel_builds_for_sm90_without_spills(registry, tmp_path):
    from torchloom_codegen_triton.aot import compile_ahead, resource_usage
    group = next(parse_graph(ln_backward(8192, 3072)).nodes)
    kernel = TritonCodegen(cache_dir=tmp_path, autotune=False).generate(group, registry)
    asm = compile_ahead(kernel, arch=90)
    usage = resource_usage(asm["cubin"], kernel.metadata["kernel"])
    assert usage["spills"] == 0 and 0 < usage["registers"] <= 255
    assert kernel.metadata["grid"] == [264]  # two programs per SM of an H100


def test_the_finishing_kernel_builds_for_sm90(registry, tmp_path):
    from torchloom_codegen_triton.aot import compile_ahead
    group = next(parse_graph(ln_backward(300, 200)).nodes)
    kernel = TritonCodegen(cache_dir=tmp_path, autotune=False).generate(group, registry)
    assert compile_ahead(kernel, 90, finish=True)["cubin"][:4] == b"\x7fELF"
