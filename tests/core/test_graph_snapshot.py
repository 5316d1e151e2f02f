"""GraphSnapshot: exact rollback of every kind of edit, and ``changed_since`` (which units
a pass touched) and ``unchanged_regions``, on which ``verify = "each"`` relies to re-check
only those."""

from __future__ import annotations

import pytest

from torchloom.errors import VerifyError
from torchloom.ir.text import parse_graph
from torchloom.ir.verify import verify
from torchloom.ir.snapshot import GraphSnapshot

CALLS = """\
graph @main(%x: f32[4, 8]) {
  %a = torchloom.call_subgraph(%x) {callee = "layer"} : f32[4, 8]
  %b = torchloom.call_subgraph(%a) {callee = "layer"} : f32[4, 8]
  %g = torchloom.fusion_group(%b) : f32[4, 8] region @group0(%p: f32[4, 8]) {
    %s = aten.exp.default(%p) : f32[4, 8]
    return %s
  }
  return %g
}
graph @layer(%p: f32[4, 8]) {
  %s = aten.tanh.default(%p) : f32[4, 8]
  return %s
}
"""


def test_snapshot_restores_every_kind_of_edit():
    text = """\
graph @g(%x: f32[4, 8]) {
  %a = aten.exp.default(%x) : f32[4, 8]
  %e, %r = torchloom.fusion_group(%a, %x) : f32[4, 8], f32[4] region @group0(%p: f32[4, 8], %q: f32[4, 8]) {
    %s = aten.add.Tensor(%p, %q) : f32[4, 8]
    %r = aten.sum.dim_IntList(%s) {dim = [-1]} : f32[4]
    return %s, %r
  }
  %n = aten.neg.default(%e) : f32[4, 8]
  return %n, %r
}
"""
    graph = parse_graph(text)
    snapshot = GraphSnapshot(graph)
    group = graph.first.next
    region = group.region
    region.first.op = "aten.mul.Tensor"            # op changed inside a region
    region.first.inputs.reverse()
    graph.last.with_attrs(alpha=2)                   # attrs swapped
    graph.replace_all_uses(graph.first.output, graph.inputs[0])
    graph.erase(graph.first)                         # node erased
    graph.create("aten.cos.default", [graph.inputs[0]], [graph.inputs[0].type])
    graph.outputs.pop()
    graph.last.meta["note"] = 1
    snapshot.restore()
    assert str(graph) == text
    verify(graph)
    assert graph.last.meta == {} and group.region is region
    snapshot.restore()  # a snapshot restores as often as needed
    assert str(graph) == text


def test_snapshot_restores_shared_subgraphs():
    text = """\
graph @main(%x: f32[4, 8]) {
  %a = torchloom.call_subgraph(%x) {callee = "layer"} : f32[4, 8]
  %b = torchloom.call_subgraph(%a) {callee = "layer"} : f32[4, 8]
  return %b
}
graph @layer(%p: f32[4, 8]) {
  %s = aten.tanh.default(%p) : f32[4, 8]
  return %s
}
"""
    graph = parse_graph(text)
    layer = graph.subgraphs["layer"]
    snapshot = GraphSnapshot(graph)
    layer.first.op = "aten.exp.default"                 # edited inside the subgraph
    graph.subgraphs.pop("layer")                          # and unregistered
    layer.parent = None
    graph.add_subgraph(parse_graph("graph @other(%q: f32[4, 8]) {\n  return %q\n}\n"))
    snapshot.restore()
    assert str(graph) == text
    assert graph.subgraphs == {"layer": layer} and layer.parent is graph
    verify(graph)


def test_changed_since_is_empty_for_an_untouched_graph():
    graph = parse_graph(CALLS)
    assert GraphSnapshot(graph).changed_since(GraphSnapshot(graph)) == set()


def test_an_edit_in_a_subgraph_changes_that_unit_only():
    graph = parse_graph(CALLS)
    before = GraphSnapshot(graph)
    layer = graph.subgraphs["layer"]
    layer.first.op = "aten.sigmoid.default"
    assert GraphSnapshot(graph).changed_since(before) == {layer}


def test_an_edit_inside_a_region_changes_the_graph_that_holds_it():
    graph = parse_graph(CALLS)
    before = GraphSnapshot(graph)
    graph.last.region.first.with_attrs(note=1)
    assert GraphSnapshot(graph).changed_since(before) == {graph}


def test_renames_retypes_and_use_list_edits_count_as_changes():
    graph = parse_graph(CALLS)
    for edit in (lambda g: setattr(g.first.output, "name", "renamed"),
                 lambda g: g.first.output.uses.reverse() or g.first.output.uses.append(
                     g.first.output.uses[0]),
                 lambda g: g.outputs.append(g.inputs[0]),
                 lambda g: g.fresh_name("t")):
        before = GraphSnapshot(graph)
        edit(graph)
        assert GraphSnapshot(graph).changed_since(before) == {graph}
        before.restore()
        assert str(graph) == CALLS


def test_a_new_subgraph_is_changed_and_so_is_the_graph_that_registers_it():
    graph = parse_graph(CALLS)
    before = GraphSnapshot(graph)
    other = graph.add_subgraph(parse_graph("graph @other(%q: f32[4, 8]) {\n  return %q\n}\n"))
    assert GraphSnapshot(graph).changed_since(before) == {graph, other}


NESTED = """\
graph @main(%x: f32[4, 8]) {
  %g = torchloom.fusion_group(%x) : f32[4, 8] region @outer(%p: f32[4, 8]) {
    %h = torchloom.fusion_group(%p) : f32[4, 8] region @inner(%q: f32[4, 8]) {
      %s = aten.exp.default(%q) : f32[4, 8]
      return %s
    }
    return %h
  }
  %k = torchloom.fusion_group(%g) : f32[4, 8] region @other(%r: f32[4, 8]) {
    %t = aten.tanh.default(%r) : f32[4, 8]
    return %t
  }
  %n = aten.neg.default(%k) : f32[4, 8]
  return %n
}
"""


def test_unchanged_regions_are_those_whose_content_and_nested_regions_did_not_change():
    graph = parse_graph(NESTED)
    outer, other = graph.first.region, graph.first.next.region
    inner = outer.first.region
    before = GraphSnapshot(graph)
    graph.last.op = "aten.relu.default"  # the top level only
    assert GraphSnapshot(graph).unchanged_regions(before) == {outer, inner, other}
    before = GraphSnapshot(graph)
    inner.first.op = "aten.sin.default"  # a nested region: its holder changed too
    assert GraphSnapshot(graph).unchanged_regions(before) == {other}
    before = GraphSnapshot(graph)
    other.first.output.name = "renamed"
    assert GraphSnapshot(graph).unchanged_regions(before) == {outer, inner}


def test_verify_skips_the_inside_of_unchanged_regions_but_not_how_they_fit():
    graph = parse_graph(NESTED)
    other = graph.first.next.region
    other.first.inputs.append(other.inputs[0])  # a broken use list inside @other
    with pytest.raises(VerifyError, match="use list"):
        verify(graph)
    verify(graph, unchanged={other})  # told it is unchanged: its inside is not read
    other.inputs.append(other.inputs[0])  # but its signature still is
    with pytest.raises(VerifyError, match="inputs"):
        verify(graph, unchanged={other})
