"""Pointwise fusion groups that every codegen's tests compile and compare with eager:
broadcasting, promotion, low-precision inputs, scalars and alpha, clamp with NaN bounds,
the unary table, strided inputs and outputs, views as index math, slices and splits,
backward templates, scalar group inputs, explicit casts, NaN/inf/-0.0, size-1 dims, empty
tensors (moved here from the Triton codegen's tests, which run them too).

``CASES``: name -> ``(graph text, inputs)``, as in :mod:`torchloom.testing.reductions`
(``inputs()`` draws from a generator seeded afresh).
"""

from __future__ import annotations

import torch

from torchloom.testing.reductions import cases, group_text, randn

CASES = cases({
    "broadcast_multi_output": (
        group_text("%a: f32[4, 8], %b: f32[8]", """
            %s = aten.add.Tensor(%a, %b) : f32[4, 8]
            %e = aten.exp.default(%s) : f32[4, 8]
            %t = aten.tanh.default(%s) : f32[4, 8]""", "%e: f32[4, 8], %t: f32[4, 8]"),
        lambda g: (randn(g, 4, 8), randn(g, 8))),
    "promotion_int_float": (
        group_text("%a: i64[6, 5], %b: f32[5]", """
            %m = aten.mul.Tensor(%a, %b) : f32[6, 5]
            %d = aten.div.Tensor(%a, %a) : f32[6, 5]
            %c = aten.gt.Tensor(%a, %b) : b8[6, 5]
            %w = aten.where.self(%c, %m, %d) : f32[6, 5]""", "%w: f32[6, 5], %c: b8[6, 5]"),
        lambda g: (torch.randint(-5, 5, (6, 5), generator=g) + 10, randn(g, 5) * 10)),
    "half_inputs_computed_in_fp32": (
        group_text("%a: f16[16, 8], %b: bf16[8]", """
            %x = aten.gelu.default(%a) {approximate = "tanh"} : f16[16, 8]
            %y = aten.mul.Tensor(%x, %b) : f32[16, 8]""", "%x: f16[16, 8], %y: f32[16, 8]"),
        lambda g: (randn(g, 16, 8, dtype=torch.float16), randn(g, 8, dtype=torch.bfloat16))),
    "scalars_and_alpha": (
        group_text("%a: f32[5, 7], %b: f32[5, 7]", """
            %s = aten.add.Tensor(%a, %b) {alpha = 3} : f32[5, 7]
            %m = aten.mul.Tensor(%s) {other = -2.5} : f32[5, 7]
            %c = aten.clamp.default(%m) {min = -4.0, max = 6.0} : f32[5, 7]
            %p = aten.pow.Tensor_Scalar(%c) {exponent = 2} : f32[5, 7]
            %q = aten.pow.Tensor_Scalar(%a) {exponent = 1.5} : f32[5, 7]
            %r = aten.rsub.Scalar(%p) {other = 1.0} : f32[5, 7]""", "%r: f32[5, 7], %q: f32[5, 7]"),
        lambda g: (randn(g, 5, 7).abs(), randn(g, 5, 7))),
    "clamp_with_nan_bounds_gives_nan": (  # as eager (found on the cpu codegen, session 18)
        group_text("%a: f32[5, 7]", """
            %l = aten.clamp_min.default(%a) {min = nan} : f32[5, 7]
            %h = aten.clamp_max.default(%a) {max = nan} : f32[5, 7]
            %c = aten.clamp.default(%a) {min = -0.5, max = nan} : f32[5, 7]
            %k = aten.clamp.default(%a) {min = 0.5, max = -0.5} : f32[5, 7]""",
                   "%l: f32[5, 7], %h: f32[5, 7], %c: f32[5, 7], %k: f32[5, 7]"),
        lambda g: (torch.cat([randn(g, 4, 7), torch.tensor([[float("nan"), float("inf"), -0.0, 0.0,
                                                        -float("inf"), 1.0, -1.0]])]),)),
    "unary_table": (
        group_text("%a: f32[33]", """
            %s = aten.sigmoid.default(%a) : f32[33]
            %l = aten.log1p.default(%s) : f32[33]
            %r = aten.rsqrt.default(%s) : f32[33]
            %e = aten.expm1.default(%r) : f32[33]
            %n = aten.neg.default(%e) : f32[33]
            %u = aten.relu.default(%n) : f32[33]
            %q = aten.sqrt.default(%s) : f32[33]
            %v = aten.silu.default(%a) : f32[33]
            %h = aten.gelu.default(%a) : f32[33]""", "%u: f32[33], %l: f32[33], %q: f32[33], "
                                                      "%v: f32[33], %h: f32[33]"),
        lambda g: (randn(g, 33) * 3,)),
    "strided_input_and_output": (
        group_text("%a: f32[8, 6] strided[1, 8], %b: f32[8, 6]", """
            %s = aten.sub.Tensor(%a, %b) : f32[8, 6]
            %t = aten.permute.default(%s) {dims = [1, 0]} : f32[6, 8]
            %c = aten.clone.default(%t) {memory_format = #contiguous_format} : f32[6, 8]""",
                   "%s: f32[8, 6], %c: f32[6, 8]"),
        lambda g: (randn(g, 6, 8).t(), randn(g, 8, 6))),
    "views_as_index_math": (
        group_text("%a: f32[4, 6], %b: f32[24], %c: f32[6]", """
            %v = aten.view.default(%b) {size = [4, 6]} : f32[4, 6]
            %t = aten.t.default(%v) : f32[6, 4]
            %u = aten.transpose.int(%t) {dim0 = 0, dim1 = 1} : f32[4, 6]
            %q = aten.unsqueeze.default(%c) {dim = 0} : f32[1, 6]
            %e = aten.expand.default(%q) {size = [4, 6]} : f32[4, 6]
            %s = aten.add.Tensor(%a, %u) : f32[4, 6]
            %m = aten.mul.Tensor(%s, %e) : f32[4, 6]
            %r = aten.reshape.default(%m) {shape = [2, 12]} : f32[2, 12]""", "%r: f32[2, 12]"),
        lambda g: (randn(g, 4, 6), randn(g, 24), randn(g, 6))),
    "slice_select_squeeze": (
        group_text("%a: f32[3, 10, 4]", """
            %s = aten.slice.Tensor(%a) {dim = 1, start = 1, end = 9, step = 2} : f32[3, 4, 4]
            %t = aten.select.int(%s) {dim = 2, index = -1} : f32[3, 4]
            %u = aten.unsqueeze.default(%t) {dim = 1} : f32[3, 1, 4]
            %q = aten.squeeze.dim(%u) {dim = 1} : f32[3, 4]
            %e = aten.exp.default(%q) : f32[3, 4]""", "%e: f32[3, 4]"),
        lambda g: (randn(g, 3, 10, 4),)),
    "split_unbind_pieces": (
        group_text("%a: f32[4, 12], %b: f32[2, 4]", """
            %p, %q, %r = aten.split.Tensor(%a) {split_size = 4, dim = 1} : f32[4, 4], f32[4, 4], f32[4, 4]
            %u, %w = aten.unbind.int(%b) : f32[4], f32[4]
            %s = aten.sigmoid.default(%q) : f32[4, 4]
            %t = aten.tanh.default(%r) : f32[4, 4]
            %m = aten.mul.Tensor(%s, %t) : f32[4, 4]
            %y = aten.add.Tensor(%m, %w) : f32[4, 4]
            %z = aten.mul.Tensor(%p, %u) : f32[4, 4]""", "%y: f32[4, 4], %z: f32[4, 4]"),  # noqa: E501
        lambda g: (randn(g, 4, 12), randn(g, 2, 4))),
    "backward_templates": (
        group_text("%g: f32[40], %x: f32[40]", """
            %a = aten.gelu_backward.default(%g, %x) : f32[40]
            %b = aten.gelu_backward.default(%g, %x) {approximate = "tanh"} : f32[40]
            %t = aten.tanh.default(%x) : f32[40]
            %c = aten.tanh_backward.default(%g, %t) : f32[40]
            %s = aten.sigmoid.default(%x) : f32[40]
            %d = aten.sigmoid_backward.default(%g, %s) : f32[40]
            %e = aten.threshold_backward.default(%g, %x) {threshold = 0} : f32[40]
            %f = aten.silu_backward.default(%g, %x) : f32[40]""",
                   "%a: f32[40], %b: f32[40], %c: f32[40], %d: f32[40], %e: f32[40], "
                   "%f: f32[40]"),
        lambda g: (randn(g, 40), randn(g, 40) * 3)),
    "scalar_arguments": (
        group_text("%a: f32[4, 6], %s: float, %n: int", """
            %m = aten.mul.Tensor(%a, %s) : f32[4, 6]
            %y = aten.add.Tensor(%m, %n) : f32[4, 6]""", "%y: f32[4, 6]"),
        lambda g: (randn(g, 4, 6), 2.5, 3)),
    "explicit_cast_rounds_as_eager": (
        group_text("%a: f32[64]", """
            %h = aten._to_copy.default(%a) {dtype = #bf16} : bf16[64]
            %f = prims.convert_element_type.default(%h) {dtype = #f32} : f32[64]
            %m = aten.mul.Tensor(%f) {other = 3.0} : f32[64]
            %i = aten._to_copy.default(%m) {dtype = #i32} : i32[64]""", "%m: f32[64], %i: i32[64]"),
        lambda g: (randn(g, 64) * 100,)),
    "nan_inf_propagation": (
        group_text("%a: f32[6], %b: f32[6]", """
            %x = aten.maximum.default(%a, %b) : f32[6]
            %n = aten.minimum.default(%a, %b) : f32[6]
            %r = aten.relu.default(%a) : f32[6]
            %e = aten.exp.default(%b) : f32[6]
            %i = aten.isnan.default(%x) : b8[6]""", "%x: f32[6], %n: f32[6], %r: f32[6], "
                                                    "%e: f32[6], %i: b8[6]"),
        lambda g: (torch.tensor([float("nan"), 1.0, -0.0, float("inf"), -1.0, 2.0]),
                 torch.tensor([0.0, float("nan"), 0.0, 1.0, float("-inf"), 100.0]))),
    "size_one_dims": (
        group_text("%a: f32[1, 5, 1], %b: f32[1]", """
            %s = aten.add.Tensor(%a, %b) : f32[1, 5, 1]""", "%s: f32[1, 5, 1]"),
        lambda g: (randn(g, 1, 5, 1), randn(g, 1))),
    "empty": (
        group_text("%a: f32[0, 4]", """
            %s = aten.exp.default(%a) : f32[0, 4]""", "%s: f32[0, 4]"),
        lambda g: (randn(g, 0, 4),)),
})
