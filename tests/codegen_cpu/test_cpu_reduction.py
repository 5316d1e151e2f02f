"""Reduction kernels (reduction.py, kernel.py): every reduction kind over last and other dims,
with prologues and epilogues, several reductions per row (softmax, layer_norm, RMSNorm
forward and backward), edge values, low precision, strided inputs and rows long enough to
run on several threads; each compiled by the cpu codegen and compared with eager."""

from __future__ import annotations

import re

import pytest
import torch

from torchloom.api import DTYPES, parse_graph
from torchloom.testing.reductions import CASES as SHARED_CASES
from torchloom.testing.reductions import (cases, group_text, randn,
                                          row_results_for_columns, stored_output_for_columns,
                                          with_nans)

CASES = {**SHARED_CASES, **cases({
    "prod_and_std": (group_text("%a: f32[5, 7]", """
        %p = aten.prod.dim_int(%a) {dim = 1} : f32[5]
        %s = aten.std.correction(%a) {dim = [1], correction = 1} : f32[5]""",
        "%p: f32[5], %s: f32[5]"), lambda g: (with_nans(randn(g, 5, 7)),)),
    "softmax_bf16_long_rows_parallel": (group_text("%a: bf16[64, 1000]", """
        %f = prims.convert_element_type.default(%a) {dtype = #f32} : f32[64, 1000]
        %x = aten.amax.default(%f) {dim = [-1], keepdim = true} : f32[64, 1]
        %s = aten.sub.Tensor(%f, %x) : f32[64, 1000]
        %e = aten.exp.default(%s) : f32[64, 1000]
        %t = aten.sum.dim_IntList(%e) {dim = [-1], keepdim = true} : f32[64, 1]
        %y = aten.div.Tensor(%e, %t) : f32[64, 1000]
        %b = prims.convert_element_type.default(%y) {dtype = #bf16} : bf16[64, 1000]""",
        "%b: bf16[64, 1000]"), lambda g: (randn(g, 64, 1000, dtype=torch.bfloat16) * 4,)),
    "sum_of_transposed_input": (group_text("%a: f32[16, 12]", """
        %t = aten.t.default(%a) : f32[12, 16]
        %s = aten.sum.dim_IntList(%t) {dim = [1]} : f32[12]""", "%s: f32[12]"),
        lambda g: (randn(g, 16, 12),)),
    "rmsnorm_backward": (group_text("%g: f32[6, 32], %x: f32[6, 32], %w: f32[32], %r: f32[6, 1]",
        """
        %gw = aten.mul.Tensor(%g, %w) : f32[6, 32]
        %gx = aten.mul.Tensor(%gw, %x) : f32[6, 32]
        %s = aten.sum.dim_IntList(%gx) {dim = [1], keepdim = true} : f32[6, 1]
        %r3 = aten.pow.Tensor_Scalar(%r) {exponent = 3} : f32[6, 1]
        %c = aten.mul.Tensor(%s, %r3) : f32[6, 1]
        %c2 = aten.div.Tensor(%c) {other = 32} : f32[6, 1]
        %t1 = aten.mul.Tensor(%gw, %r) : f32[6, 32]
        %t2 = aten.mul.Tensor(%x, %c2) : f32[6, 32]
        %dx = aten.sub.Tensor(%t1, %t2) : f32[6, 32]""", "%dx: f32[6, 32]"),
        lambda g: (randn(g, 6, 32), randn(g, 6, 32), randn(g, 32), randn(g, 6, 1).abs() + 0.5)),
    "layer_norm_backward_column_sums": (group_text(
        "%x: f32[32, 96], %m: f32[32, 1], %r: f32[32, 1], %g: f32[32, 96], %w: f32[96]", """
        %t0 = aten.sub.Tensor(%x, %m) : f32[32, 96]
        %t1 = aten.mul.Tensor(%t0, %r) : f32[32, 96]
        %t2 = aten.mul.Tensor(%g, %t1) : f32[32, 96]
        %t3 = aten.sum.dim_IntList(%t2) {dim = [0]} : f32[96]
        %t4 = aten.mul.Tensor(%g, %w) : f32[32, 96]
        %t5 = aten.sum.dim_IntList(%g) {dim = [0]} : f32[96]""",
        "%t3: f32[96], %t1: f32[32, 96], %t4: f32[32, 96], %t5: f32[96]"),
        lambda g: (randn(g, 32, 96), randn(g, 32, 1), randn(g, 32, 1).abs(), randn(g, 32, 96), randn(g, 96))),
    "layer_norm_backward_rows_and_columns": (group_text(
        "%g: f32[64, 48], %w: f32[48], %x: f32[64, 48], %m: f32[64, 1], %r: f32[64, 1], "
        "%t: f32[64, 48]",
        """
        %t0 = aten.mul.Tensor(%g, %w) : f32[64, 48]
        %t1 = aten.mul.Tensor(%t0) {other = 48} : f32[64, 48]
        %t2 = aten.sum.dim_IntList(%t0) {dim = [1], keepdim = true} : f32[64, 1]
        %t3 = aten.sub.Tensor(%x, %m) : f32[64, 48]
        %t4 = aten.mul.Tensor(%t3, %r) : f32[64, 48]
        %t5 = aten.mul.Tensor(%t0, %t4) : f32[64, 48]
        %t6 = aten.sum.dim_IntList(%t5) {dim = [1], keepdim = true} : f32[64, 1]
        %t7 = aten.mul.Tensor(%t4, %t6) : f32[64, 48]
        %t8 = aten.sub.Tensor(%t1, %t2) : f32[64, 48]
        %t9 = aten.sub.Tensor(%t8, %t7) : f32[64, 48]
        %t10 = aten.div.Tensor(%r) {other = 48} : f32[64, 1]
        %t11 = aten.mul.Tensor(%t10, %t9) : f32[64, 48]
        %t12 = aten.add.Tensor(%t, %t11) : f32[64, 48]
        %t13 = aten.mul.Tensor(%g, %t4) : f32[64, 48]
        %t14 = aten.sum.dim_IntList(%t13) {dim = [0]} : f32[48]
        %t15 = aten.sum.dim_IntList(%g) {dim = [0]} : f32[48]""",
        "%t12: f32[64, 48], %t14: f32[48], %t15: f32[48]"),
        lambda g: (randn(g, 64, 48), randn(g, 48), randn(g, 64, 48), randn(g, 64, 1), randn(g, 64, 1).abs(),
                 randn(g, 64, 48))),
})}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reduction_matches_eager(check, name):
    text, inputs = CASES[name]
    _, compiled = check(text, *inputs())
    (choice,) = compiled.choices
    kernel = check.codegen.generate(choice.node, check.registry)
    assert kernel.metadata["kind"] == "reduction"


def test_several_reductions_share_one_kernel(check):
    """softmax's two reductions and its epilogue are one group, one C function, and each
    reduction one accumulator over the row with an OpenMP reduction clause (a row of 20
    is one loop of three 8-lane vectors past the row's end, accumulating the first 20
    lanes, and in each thread's last row a loop over its whole 8-lane blocks, 16 values,
    and one over the last 8, the tail masked: row_loops.narrow_odd_row, overrun.py)."""
    text, inputs = CASES["softmax"]
    _, compiled = check(text, *inputs())
    assert len(compiled.choices) == 1 and len(compiled.cache) == 1
    source = check.codegen.generate(compiled.choices[0].node, check.registry).source
    for op in ("max", "+"):
        loops = re.findall(rf"#pragma omp simd reduction\({re.escape(op)}:(\w+)\)", source)
        assert len(set(loops)) == 1 and len(loops) == 3, loops
    assert "for (int64_t r = 0; r < 24; r++)" in source and "if (x != x_last)" in source
    assert "for (int64_t r = 0; r < 16; r++)" in source
    assert "for (int64_t r = 12; r < 20; r++)" in source and "simdlen(8)" in source
    assert source.count("void fused_") == 1


def test_rows_and_columns_are_two_nests_of_one_function(check):
    """layer_norm's backward: row sums (input gradient) and column sums (weight and bias
    gradients) are two loop nests of one C function; the column nest walks blocks."""
    text, inputs = CASES["layer_norm_backward_rows_and_columns"]
    _, compiled = check(text, *inputs())
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    assert kernel.metadata["nests"] == 2 and kernel.source.count("void fused_") == 1
    assert "for (int64_t xb = 0;" in kernel.source


@pytest.mark.parametrize("shape", [(8, 6), (300, 70), (2, 8, 8, 40)])
def test_a_reduction_of_another_dims_result_reads_it_from_scratch(check, shape):
    """Column sums of values computed from row results that are no output (a layer_norm
    backward whose statistics are recomputed: the weight gradient sums g * (x - mean) *
    rstd over the batch): the row nest stores its results in scratch arrays of one value
    per row, the column nest reads them there."""
    text = row_results_for_columns(shape)
    g = torch.Generator().manual_seed(len(shape))
    a, grad = randn(g, *shape) * 3 + 1, randn(g, *shape)
    a.view(-1)[5] = float("nan")
    _, compiled = check(text, a, grad, rtol=2e-5, atol=2e-5)
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    assert kernel.metadata["nests"] == 2
    assert "malloc" in kernel.source and "free(scratch_" in kernel.source


@pytest.mark.parametrize("shape", [(8, 6), (33, 70), (300, 17), (4, 5, 40)])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_a_reduction_of_a_stored_result_of_other_dims_reads_it_back(check, shape, dtype):
    """A cross-entropy gradient and the bias gradient summed from it over the batch: the
    column sum reads a value computed from row sums, which the row nest stores as an
    output, so the column nest reads it back from there (as eager does, rounded to the
    output's dtype) instead of declining the group."""
    text = stored_output_for_columns(shape, dtype)
    g = torch.Generator().manual_seed(len(shape))
    a = (randn(g, *shape) - 2).to(DTYPES[dtype])
    grad = randn(g, *shape).to(DTYPES[dtype])
    grad.view(-1)[3] = float("nan")
    _, compiled = check(text, a, grad)
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    assert kernel.metadata["nests"] == 2
    assert re.search(r"= (tl_bf16_to_f32\()?out_d\[", kernel.source)  # read back


def test_cross_entropy_training_step_runs_on_cpu(tmp_path):
    from torchloom.backend import torchloom_backend
    from torchloom.tools import Compiler
    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False, strict=True)
    torch._dynamo.reset()
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 5)

    def fn(x, y):
        return torch.nn.functional.cross_entropy(lin(x), y)
    c = torch.compile(fn, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    x, y = torch.randn(6, 8), torch.randint(0, 5, (6,))
    loss = c(x, y)
    loss.backward()
    got = [p.grad.clone() for p in lin.parameters()]
    lin.zero_grad()
    want = fn(x, y)
    want.backward()
    torch.testing.assert_close(loss, want)
    for a, b in zip(got, [p.grad for p in lin.parameters()]):
        torch.testing.assert_close(a, b)
    choices = [ch for comp in compiler.compilations for ch in comp.compiled.choices]
    assert choices and all(ch.codegen == "cpu" for ch in choices), \
        [(ch.codegen, [str(r) for r in ch.fallback_reasons]) for ch in choices]


def test_long_rows_run_in_parallel(check):
    text, inputs = CASES["softmax_bf16_long_rows_parallel"]
    _, compiled = check(text, *inputs())
    meta = check.codegen.generate(compiled.choices[0].node, check.registry).metadata
    assert meta["parallel"] and meta["rows"] == [64]


def test_var_of_one_element_is_nan(check):
    text, inputs = CASES["var_of_one_element_is_nan"]
    (v,), _ = check(text, *inputs())
    assert torch.isnan(v).all()


def test_column_blocks_follow_the_thread_count(check):
    """Column reductions walk one block of columns per thread (at most ``CAP`` columns,
    whole ``UNIT``s): wider than ``CAP`` (4100 columns, not a multiple of 16) and at 1, 2
    and 3 threads, sums, maxima with NaN and the full-shape output match eager, and every
    column sums its rows in order whatever the blocks: bitwise the same at every count."""
    from torchloom_codegen_cpu.columns import CAP
    cols = CAP * 2 + 4
    text = group_text(f"%a: f32[40, {cols}], %b: f32[{cols}]", f"""
        %m = aten.mul.Tensor(%a, %b) : f32[40, {cols}]
        %s = aten.sum.dim_IntList(%m) {{dim = [0]}} : f32[{cols}]
        %x = aten.amax.default(%a) {{dim = [0]}} : f32[{cols}]""",
        f"%s: f32[{cols}], %x: f32[{cols}], %m: f32[40, {cols}]")
    g = torch.Generator().manual_seed(0)
    a, b = with_nans(randn(g, 40, cols)), randn(g, cols)
    source = check.codegen.generate(check.compile(text).choices[0].node, check.registry).source
    assert "const int64_t n_xb = (nthreads < " in source
    before, runs = torch.get_num_threads(), []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            runs.append(check(text, a, b)[0])
    finally:
        torch.set_num_threads(before)
    for run in runs[1:]:
        for got, first in zip(run, runs[0]):
            assert torch.equal(got.nan_to_num(), first.nan_to_num())


@pytest.mark.parametrize("shape, dim, declined", [
    ((256, 256), 0, False),      # the column form, in walks (max, then sum, then quotient)
    ((16, 64, 64), 1, True),     # rows are strided columns, and a block's columns are not
                                 # contiguous: one element per cache line
    ((256, 256), 1, False),      # rows in memory order
    ((40, 64), 0, False),        # small: in the L1 cache
    ((64, 16, 4), 1, False),     # rows step over 4 elements only
])
def test_strided_rows_of_dependent_reductions_are_declined(codegen, registry, shape, dim,
                                                           declined):
    """softmax over a dim before a long innermost one: the row form read every row with a
    stride, 3-13x slower than eager; the column form takes it where the kept dims are
    innermost, other such groups are declined with the reason (and run on eager), the rest
    still compile."""
    t = f"f32[{', '.join(map(str, shape))}]"
    kept = list(shape)
    kept[dim] = 1
    k = f"f32[{', '.join(map(str, kept))}]"
    text = group_text(
        f"%a: {t}",
        f"%m = aten.amax.default(%a) {{dim = [{dim}], keepdim = true}} : {k}\n"
        f"%s = aten.sub.Tensor(%a, %m) : {t}\n%e = aten.exp.default(%s) : {t}\n"
        f"%u = aten.sum.dim_IntList(%e) {{dim = [{dim}], keepdim = true}} : {k}\n"
        f"%o = aten.div.Tensor(%e, %u) : {t}", f"%o: {t}")
    reason = codegen.supports(next(parse_graph(text).nodes), registry)
    if declined:
        assert reason is not None and "stride" in reason.message, reason
    else:
        assert reason is None, reason


def _softmax_text(shape, dims, dtype, log: bool = False, extra_out: bool = False) -> str:
    t = f"{dtype}[{', '.join(map(str, shape))}]"
    kept = [1 if d in dims else n for d, n in enumerate(shape)]
    k = f"{dtype}[{', '.join(map(str, kept))}]"
    ds = ", ".join(map(str, dims))
    tail = (f"%l = aten.log.default(%u) : {k}\n%o = aten.sub.Tensor(%s, %l) : {t}" if log
            else f"%o = aten.div.Tensor(%e, %u) : {t}")
    return group_text(
        f"%a: {t}",
        f"%m = aten.amax.default(%a) {{dim = [{ds}], keepdim = true}} : {k}\n"
        f"%s = aten.sub.Tensor(%a, %m) : {t}\n%e = aten.exp.default(%s) : {t}\n"
        f"%u = aten.sum.dim_IntList(%e) {{dim = [{ds}], keepdim = true}} : {k}\n{tail}",
        f"%o: {t}" + (f", %m: {k}, %u: {k}" if extra_out else ""))


@pytest.mark.parametrize("shape, dims", [((300, 70), [0]), ((64, 9, 33), [0]),
                                         ((7, 5, 130), [0, 1]), ((1000, 17), [0]),
                                         ((3, 2048), [0]),
                                         # one column: loads hoisted out of the column loop
                                         # (a later walk must declare them again)
                                         ((300, 1), [0]), ((64, 3, 1), [0, 1])])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
@pytest.mark.parametrize("log", [False, True])
def test_dependent_column_reductions_match_eager(check, shape, dims, dtype, log):
    """softmax / log_softmax over leading dims with the kept dims innermost: the column form
    in walks (the max, then the sum of exp(x - max), then the outputs), each column's
    results kept in its block's array; NaN and inf columns included; the reductions are
    outputs too."""
    text = _softmax_text(shape, dims, dtype, log, extra_out=True)
    x = randn(torch.Generator().manual_seed(len(shape)), *shape) * 4
    if shape[-1] > 3:
        x[..., 1] = float("nan")
        x[..., 2] = float("-inf")
        x[0, ..., 3] = float("inf")
    else:
        x[3] = float("nan")
    got, compiled = check(text, x.to(DTYPES[dtype]), rtol=2e-5, atol=1e-5) if dtype == "f32" \
        else check(text, x.to(DTYPES[dtype]))
    source = check.codegen.generate(compiled.choices[0].node, check.registry).source
    assert "xb" in source  # the column form's blocks
