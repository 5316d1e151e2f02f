"""fusion.merge-groups: adjacent groups merge; regions are tidied; splits move inside."""

from __future__ import annotations

from fusion_testing import fuse_and_compare, groups
from torchloom_fusion.merge_groups import MergeGroups

ADJACENT = """graph @g(%x: f32[4]) {
  %a, %dead = torchloom.fusion_group(%x) : f32[4], f32[4] region @g0(%p: f32[4]) {
    %e = aten.exp.default(%p) : f32[4]
    %u = aten.neg.default(%p) : f32[4]
    %e2 = aten.exp.default(%p) : f32[4]
    %s = aten.add.Tensor(%e, %e2) : f32[4]
    return %s, %u
  }
  %b = torchloom.fusion_group(%a) : f32[4] region @g1(%q: f32[4]) {
    %t = aten.tanh.default(%q) : f32[4]
    return %t
  }
  return %b
}"""


def test_adjacent_groups_merge_and_regions_are_cleaned(registry):
    fused = fuse_and_compare(ADJACENT, registry, [MergeGroups()])
    (group,) = groups(fused)
    ops = [n.op for n in group.region.nodes]
    assert ops == ["aten.exp.default", "aten.add.Tensor", "aten.tanh.default"]  # CSE, DCE
    assert len(group.outputs) == 1 and len(group.region.inputs) == 1


def test_unrelated_adjacent_groups_over_other_spaces_stay_apart(registry):
    text = """graph @g(%x: f32[4], %y: f32[16]) {
      %a = torchloom.fusion_group(%x) : f32[4] region @g0(%p: f32[4]) {
        %e = aten.exp.default(%p) : f32[4]
        return %e
      }
      %b = torchloom.fusion_group(%y) : f32[16] region @g1(%q: f32[16]) {
        %t = aten.tanh.default(%q) : f32[16]
        return %t
      }
      return %a, %b
    }"""
    fused = fuse_and_compare(text, registry, [MergeGroups()])
    assert len(groups(fused)) == 2


def test_split_of_a_group_output_moves_into_the_group(registry):
    text = """graph @g(%x: f32[4, 8], %w: f32[4, 4]) {
      %a = torchloom.fusion_group(%x) : f32[4, 8] region @g0(%p: f32[4, 8]) {
        %e = aten.exp.default(%p) : f32[4, 8]
        return %e
      }
      %s0, %s1 = aten.split.Tensor(%a) {split_size = 4, dim = 1} : f32[4, 4] strided[8, 1], f32[4, 4] strided[8, 1]
      %m = aten.mm.default(%s0, %w) : f32[4, 4]
      %n = aten.mm.default(%s1, %w) : f32[4, 4]
      return %m, %n
    }"""
    fused = fuse_and_compare(text, registry, [MergeGroups()])
    (group,) = groups(fused)
    assert "aten.split.Tensor" in [n.op for n in group.region.nodes]
    assert "aten.split.Tensor" not in [n.op for n in fused.nodes]


def test_output_read_only_for_its_size_becomes_a_constant(registry):
    text = """graph @g(%x: f32[4, 8]) {
      %a, %b = torchloom.fusion_group(%x) : f32[4, 8], f32[4, 8] region @g0(%p: f32[4, 8]) {
        %e = aten.exp.default(%p) : f32[4, 8]
        %n = aten.neg.default(%p) : f32[4, 8]
        return %e, %n
      }
      %s = aten.sym_size.int(%b) {dim = 1} : int
      return %a, %s
    }"""
    fused = fuse_and_compare(text, registry, [MergeGroups()])
    (group,) = groups(fused)
    assert len(group.outputs) == 1
    assert [n.op for n in group.region.nodes] == ["aten.exp.default"]
    const = next(n for n in fused.nodes if n.op == "torchloom.constant")
    assert const.attrs["value"] == 8
