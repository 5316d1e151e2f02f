"""fusion.vertical: producer -> consumer fusion, reductions, limits, hazards, determinism."""

from __future__ import annotations

import pytest
import torch

from fusion_testing import example_inputs, fuse_and_compare, groups, run_graph, run_passes
from torchloom.api import parse_graph, print_graph
from torchloom.errors import PipelineError
from torchloom_fusion.vertical import VerticalFusion

CHAIN = """graph @g(%x: f32[4, 8], %y: f32[8]) {
  %s = aten.add.Tensor(%x, %y) : f32[4, 8]
  %e = aten.exp.default(%s) : f32[4, 8]
  %t = aten.tanh.default(%e) : f32[4, 8]
  return %t
}"""


def test_pointwise_chain_is_one_group(registry):
    fused = fuse_and_compare(CHAIN, registry, [VerticalFusion()])
    assert len(groups(fused)) == 1
    assert len(fused) == 1
    assert len(groups(fused)[0].region) == 3


def test_softmax_reductions_over_the_same_rows_share_a_group(registry):
    text = """graph @g(%x: f32[6, 10]) {
      %m = aten.amax.default(%x) {dim = [-1], keepdim = true} : f32[6, 1]
      %s = aten.sub.Tensor(%x, %m) : f32[6, 10]
      %e = aten.exp.default(%s) : f32[6, 10]
      %z = aten.sum.dim_IntList(%e) {dim = [1], keepdim = true} : f32[6, 1]
      %d = aten.div.Tensor(%e, %z) : f32[6, 10]
      return %d
    }"""
    fused = fuse_and_compare(text, registry, [VerticalFusion()])
    assert len(groups(fused)) == 1 and len(groups(fused)[0].region) == 5


def test_reductions_over_different_rows_stay_apart(registry):
    text = """graph @g(%x: f32[6, 10]) {
      %e = aten.exp.default(%x) : f32[6, 10]
      %r = aten.sum.dim_IntList(%e) {dim = [1], keepdim = true} : f32[6, 1]
      %c = aten.sum.dim_IntList(%e) {dim = [0], keepdim = true} : f32[1, 10]
      %a = aten.mul.Tensor(%e, %r) : f32[6, 10]
      %b = aten.mul.Tensor(%a, %c) : f32[6, 10]
      return %b
    }"""
    fused = fuse_and_compare(text, registry, [VerticalFusion()])
    gs = groups(fused)
    assert len(gs) == 2
    for g in gs:
        dims = {n.attrs["dim"] for n in g.region.nodes if n.op == "aten.sum.dim_IntList"}
        assert len(dims) <= 1


def test_opaque_op_is_not_fused_and_work_is_not_duplicated(registry):
    text = """graph @g(%x: f32[4, 4], %w: f32[4, 4]) {
      %e = aten.exp.default(%x) : f32[4, 4]
      %m = aten.mm.default(%e, %w) : f32[4, 4]
      %n = aten.neg.default(%e) : f32[4, 4]
      %a = aten.add.Tensor(%m, %n) : f32[4, 4]
      return %a
    }"""
    fused = fuse_and_compare(text, registry, [VerticalFusion()])
    ops = [n.op for n in fused.walk()]
    assert ops.count("aten.exp.default") == 1 and ops.count("aten.mm.default") == 1
    assert [n.op for n in fused.nodes].count("aten.mm.default") == 1


def test_opaque_op_splits_groups(registry):
    from torchloom.api import OpDef
    registry.register(OpDef("mylib.mystery.default", "opaque"), replace=True)
    text = """graph @g(%x: f32[4]) {
      %e = aten.exp.default(%x) : f32[4]
      %u = mylib.mystery.default(%e) : f32[4]
      %n = aten.neg.default(%u) : f32[4]
      return %n
    }"""
    graph = parse_graph(text)
    run_passes(graph, [VerticalFusion()], registry)
    assert len(groups(graph)) == 2
    assert [n.op for n in graph.nodes].count("mylib.mystery.default") == 1


def _sum_of_inputs(n: int) -> str:
    params = ", ".join(f"%x{i}: f32[16]" for i in range(n))
    lines = ["  %s1 = aten.add.Tensor(%x0, %x1) : f32[16]"]
    lines += [f"  %s{i} = aten.add.Tensor(%s{i - 1}, %x{i}) : f32[16]" for i in range(2, n)]
    return f"graph @g({params}) {{\n" + "\n".join(lines) + f"\n  return %s{n - 1}\n}}"


@pytest.mark.parametrize("limit", [128, 16])
def test_group_never_exceeds_max_group_inputs(registry, limit):
    fused = fuse_and_compare(_sum_of_inputs(200), registry,
                             [VerticalFusion(max_group_inputs=limit)])
    gs = groups(fused)
    assert all(len(g.inputs) <= limit for g in gs)
    assert len(gs) == -(-199 // (limit - 1))  # each later group also reads the previous one
    assert sum(len(g.region) for g in gs) == 199


def test_producer_is_not_moved_past_a_mutation_of_its_input(registry):
    text = """graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
      %c = aten.clone.default(%x) : f32[4, 8]
      %e = aten.exp.default(%c) : f32[4, 8]
      %w = aten.mul_.Tensor(%c, %y) : f32[4, 8]
      %s = aten.sin.default(%w) : f32[4, 8]
      %a = aten.add.Tensor(%e, %s) : f32[4, 8]
      return %a
    }"""
    fused = fuse_and_compare(text, registry, [VerticalFusion()])
    mutation = next(n for n in fused.nodes if n.op == "aten.mul_.Tensor")
    reader = next(g for g in groups(fused)
                  if any(n.op == "aten.exp.default" for n in g.region.nodes))
    fused.renumber()
    assert reader.position < mutation.position


def test_aliasing_view_of_a_group_input_written_in_place_splits(registry):
    text = """graph @g(%x: f32[4, 8], %z: f32[32]) {
      %c = aten.clone.default(%x) : f32[4, 8]
      %v = aten.view.default(%c) {size = [32]} : f32[32]
      %e = aten.exp.default(%c) : f32[4, 8]
      %w = aten.add_.Tensor(%v, %z) : f32[32]
      %s = aten.sin.default(%c) : f32[4, 8]
      %a = aten.add.Tensor(%e, %s) : f32[4, 8]
      return %a
    }"""
    fused = fuse_and_compare(text, registry, [VerticalFusion()])
    for g in groups(fused):
        ops = {n.op for n in g.region.nodes}
        assert not {"aten.exp.default", "aten.sin.default"} <= ops


def test_same_graph_gives_the_same_groups_every_run(registry):
    text = _sum_of_inputs(40).replace("return %s39", "return %s39, %s20")
    printed = set()
    for _ in range(3):
        graph = parse_graph(text)
        run_passes(graph, [VerticalFusion(max_group_inputs=8)], registry)
        printed.add(print_graph(graph))
    assert len(printed) == 1


def test_option_out_of_range_is_rejected_with_the_field_name(tmp_path):
    with pytest.raises(ValueError, match="max_group_inputs"):
        VerticalFusion(max_group_inputs=0)
    from torchloom.tools import Compiler
    toml = tmp_path / "p.toml"
    toml.write_text('[pipeline]\nname = "p"\n\n[[pass]]\nname = "fusion.vertical"\n'
                    'max_group_inputs = 0\n')
    with pytest.raises(PipelineError, match="max_group_inputs"):
        Compiler(str(toml))


def test_graph_output_values_stay_available(registry):
    text = """graph @g(%x: f32[4]) {
      %e = aten.exp.default(%x) : f32[4]
      %n = aten.neg.default(%e) : f32[4]
      return %e, %n
    }"""
    fused = fuse_and_compare(text, registry, [VerticalFusion()])  # compares both outputs
    assert len(groups(fused)) == 1 and len(groups(fused)[0].outputs) == 2
    inputs = example_inputs(fused)
    torch.testing.assert_close(run_graph(fused, registry, inputs)[0], inputs[0].exp())


def test_no_merge_around_an_opaque_node_on_a_path_between(registry):
    """exp -> mm -> add and exp -> add: merging exp into add's group would need the mm
    both before and after the group (a cycle); the verifier would reject it."""
    text = """graph @g(%x: f32[4, 4]) {
      %e = aten.exp.default(%x) : f32[4, 4]
      %m = aten.mm.default(%e, %e) : f32[4, 4]
      %a = aten.add.Tensor(%e, %m) : f32[4, 4]
      return %a
    }"""
    fused = fuse_and_compare(text, registry, [VerticalFusion()])
    assert [n.op for n in fused.nodes] == ["torchloom.fusion_group", "aten.mm.default",
                                           "torchloom.fusion_group"]
