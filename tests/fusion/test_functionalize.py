"""fusion.functionalize: in-place ops become out-of-place only when no alias can tell."""

from __future__ import annotations

from fusion_testing import fuse_and_compare, fusion_pipeline, groups
from torchloom_fusion.functionalize import Functionalize

PRIVATE = """graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
  %e = aten.exp.default(%x) : f32[4, 8]
  %a = aten.add_.Tensor(%e, %y) : f32[4, 8]
  %n = aten.neg.default(%e) : f32[4, 8]
  return %n
}"""


def test_write_to_a_private_value_becomes_out_of_place(registry):
    fused = fuse_and_compare(PRIVATE, registry, [Functionalize()])
    assert [n.op for n in fused.nodes] == ["aten.exp.default", "aten.add.Tensor",
                                           "aten.neg.default"]
    neg = fused.last
    assert neg.inputs[0].producer.op == "aten.add.Tensor"  # reads the written value


def test_functionalized_graph_fuses_into_one_group(registry):
    fused = fuse_and_compare(PRIVATE, registry, fusion_pipeline())
    assert len(groups(fused)) == 1 and len(fused) == 1


def test_write_to_a_graph_input_is_kept_and_blocks_fusion(registry):
    text = """graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
      %e = aten.exp.default(%x) : f32[4, 8]
      %a = aten.add_.Tensor(%x, %y) : f32[4, 8]
      %n = aten.neg.default(%x) : f32[4, 8]
      %s = aten.add.Tensor(%e, %n) : f32[4, 8]
      return %s
    }"""
    fused = fuse_and_compare(text, registry, fusion_pipeline())
    assert [n.op for n in fused.nodes].count("aten.add_.Tensor") == 1
    for g in groups(fused):
        ops = {n.op for n in g.region.nodes}
        assert not {"aten.exp.default", "aten.neg.default"} <= ops


def test_write_through_a_view_is_kept(registry):
    text = """graph @g(%x: f32[4, 8], %z: f32[32]) {
      %c = aten.clone.default(%x) : f32[4, 8]
      %v = aten.view.default(%c) {size = [32]} : f32[32]
      %w = aten.add_.Tensor(%v, %z) : f32[32]
      %s = aten.sin.default(%c) : f32[4, 8]
      return %s
    }"""
    fused = fuse_and_compare(text, registry, [Functionalize()])
    assert "aten.add_.Tensor" in [n.op for n in fused.nodes]
