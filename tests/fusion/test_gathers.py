"""Gathers (``GATHER_OPS``: an embedding) join groups where the cpu codegen compiles them
(``PassContext.codegen``), never with the nodes computing their indices, and stay plain
ops for any other codegen."""

from __future__ import annotations

import pytest
from fusion_testing import groups, plugin_registry
from torchloom.api import PassContext, parse_graph
from torchloom_fusion.horizontal import HorizontalFusion
from torchloom_fusion.vertical import VerticalFusion

GRAPH = """
graph @g(%w: f32[32, 4], %p: f32[100, 4], %q: i64[6], %k: i64[6], %m: f32[4, 6, 6], %ids: i64[2, 6]) {
  %d = aten.sub.Tensor(%q, %k) : i64[6]
  %a = aten.abs.default(%d) : i64[6]
  %b = aten.clamp.default(%a) {max = 31} : i64[6]
  %e = aten.embedding.default(%w, %b) : f32[6, 4]
  %t = aten.t.default(%e) : f32[4, 6]
  %u = aten.unsqueeze.default(%t) {dim = 2} : f32[4, 6, 1]
  %y = aten.add.Tensor(%u, %m) : f32[4, 6, 6]
  %x = aten.embedding.default(%p, %ids) : f32[2, 6, 4]
  %z = aten.tanh.default(%x) : f32[2, 6, 4]
  return %y, %z
}
"""


def _fused(codegen):
    graph = parse_graph(GRAPH)
    ctx = PassContext(registry=plugin_registry(), codegen=codegen)
    VerticalFusion().run(graph, ctx)
    HorizontalFusion().run(graph, ctx)
    return graph


def test_gathers_join_their_readers_not_their_indices():
    graph = _fused("cpu")
    inside = [[n.op.split(".")[1] for n in g.region.nodes] for g in groups(graph)]
    with_gather = [ops for ops in inside if "embedding" in ops]
    assert sorted(map(sorted, with_gather)) == [["add", "embedding", "t", "unsqueeze"],
                                                 ["embedding", "tanh"]]
    bucket = [ops for ops in inside if "embedding" not in ops]
    assert bucket == [["sub", "abs", "clamp"]]  # its output is the gather's indices


@pytest.mark.parametrize("codegen", [None, "eager", "triton", "scalar_c"])
def test_gathers_stay_plain_ops_for_other_codegens(codegen):
    graph = _fused(codegen)
    plain = [n.op for n in graph.nodes if n.region is None]
    assert plain.count("aten.embedding.default") == 2
    assert all("embedding" not in n.op for g in groups(graph) for n in g.region.nodes)


@pytest.mark.parametrize("table", ["0, 4", "5, 0"])
def test_a_gather_of_an_empty_table_stays_a_plain_op(table):
    """Eager raises its own errors for a table without rows or columns: left to it."""
    width = table.split(", ")[1]
    graph = parse_graph(f"""
graph @g(%w: f32[{table}], %ids: i64[2, 6]) {{
  %x = aten.embedding.default(%w, %ids) : f32[2, 6, {width}]
  %z = aten.tanh.default(%x) : f32[2, 6, {width}]
  return %z
}}
""")
    ctx = PassContext(registry=plugin_registry(), codegen="cpu")
    VerticalFusion().run(graph, ctx)
    plain = [n.op for n in graph.nodes if n.region is None]
    assert "aten.embedding.default" in plain
    assert all("embedding" not in n.op for g in groups(graph) for n in g.region.nodes)
