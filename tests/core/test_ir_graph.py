"""The graph edit API: insert, erase, replace_all_uses, move_before/move_after, clone."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.errors import VerifyError
from torchloom.ir import Graph, TensorType, clone_graph, parse_graph, print_graph, verify
from torchloom.ops.aten import default_registry

T = TensorType.make([4], "f32")

CHAIN = """\
graph @chain(%x: f32[4]) {
  %a = aten.neg.default(%x) : f32[4]
  %b = aten.exp.default(%x) : f32[4]
  %c = aten.add.Tensor(%a, %b) : f32[4]
  %d = aten.sin.default(%x) : f32[4]
  return %c, %d
}
"""


def nodes_by_name(g: Graph) -> dict:
    return {n.outputs[0].name: n for n in g.nodes}


def order(g: Graph) -> list[str]:
    return [n.outputs[0].name for n in g.nodes]


def test_create_insert_before_after_and_positions():
    g = Graph("g")
    x = g.add_input(T, "x")
    last = g.create("aten.neg.default", [x], [T], names=["last"])
    first = g.create("aten.exp.default", [x], [T], names=["first"], before=last)
    mid = g.create("aten.sin.default", [x], [T], names=["mid"], after=first)
    g.set_outputs([last.output, mid.output])
    assert order(g) == ["first", "mid", "last"]
    assert len(g) == 3 and x.uses == [last, first, mid]
    g.renumber()
    assert [n.position for n in g.nodes] == [0, 1, 2]
    verify(g, default_registry())


def test_create_rejects_wrong_number_of_names():
    g = Graph("g")
    x = g.add_input(T, "x")
    with pytest.raises(ValueError, match="2 names for 1 output"):
        g.create("aten.neg.default", [x], [T], names=["a", "b"])
    assert len(g) == 0 and x.uses == []


def test_fresh_names_never_collide():
    g = Graph("g")
    x = g.add_input(T, "x")
    names = [g.create("aten.neg.default", [x], [T], names=["x"]).output.name for _ in range(3)]
    assert len(set(names + ["x"])) == 4
    assert all(n.startswith("x_") for n in names)


def test_erase_unused_node_and_reject_used_or_foreign():
    g = parse_graph(CHAIN)
    n = nodes_by_name(g)
    with pytest.raises(ValueError, match="still used"):
        g.erase(n["a"])  # read by %c
    with pytest.raises(ValueError, match="still used"):
        g.erase(n["d"])  # a graph output
    other = parse_graph(CHAIN)
    with pytest.raises(ValueError, match="not in graph"):
        g.erase(nodes_by_name(other)["c"])
    g.replace_all_uses(n["d"].output, n["b"].output)
    g.erase(n["d"])
    assert order(g) == ["a", "b", "c"] and len(g) == 3
    assert g.inputs[0].uses == [n["a"], n["b"]]
    assert g.outputs[1] is n["b"].output
    verify(g, default_registry())


def test_replace_all_uses_rewires_every_slot_and_outputs():
    g = parse_graph(CHAIN)
    n = nodes_by_name(g)
    x = g.inputs[0]
    count = g.replace_all_uses(x, n["a"].output)  # %b and %d now read %a (and %a itself)
    assert count == 3
    # reading its own output is a cycle: move %a's input back to %x to keep the graph valid
    n["a"].set_input(0, x)
    assert x.uses == [n["a"]]
    assert n["a"].output.uses.count(n["b"]) == 1 and n["d"] in n["a"].output.uses
    verify(g, default_registry())


def test_replace_all_uses_with_itself_keeps_uses():
    g = parse_graph(CHAIN)
    x = g.inputs[0]
    uses = list(x.uses)
    assert g.replace_all_uses(x, x) == 0
    assert x.uses == uses
    verify(g)


def test_move_before_valid_and_invalid():
    g = parse_graph(CHAIN)
    n = nodes_by_name(g)
    g.move_before(n["d"], n["a"])  # %d only reads %x: may go first
    assert order(g) == ["d", "a", "b", "c"]
    g.move_before(n["b"], n["a"])
    assert order(g) == ["d", "b", "a", "c"]
    verify(g)
    assert g.can_move_before(n["c"], n["a"]) is not None
    with pytest.raises(VerifyError, match="input %a is defined at or after"):
        g.move_before(n["c"], n["a"])  # %c reads %a
    with pytest.raises(VerifyError, match="would come before it"):
        g.move_after(n["a"], n["c"])  # to the end: %c reads %a
    assert order(g) == ["d", "b", "a", "c"]  # a rejected move changes nothing
    g.move_before(n["a"], n["a"])
    assert order(g) == ["d", "b", "a", "c"]
    verify(g)


def test_move_after_last_node_checks_users():
    g = parse_graph(CHAIN)
    n = nodes_by_name(g)
    with pytest.raises(VerifyError, match="would come before it"):
        g.move_after(n["a"], n["d"])  # %c reads %a, so %a cannot become the last node
    assert order(g) == ["a", "b", "c", "d"]
    g.move_after(n["c"], n["d"])
    assert order(g) == ["a", "b", "d", "c"]
    g.move_after(n["b"], n["a"])  # already there
    assert order(g) == ["a", "b", "d", "c"]
    verify(g)


def test_move_rejects_nodes_of_another_graph():
    g = parse_graph(CHAIN)
    other = parse_graph(CHAIN)
    with pytest.raises(VerifyError, match="not in graph"):
        g.move_before(nodes_by_name(other)["d"], nodes_by_name(g)["a"])
    with pytest.raises(VerifyError, match="not in graph"):
        g.move_before(nodes_by_name(g)["d"], nodes_by_name(other)["a"])
    assert order(g) == order(other) == ["a", "b", "c", "d"]


def test_insert_rejects_anchor_of_another_graph():
    g = parse_graph(CHAIN)
    other = parse_graph(CHAIN)
    with pytest.raises(ValueError, match="not in graph"):
        g.create("aten.cos.default", [g.inputs[0]], [T], before=nodes_by_name(other)["a"])
    assert len(g) == 4 and len(other) == 4
    verify(g)


def test_clone_is_deep_and_independent():
    text = """\
graph @g(%x: f32[4]) {
  %y = torchloom.fusion_group(%x) : f32[4] region @r(%a: f32[4]) {
    %b = aten.neg.default(%a) : f32[4]
    return %b
  }
  return %y
}
"""
    g = parse_graph(text)
    c, mapping = clone_graph(g)
    assert print_graph(c) == text
    assert mapping[g.inputs[0]] is c.inputs[0]
    node = next(c.nodes)
    assert node.region is not next(g.nodes).region and node.region.owner is node
    node.with_attrs(tag=1)
    assert "tag" not in next(g.nodes).attrs
    verify(c)
    # fresh names in the clone do not collide with the copied ones
    new = c.create("aten.neg.default", [c.inputs[0]], [T], names=["y"])
    assert new.output.name != "y"


def test_name_hints_become_names_the_parser_reads_back():
    g = Graph("g")
    x = g.add_input(T, "größe")  # non-ASCII letters are not in the text form's names
    y = g.create("aten.neg.default", [x], [T], names=["a.b-c"]).output
    g.set_outputs([y])
    assert x.name == "gr__e" and y.name == "a_b_c"
    assert print_graph(parse_graph(print_graph(g))) == print_graph(g)


def test_moving_nodes_between_graphs_claims_names_and_keeps_use_lists():
    g = parse_graph(CHAIN)
    a, b, c, d = g.nodes
    region = Graph("r")
    p = region.add_input(T, "a")  # the name %a is taken in the region
    region.move_node(a, None)  # from the graph to the front of the region
    assert a.graph is region and a.output.graph is region and a.output.name != "a"
    assert len(g) == 3 and len(region) == 1 and list(region.nodes) == [a]
    assert a in g.inputs[0].uses  # use lists are the caller's to keep
    g.move_node(d, None)  # within a graph: names stay
    assert order(g) == ["d", "b", "c"]
    g.detach(b)
    assert b.graph is None and order(g) == ["d", "c"] and len(g) == 2
    region.release_name(p.name)
    assert region.fresh_name("a") == "a"
    region.reset_names(["x"])
    assert region.fresh_name("x") != "x" and region.fresh_name("a") == "a"


def test_replace_uses_rewrites_many_values_and_the_outputs_once():
    g = parse_graph(CHAIN)
    a, b, c, d = g.nodes
    assert g.replace_uses({b.output: a.output, d.output: a.output}) == 2  # c, an output
    assert c.inputs == [a.output, a.output] and g.outputs == [c.output, a.output]
    assert not b.output.uses and a.output.uses.count(c) == 2
    g.erase_many([b, d])
    verify(g)


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=0, max_size=4), data=st.data())
def test_is_dense_agrees_with_torch_is_contiguous(shape, data):
    """TensorType.is_dense (plain constructor: strides as given, not normalized) is torch's
    is_contiguous: row-major without gaps, size-1 dims carrying any stride."""
    import torch
    strides = data.draw(st.one_of(
        st.just(None),
        st.just(list(torch.empty(shape).stride())),
        st.lists(st.integers(0, 40), min_size=len(shape), max_size=len(shape))))
    t = TensorType(tuple(shape), "f32", "cpu", None if strides is None else tuple(strides))
    storage = torch.empty(1 + sum((d - 1) * s for d, s in zip(shape, strides or ())))
    expected = True if strides is None else storage.as_strided(shape, strides).is_contiguous()
    assert t.is_dense == expected


@settings(max_examples=200, deadline=None)
@given(a=st.lists(st.integers(1, 4), min_size=0, max_size=4),
       b=st.lists(st.integers(1, 4), min_size=0, max_size=4))
def test_squeezed_shapes_agree_exactly_when_one_reshapes_to_the_other_by_unit_dims(a, b):
    """TensorType.squeezed_shape is the shape without its size-1 dims: two shapes squeeze
    alike exactly when torch's squeeze of one and the other give the same shape."""
    import torch
    ta, tb = TensorType.make(a, "f32"), TensorType.make(b, "f32")
    same = torch.empty(a).squeeze().shape == torch.empty(b).squeeze().shape
    assert (ta.squeezed_shape() == tb.squeezed_shape()) == same
    assert TensorType.make([3, 1, "s0", 1], "f32").squeezed_shape() == (3, "s0")
