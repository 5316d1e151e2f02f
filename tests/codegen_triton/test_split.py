"""split.py: reductions with a small output cut their reduced index into chunks (one
program per row block and chunk, partials to a scratch buffer, a finishing kernel), so
that they launch two programs per SM of an H100; checked on the Triton interpreter
against eager for random reductions over rows, columns and all dims."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchloom.api import parse_graph

from conftest import Checker, group_text
from torchloom_codegen_triton import TritonCodegen

OPS = {"sum": "aten.sum.dim_IntList", "amax": "aten.amax.default",
       "amin": "aten.amin.default", "mean": "aten.mean.dim"}


def test_a_full_sum_launches_two_programs_per_h100_sm(registry, tmp_path):
    text = group_text("%a: f32[8192, 3072]", """
        %s = aten.sum.default(%a) : f32[]""", "%s: f32[]")
    meta = TritonCodegen(cache_dir=tmp_path, autotune=False).generate(
        next(parse_graph(text).nodes), registry).metadata
    assert meta["form"] == "split reduction"
    assert math.prod(meta["grid"]) >= 2 * 132
    # the input once; the partials written by the main kernel and read by _finish
    partials = meta["splits"] * 4
    assert meta["bytes_read"] == 8192 * 3072 * 4 + partials
    assert meta["bytes_written"] == 4 + partials
    assert meta["chunk"] % max(c["RBLOCK"] for c in meta["configs"]) == 0


def test_a_column_sum_over_few_columns_is_split_too(registry, tmp_path):
    text = group_text("%a: f32[8192, 3072]", """
        %s = aten.sum.dim_IntList(%a) {dim = [0]} : f32[3072]""", "%s: f32[3072]")
    meta = TritonCodegen(cache_dir=tmp_path, autotune=False).generate(
        next(parse_graph(text).nodes), registry).metadata
    assert math.prod(meta["grid"]) >= 264 and meta["form"] == "split reduction"


def test_a_reduction_read_inside_the_group_is_not_split(registry, tmp_path):
    text = group_text("%a: f32[4, 9000]", """
        %m = aten.amax.default(%a) {dim = [1], keepdim = true} : f32[4, 1]
        %y = aten.sub.Tensor(%a, %m) : f32[4, 9000]""", "%y: f32[4, 9000]")
    meta = TritonCodegen(cache_dir=tmp_path, autotune=False).generate(
        next(parse_graph(text).nodes), registry).metadata
    assert "splits" not in meta and meta["form"] == "looped reduction"


@pytest.fixture
def split_check(registry, tmp_path):
    """Rows longer than 16 elements loop, so small tensors take the split form."""
    return Checker(registry, TritonCodegen(cache_dir=tmp_path, autotune=False,
                                           max_persistent=16))


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 23), min_size=1, max_size=3),
       op=st.sampled_from(sorted(OPS)), data=st.data(), keepdim=st.booleans())
def test_random_split_reductions_match_eager(split_check, registry, shape, op, data, keepdim):
    rank = len(shape)
    dims = data.draw(st.sets(st.integers(0, rank - 1), min_size=1), label="dims")
    out = [1 if d in dims else s for d, s in enumerate(shape)] if keepdim else \
        [s for d, s in enumerate(shape) if d not in dims]
    fmt = lambda s: f"f32[{', '.join(map(str, s))}]"  # noqa: E731
    keep = ", keepdim = true" if keepdim else ""
    text = group_text(f"%a: {fmt(shape)}", f"""
        %s = {OPS[op]}(%a) {{dim = {sorted(dims)}{keep}}} : {fmt(out)}""", f"%s: {fmt(out)}")
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(len(text)))
    _, compiled = split_check(text, x, atol=1e-5, rtol=1e-5)
    meta = split_check.codegen.generate(compiled.choices[0].node, registry).metadata
    reduced = math.prod(shape[d] for d in dims)
    if reduced > 64:  # long enough to loop (and small output): split
        assert meta["form"] == "split reduction" and meta["splits"] >= 2


@pytest.mark.parametrize("shape,dims,op", [((37, 29), [0, 1], "sum"), ((41, 7), [0], "mean"),
                                           ((5, 300), [1], "amax"), ((3, 19, 11), [0, 2], "amin")])
def test_split_reductions_over_rows_columns_and_everything(split_check, registry, shape, dims,
                                                           op):
    out = [s for d, s in enumerate(shape) if d not in dims]
    fmt = lambda s: f"f32[{', '.join(map(str, s))}]"  # noqa: E731
    text = group_text(f"%a: {fmt(shape)}", f"""
        %s = {OPS[op]}(%a) {{dim = {dims}}} : {fmt(out)}""", f"%s: {fmt(out)}")
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(7))
    x.view(-1)[3] = float("nan") if op == "amax" else x.view(-1)[3]
    _, compiled = split_check(text, x, atol=1e-5, rtol=1e-5)
    meta = split_check.codegen.generate(compiled.choices[0].node, registry).metadata
    assert meta["form"] == "split reduction" and meta["splits"] >= 2


@pytest.mark.parametrize("body,results", [
    ("""%s = aten.sum.default(%a) : f32[]
        %m = aten.mul.Tensor(%s) {other = 2.0} : f32[]
        %y = aten.add.Tensor(%m) {other = 1.0} : f32[]""", "%y: f32[], %s: f32[]"),
    ("""%q = aten.mul.Tensor(%a, %a) : f32[41, 37]
        %s = aten.sum.default(%q) : f32[]
        %y = aten.sqrt.default(%s) : f32[]""", "%y: f32[]"),
    ("""%q = aten.mul.Tensor(%a, %a) : f32[41, 37]
        %s = aten.mean.dim(%q) {dim = [0], keepdim = true} : f32[1, 37]
        %e = aten.add.Tensor(%s) {other = 1e-06} : f32[1, 37]
        %y = aten.rsqrt.default(%e) : f32[1, 37]
        %v = aten.view.default(%y) {size = [37]} : f32[37]""", "%v: f32[37], %y: f32[1, 37]"),
    ("""%x = aten.amax.default(%a) {dim = [0]} : f32[37]
        %n = aten.amin.default(%a) {dim = [0]} : f32[37]
        %y = aten.sub.Tensor(%x, %n) : f32[37]
        %z = aten.sigmoid.default(%y) : f32[37]""", "%z: f32[37], %x: f32[37]")],
    ids=["scale_shift", "norm", "rms_columns", "range_sigmoid"])
def test_split_reductions_compute_their_epilogue_in_the_finishing_kernel(split_check, registry,
                                                                       body, results):
    text = group_text("%a: f32[41, 37]", body, results)
    x = torch.randn(41, 37, generator=torch.Generator().manual_seed(9))
    _, compiled = split_check(text, x, atol=1e-5, rtol=1e-5)
    meta = split_check.codegen.generate(compiled.choices[0].node, registry).metadata
    assert meta["form"] == "split reduction" and meta["splits"] >= 2


def test_an_output_over_the_reduced_dims_keeps_the_row_pass(registry, tmp_path):
    text = group_text("%a: f32[4, 9000]", """
        %s = aten.sum.dim_IntList(%a) {dim = [1], keepdim = true} : f32[4, 1]
        %y = aten.mul.Tensor(%a) {other = 2.0} : f32[4, 9000]""", "%y: f32[4, 9000], %s: f32[4, 1]")
    meta = TritonCodegen(cache_dir=tmp_path, autotune=False).generate(
        next(parse_graph(text).nodes), registry).metadata
    assert "splits" not in meta


def test_the_main_and_finishing_kernels_build_for_sm90(registry, tmp_path):
    from torchloom_codegen_triton.aot import compile_ahead
    text = group_text("%a: f32[8192, 3072]", """
        %q = aten.mul.Tensor(%a, %a) : f32[8192, 3072]
        %s = aten.sum.default(%q) : f32[]
        %y = aten.sqrt.default(%s) : f32[]""", "%y: f32[]")
    kernel = TritonCodegen(cache_dir=tmp_path, autotune=False).generate(
        next(parse_graph(text).nodes), registry)
    assert kernel.metadata["form"] == "split reduction"
    for finish in (False, True):
        assert compile_ahead(kernel, 90, finish=finish)["cubin"][:4] == b"\x7fELF"
