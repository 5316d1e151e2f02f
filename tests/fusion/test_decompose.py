"""fusion.decompose: composites become fusible primitives with the same results."""

from __future__ import annotations

import pytest

from fusion_testing import fuse_and_compare, fusion_pipeline, groups
from torchloom_fusion.decompose import Decompose

CASES = {
    "layer_norm": """graph @g(%x: f32[6, 16], %w: f32[16], %b: f32[16]) {
      %o, %m, %r = aten.native_layer_norm.default(%x, %w, %b) {eps = 1e-05, normalized_shape = [16]} : f32[6, 16], f32[6, 1], f32[6, 1]
      return %o, %m, %r
    }""",
    "softmax": """graph @g(%x: f32[6, 16]) {
      %s = aten._softmax.default(%x) {dim = -1, half_to_float = false} : f32[6, 16]
      return %s
    }""",
    "log_softmax": """graph @g(%x: f32[6, 16]) {
      %s = aten._log_softmax.default(%x) {dim = 1, half_to_float = false} : f32[6, 16]
      return %s
    }""",
    "softmax_backward": """graph @g(%g: f32[6, 16], %y: f32[6, 16]) {
      %s = aten._softmax_backward_data.default(%g, %y) {dim = -1, input_dtype = #f32} : f32[6, 16]
      return %s
    }""",
    "gelu_backward": """graph @g(%g: f32[6, 16], %x: f32[6, 16]) {
      %s = aten.gelu_backward.default(%g, %x) : f32[6, 16]
      return %s
    }""",
    "batch_norm_eval": """graph @g(%x: f32[4, 3, 5], %w: f32[3], %b: f32[3], %m: f32[3], %v: f32[3]) {
      %o, %s1, %s2 = aten._native_batch_norm_legit_no_training.default(%x, %w, %b, %m, %v) {momentum = 0.1, eps = 1e-05} : f32[4, 3, 5], f32[0], f32[0]
      return %o
    }""",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_composite_is_replaced_by_primitives_with_equal_results(registry, case):
    fused = fuse_and_compare(CASES[case], registry, [Decompose()])
    ops = [n.op for n in fused.nodes]
    composite = CASES[case].split("= ")[1].split("(")[0]
    assert composite not in ops
    assert all(registry.get(op).category != "opaque" for op in ops)


@pytest.mark.parametrize("case", ["layer_norm", "softmax", "log_softmax", "softmax_backward"])
def test_decomposed_normalization_is_one_group(registry, case):
    fused = fuse_and_compare(CASES[case], registry, fusion_pipeline())
    assert len(groups(fused)) == 1 and len(fused) == 1


def test_addmm_becomes_mm_plus_bias_add_that_joins_the_next_group(registry):
    text = """graph @g(%b: f32[16], %x: f32[4, 8], %w: f32[8, 16]) {
      %a = aten.addmm.default(%b, %x, %w) : f32[4, 16]
      %r = aten.relu.default(%a) : f32[4, 16]
      return %r
    }"""
    fused = fuse_and_compare(text, registry, fusion_pipeline())
    assert [n.op for n in fused.nodes] == ["aten.mm.default", "torchloom.fusion_group"]
    assert {n.op for n in groups(fused)[0].region.nodes} == {"aten.add.Tensor",
                                                              "aten.relu.default"}


def test_scaled_addmm_and_disabled_ops_are_left_alone(registry):
    text = """graph @g(%b: f32[16], %x: f32[4, 8], %w: f32[8, 16]) {
      %a = aten.addmm.default(%b, %x, %w) {beta = 2, alpha = 1} : f32[4, 16]
      %s = aten._softmax.default(%a) {dim = -1, half_to_float = false} : f32[4, 16]
      return %s
    }"""
    fused = fuse_and_compare(text, registry, [Decompose(ops=())])
    assert [n.op for n in fused.nodes] == ["aten.addmm.default", "aten._softmax.default"]


def test_addmm_read_only_by_a_matmul_stays_whole(registry):
    text = """graph @g(%b: f32[8], %x: f32[4, 8], %w: f32[8, 8]) {
      %a = aten.addmm.default(%b, %x, %w) : f32[4, 8]
      %m = aten.mm.default(%a, %w) : f32[4, 8]
      return %m
    }"""
    fused = fuse_and_compare(text, registry, fusion_pipeline())
    assert [n.op for n in fused.nodes] == ["aten.addmm.default", "aten.mm.default"]
