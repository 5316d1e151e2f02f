"""Reduction kernels (reduction.py, kernel.py): every reduction kind over last and other dims,
with prologues and epilogues, several reductions per row (softmax, layer_norm, RMSNorm
forward and backward), edge values, low precision, strided inputs and rows long enough to
run on several threads; each compiled by the cpu codegen and compared with eager."""

from __future__ import annotations

import pytest
import torch

from torchloom.api import parse_graph

from conftest import group_text

g = torch.Generator().manual_seed(1)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def with_nans(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t[1, 3] = float("nan")
    t[2, 0] = float("inf")
    return t


CASES = {
    "sum_last_dim": (group_text("%a: f32[6, 10]", """
        %s = aten.sum.dim_IntList(%a) {dim = [-1]} : f32[6]""", "%s: f32[6]"),
        lambda: (randn(6, 10),)),
    "sum_dim0_keepdim": (group_text("%a: f32[9, 7]", """
        %s = aten.sum.dim_IntList(%a) {dim = [0], keepdim = true} : f32[1, 7]""",
        "%s: f32[1, 7]"), lambda: (randn(9, 7),)),
    "sum_all_dims": (group_text("%a: f32[5, 6]", """
        %s = aten.sum.default(%a) : f32[]""", "%s: f32[]"), lambda: (randn(5, 6),)),
    "sum_outer_dims": (group_text("%a: f32[3, 4, 5]", """
        %s = aten.sum.dim_IntList(%a) {dim = [0, 2]} : f32[4]""", "%s: f32[4]"),
        lambda: (randn(3, 4, 5),)),
    "sum_int_to_i64": (group_text("%a: i32[4, 6]", """
        %s = aten.sum.dim_IntList(%a) {dim = [1]} : i64[4]""", "%s: i64[4]"),
        lambda: (torch.randint(-100, 100, (4, 6), generator=g, dtype=torch.int32),)),
    "column_sum_long": (group_text("%a: f32[100, 6]", """
        %s = aten.sum.dim_IntList(%a) {dim = [0]} : f32[6]""", "%s: f32[6]"),
        lambda: (randn(100, 6),)),
    "mean_middle_dim": (group_text("%a: f32[3, 5, 4]", """
        %s = aten.mean.dim(%a) {dim = [1]} : f32[3, 4]""", "%s: f32[3, 4]"),
        lambda: (randn(3, 5, 4),)),
    "amax_amin_nan_inf": (group_text("%a: f32[4, 8]", """
        %x = aten.amax.default(%a) {dim = [1]} : f32[4]
        %n = aten.amin.default(%a) {dim = [1], keepdim = true} : f32[4, 1]""",
        "%x: f32[4], %n: f32[4, 1]"), lambda: (with_nans(randn(4, 8)),)),
    "var_unbiased": (group_text("%a: f32[5, 12]", """
        %v = aten.var.correction(%a) {dim = [-1], correction = 1} : f32[5]""", "%v: f32[5]"),
        lambda: (randn(5, 12) * 3 + 100,)),
    "var_mean_keepdim": (group_text("%a: f32[5, 12]", """
        %v, %m = aten.var_mean.correction(%a) {dim = [-1], correction = 0, keepdim = true} : f32[5, 1], f32[5, 1]""",  # noqa: E501
        "%v: f32[5, 1], %m: f32[5, 1]"), lambda: (randn(5, 12),)),
    "var_of_one_element_is_nan": (group_text("%a: f32[4, 1]", """
        %v = aten.var.correction(%a) {dim = [-1], correction = 1} : f32[4]""", "%v: f32[4]"),
        lambda: (randn(4, 1),)),
    "argmax_argmin_ties_nan": (group_text("%a: f32[4, 9]", """
        %x = aten.argmax.default(%a) {dim = 1} : i64[4]
        %n = aten.argmin.default(%a) {dim = 1, keepdim = true} : i64[4, 1]""",
        "%x: i64[4], %n: i64[4, 1]"),
        lambda: (with_nans(torch.randint(0, 3, (4, 9), generator=g).float()),)),
    "max_min_dim_values_and_indices": (group_text("%a: f32[4, 9]", """
        %v, %i = aten.max.dim(%a) {dim = 1} : f32[4], i64[4]
        %w, %j = aten.min.dim(%a) {dim = 1, keepdim = true} : f32[4, 1], i64[4, 1]""",
        "%v: f32[4], %i: i64[4], %w: f32[4, 1], %j: i64[4, 1]"),
        lambda: (with_nans(torch.randn(4, 9, generator=g)),)),
    "outputs_viewed_to_other_shapes": (group_text("%a: f32[6, 8]", """
        %s = aten.sum.dim_IntList(%a) {dim = [-1], keepdim = true} : f32[6, 1]
        %y = aten.div.Tensor(%a, %s) : f32[6, 8]
        %r = aten.view.default(%y) {size = [2, 3, 8]} : f32[2, 3, 8]
        %q = aten.view.default(%s) {size = [3, 2]} : f32[3, 2]""",
        "%r: f32[2, 3, 8], %q: f32[3, 2]"), lambda: (randn(6, 8).abs() + 0.5,)),
    "prologue_epilogue": (group_text("%a: f32[6, 10], %b: f32[10]", """
        %e = aten.exp.default(%a) : f32[6, 10]
        %m = aten.mul.Tensor(%e, %b) : f32[6, 10]
        %s = aten.sum.dim_IntList(%m) {dim = [-1]} : f32[6]
        %r = aten.add.Tensor(%s) {other = 1.0} : f32[6]""", "%r: f32[6]"),
        lambda: (randn(6, 10), randn(10))),
    "softmax": (group_text("%a: f32[8, 20]", """
        %x = aten.amax.default(%a) {dim = [-1], keepdim = true} : f32[8, 1]
        %s = aten.sub.Tensor(%a, %x) : f32[8, 20]
        %e = aten.exp.default(%s) : f32[8, 20]
        %t = aten.sum.dim_IntList(%e) {dim = [-1], keepdim = true} : f32[8, 1]
        %y = aten.div.Tensor(%e, %t) : f32[8, 20]""", "%y: f32[8, 20]"),
        lambda: (randn(8, 20) * 5,)),
    "softmax_dim0": (group_text("%a: f32[12, 5]", """
        %x = aten.amax.default(%a) {dim = [0], keepdim = true} : f32[1, 5]
        %s = aten.sub.Tensor(%a, %x) : f32[12, 5]
        %e = aten.exp.default(%s) : f32[12, 5]
        %t = aten.sum.dim_IntList(%e) {dim = [0], keepdim = true} : f32[1, 5]
        %y = aten.div.Tensor(%e, %t) : f32[12, 5]""", "%y: f32[12, 5]"),
        lambda: (randn(12, 5),)),
    "layernorm": (group_text("%a: f32[6, 16], %w: f32[16], %b: f32[16]", """
        %v, %m = aten.var_mean.correction(%a) {dim = [-1], correction = 0, keepdim = true} : f32[6, 1], f32[6, 1]
        %ve = aten.add.Tensor(%v) {other = 1e-05} : f32[6, 1]
        %r = aten.rsqrt.default(%ve) : f32[6, 1]
        %c = aten.sub.Tensor(%a, %m) : f32[6, 16]
        %n = aten.mul.Tensor(%c, %r) : f32[6, 16]
        %nw = aten.mul.Tensor(%n, %w) : f32[6, 16]
        %y = aten.add.Tensor(%nw, %b) : f32[6, 16]""",  # noqa: E501
        "%y: f32[6, 16], %m: f32[6, 1], %r: f32[6, 1]"),
        lambda: (randn(6, 16) * 2 + 1, randn(16), randn(16))),
    "layernorm_bf16": (group_text("%a: bf16[4, 24], %w: bf16[24]", """
        %f = prims.convert_element_type.default(%a) {dtype = #f32} : f32[4, 24]
        %v, %m = aten.var_mean.correction(%f) {dim = [-1], correction = 0, keepdim = true} : f32[4, 1], f32[4, 1]
        %ve = aten.add.Tensor(%v) {other = 1e-05} : f32[4, 1]
        %r = aten.rsqrt.default(%ve) : f32[4, 1]
        %c = aten.sub.Tensor(%f, %m) : f32[4, 24]
        %n = aten.mul.Tensor(%c, %r) : f32[4, 24]
        %nw = aten.mul.Tensor(%n, %w) : f32[4, 24]
        %y = prims.convert_element_type.default(%nw) {dtype = #bf16} : bf16[4, 24]""",  # noqa: E501
        "%y: bf16[4, 24]"),
        lambda: (randn(4, 24, dtype=torch.bfloat16), randn(24, dtype=torch.bfloat16))),
    "rmsnorm": (group_text("%a: f32[5, 16], %w: f32[16]", """
        %p = aten.pow.Tensor_Scalar(%a) {exponent = 2} : f32[5, 16]
        %m = aten.mean.dim(%p) {dim = [-1], keepdim = true} : f32[5, 1]
        %e = aten.add.Tensor(%m) {other = 1e-06} : f32[5, 1]
        %r = aten.rsqrt.default(%e) : f32[5, 1]
        %n = aten.mul.Tensor(%a, %r) : f32[5, 16]
        %y = aten.mul.Tensor(%n, %w) : f32[5, 16]""", "%y: f32[5, 16]"),
        lambda: (randn(5, 16), randn(16))),
    "empty_rows_sum_and_mean": (group_text("%a: f32[3, 0]", """
        %s = aten.sum.dim_IntList(%a) {dim = [-1]} : f32[3]
        %m = aten.mean.dim(%a) {dim = [-1]} : f32[3]""", "%s: f32[3], %m: f32[3]"),
        lambda: (randn(3, 0),)),
    "prod_and_std": (group_text("%a: f32[5, 7]", """
        %p = aten.prod.dim_int(%a) {dim = 1} : f32[5]
        %s = aten.std.correction(%a) {dim = [1], correction = 1} : f32[5]""",
        "%p: f32[5], %s: f32[5]"), lambda: (with_nans(randn(5, 7)),)),
    "softmax_bf16_long_rows_parallel": (group_text("%a: bf16[64, 1000]", """
        %f = prims.convert_element_type.default(%a) {dtype = #f32} : f32[64, 1000]
        %x = aten.amax.default(%f) {dim = [-1], keepdim = true} : f32[64, 1]
        %s = aten.sub.Tensor(%f, %x) : f32[64, 1000]
        %e = aten.exp.default(%s) : f32[64, 1000]
        %t = aten.sum.dim_IntList(%e) {dim = [-1], keepdim = true} : f32[64, 1]
        %y = aten.div.Tensor(%e, %t) : f32[64, 1000]
        %b = prims.convert_element_type.default(%y) {dtype = #bf16} : bf16[64, 1000]""",
        "%b: bf16[64, 1000]"), lambda: (randn(64, 1000, dtype=torch.bfloat16) * 4,)),
    "sum_of_transposed_input": (group_text("%a: f32[16, 12]", """
        %t = aten.t.default(%a) : f32[12, 16]
        %s = aten.sum.dim_IntList(%t) {dim = [1]} : f32[12]""", "%s: f32[12]"),
        lambda: (randn(16, 12),)),
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
        lambda: (randn(6, 32), randn(6, 32), randn(32), randn(6, 1).abs() + 0.5)),
    "layer_norm_backward_column_sums": (group_text(
        "%x: f32[32, 96], %m: f32[32, 1], %r: f32[32, 1], %g: f32[32, 96], %w: f32[96]", """
        %t0 = aten.sub.Tensor(%x, %m) : f32[32, 96]
        %t1 = aten.mul.Tensor(%t0, %r) : f32[32, 96]
        %t2 = aten.mul.Tensor(%g, %t1) : f32[32, 96]
        %t3 = aten.sum.dim_IntList(%t2) {dim = [0]} : f32[96]
        %t4 = aten.mul.Tensor(%g, %w) : f32[32, 96]
        %t5 = aten.sum.dim_IntList(%g) {dim = [0]} : f32[96]""",
        "%t3: f32[96], %t1: f32[32, 96], %t4: f32[32, 96], %t5: f32[96]"),
        lambda: (randn(32, 96), randn(32, 1), randn(32, 1).abs(), randn(32, 96), randn(96))),
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
        lambda: (randn(64, 48), randn(48), randn(64, 48), randn(64, 1), randn(64, 1).abs(),
                 randn(64, 48))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reduction_matches_eager(check, name):
    text, inputs = CASES[name]
    _, compiled = check(text, *inputs())
    (choice,) = compiled.choices
    kernel = check.codegen.generate(choice.node, check.registry)
    assert kernel.metadata["kind"] == "reduction"


def test_several_reductions_share_one_kernel(check):
    """softmax's two reductions and its epilogue are one group, one C function, and each
    reduction one SIMD loop with an OpenMP reduction clause."""
    text, inputs = CASES["softmax"]
    _, compiled = check(text, *inputs())
    assert len(compiled.choices) == 1 and len(compiled.cache) == 1
    source = check.codegen.generate(compiled.choices[0].node, check.registry).source
    assert source.count("#pragma omp simd reduction(max:") == 1
    assert source.count("#pragma omp simd reduction(+:") == 1
    assert source.count("void fused_") == 1


def test_rows_and_columns_are_two_nests_of_one_function(check):
    """layer_norm's backward: row sums (input gradient) and column sums (weight and bias
    gradients) are two loop nests of one C function; the column nest walks blocks."""
    text, inputs = CASES["layer_norm_backward_rows_and_columns"]
    _, compiled = check(text, *inputs())
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    assert kernel.metadata["nests"] == 2 and kernel.source.count("void fused_") == 1
    assert "for (int64_t xb = 0;" in kernel.source


def test_a_reduction_of_another_dims_result_is_declined(check, codegen, registry):
    text = group_text("%a: f32[8, 6]", """
        %s = aten.sum.dim_IntList(%a) {dim = [1], keepdim = true} : f32[8, 1]
        %d = aten.div.Tensor(%a, %s) : f32[8, 6]
        %c = aten.sum.dim_IntList(%d) {dim = [0]} : f32[6]""", "%c: f32[6]")
    reason = codegen.supports(next(parse_graph(text).nodes), registry)
    assert reason is not None and "reductions over other dims" in reason.message


def test_long_rows_run_in_parallel(check):
    text, inputs = CASES["softmax_bf16_long_rows_parallel"]
    _, compiled = check(text, *inputs())
    meta = check.codegen.generate(compiled.choices[0].node, check.registry).metadata
    assert meta["parallel"] and meta["rows"] == [64]


def test_var_of_one_element_is_nan(check):
    text, inputs = CASES["var_of_one_element_is_nan"]
    (v,), _ = check(text, *inputs())
    assert torch.isnan(v).all()


def test_reductions_of_size_one_dims(check):
    """A [1, 1] input reduced over dim 0 (found by the fuzzer): every coordinate is 0, none
    is the loop's index."""
    text = group_text("%a: bf16[1, 1]", """
        %v = aten.add.Tensor(%a, %a) : bf16[1, 1]
        %r = aten.sum.dim_IntList(%v) {dim = [0]} : bf16[1]""", "%v: bf16[1, 1], %r: bf16[1]")
    check(text, torch.tensor([[1.5]], dtype=torch.bfloat16))
    text = group_text("%a: f32[1, 5, 1]", """
        %s = aten.amax.default(%a) {dim = [1], keepdim = true} : f32[1, 1, 1]
        %d = aten.sub.Tensor(%a, %s) : f32[1, 5, 1]""", "%d: f32[1, 5, 1], %s: f32[1, 1, 1]")
    check(text, torch.randn(1, 5, 1))
