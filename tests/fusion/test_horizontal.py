"""fusion.horizontal: siblings that read the same value merge into one group."""

from __future__ import annotations

from fusion_testing import fuse_and_compare, groups
from torchloom_fusion.horizontal import HorizontalFusion
from torchloom_fusion.vertical import VerticalFusion

SIBLINGS = """graph @g(%x: f32[8, 32], %w: f32[32, 32]) {
  %a = aten.sigmoid.default(%x) : f32[8, 32]
  %m = aten.mm.default(%x, %w) : f32[8, 32]
  %b = aten.tanh.default(%x) : f32[8, 32]
  %c = aten.add.Tensor(%m, %b) : f32[8, 32]
  return %a, %c
}"""


def test_siblings_sharing_an_input_merge(registry):
    vertical_only = fuse_and_compare(SIBLINGS, registry, [VerticalFusion()])
    assert len(groups(vertical_only)) == 2
    fused = fuse_and_compare(SIBLINGS, registry, [VerticalFusion(), HorizontalFusion()])
    (group,) = groups(fused)
    assert {n.op for n in group.region.nodes} == {"aten.sigmoid.default", "aten.tanh.default",
                                                  "aten.add.Tensor"}
    assert group.inputs.count(fused.inputs[0]) == 1  # the shared value is read once


def test_only_nodes_sharing_a_value_merge_horizontally(registry):
    text = """graph @g(%x: f32[8, 32], %y: f32[8, 32], %u: f32[8, 32], %v: f32[8, 32]) {
      %i = aten.sigmoid.default(%x) : f32[8, 32]
      %f = aten.sigmoid.default(%y) : f32[8, 32]
      %c = aten.tanh.default(%u) : f32[8, 32]
      %o = aten.sigmoid.default(%v) : f32[8, 32]
      %m = aten.cumsum.default(%c) {dim = 1} : f32[8, 32]
      %n = aten.cumsum.default(%o) {dim = 1} : f32[8, 32]
      %s = aten.add.Tensor(%i, %x) : f32[8, 32]
      %t = aten.add.Tensor(%f, %x) : f32[8, 32]
      return %m, %n, %s, %t
    }"""
    fused = fuse_and_compare(text, registry, [VerticalFusion(), HorizontalFusion()])
    # i, f, s, t share %x; c and o share nothing with them and stay apart
    sizes = sorted(len(g.region) for g in groups(fused))
    assert sizes == [1, 1, 4]


def test_siblings_with_a_path_between_them_do_not_merge(registry):
    text = """graph @g(%x: f32[8, 8]) {
      %a = aten.exp.default(%x) : f32[8, 8]
      %m = aten.mm.default(%a, %a) : f32[8, 8]
      %b = aten.add.Tensor(%x, %m) : f32[8, 8]
      return %b
    }"""
    fused = fuse_and_compare(text, registry, [VerticalFusion(), HorizontalFusion()])
    assert len(groups(fused)) == 2


def test_siblings_over_different_spaces_do_not_merge(registry):
    text = """graph @g(%x: f32[4, 8, 32], %w: f32[32, 32]) {
      %a = aten.exp.default(%x) : f32[4, 8, 32]
      %r = aten.sum.dim_IntList(%x) {dim = [2], keepdim = true} : f32[4, 8, 1]
      %m = aten.matmul.default(%a, %w) : f32[4, 8, 32]
      %c = aten.sum.dim_IntList(%x) {dim = [0], keepdim = true} : f32[1, 8, 32]
      return %m, %r, %c
    }"""
    fused = fuse_and_compare(text, registry, [VerticalFusion(), HorizontalFusion()])
    for g in groups(fused):
        dims = {n.attrs["dim"] for n in g.region.nodes if n.op == "aten.sum.dim_IntList"}
        assert len(dims) <= 1


def test_row_and_column_sums_of_one_tensor_merge(registry):
    """The layer-norm backward pattern: one kernel reads x once for both (issue 15)."""
    text = """graph @g(%x: f32[8, 32], %w: f32[32, 32]) {
      %a = aten.exp.default(%x) : f32[8, 32]
      %r = aten.sum.dim_IntList(%x) {dim = [1], keepdim = true} : f32[8, 1]
      %m = aten.mm.default(%a, %w) : f32[8, 32]
      %c = aten.sum.dim_IntList(%x) {dim = [0], keepdim = true} : f32[1, 32]
      return %m, %r, %c
    }"""
    fused = fuse_and_compare(text, registry, [VerticalFusion(), HorizontalFusion()])
    dims = [{n.attrs["dim"] for n in g.region.nodes if n.op == "aten.sum.dim_IntList"}
            for g in groups(fused)]
    assert {(0,), (1,)} in [{tuple(d) for d in ds} for ds in dims]
