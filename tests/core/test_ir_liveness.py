"""Liveness that counts graph outputs (``torchloom.ir.liveness``, ``Graph.is_dead``): a value
returned by its graph is live though no node reads it, so a rewrite that asks
``is_dead`` instead of ``value.uses`` never trips over ``cannot erase %v: still used``."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchloom.ir import Graph, TensorType, parse_graph, verify
from torchloom.ir.liveness import GraphOutput, dead_nodes, is_dead, is_returned, readers
from torchloom.ops.aten import default_registry

T = TensorType.make([4], "f32")
REGISTRY = default_registry()
OPS = {"aten.neg.default": 1, "aten.exp.default": 1, "aten.add.Tensor": 2,
       "aten.mul.Tensor": 2}


@st.composite
def graphs(draw) -> Graph:
    g = Graph("g")
    values = [g.add_input(T, f"x{i}") for i in range(draw(st.integers(1, 3)))]
    for _ in range(draw(st.integers(1, 14))):
        op = draw(st.sampled_from(sorted(OPS)))
        args = [values[draw(st.integers(0, len(values) - 1))] for _ in range(OPS[op])]
        values.append(g.create(op, args, [T]).output)
    outs = draw(st.lists(st.integers(0, len(values) - 1), min_size=1, max_size=4))
    g.set_outputs([values[i] for i in outs])
    return g


def test_a_returned_value_read_by_no_node_is_live():
    g = parse_graph("""
        graph @g(%x: f32[4]) {
          %s = aten.sigmoid.default(%x) : f32[4]
          %m = aten.mul.Tensor(%x, %s) : f32[4]
          %d = aten.exp.default(%x) : f32[4]
          return %m, %s, %s
        }
    """)
    s, m, d = (n.output for n in g.nodes)
    assert s.uses and not m.uses and not d.uses
    assert [is_dead(v) for v in (s, m, d)] == [False, False, True]
    assert [g.is_dead(v) for v in (s, m, d)] == [False, False, True]
    assert readers(s) == [m.producer, GraphOutput(g, 1), GraphOutput(g, 2)]
    assert readers(d) == [] and readers(m) == [GraphOutput(g, 0)]
    # after %m reads something else, %s is still returned: the trap of issue 43
    g.replace_all_uses(m, d)
    assert dead_nodes([s.producer, m.producer]) == [m.producer]
    with pytest.raises(ValueError, match="still used"):
        g.erase(s.producer)


def test_slots_answer_as_the_outputs_do_and_follow_replace_uses():
    g = parse_graph("""
        graph @g(%x: f32[4]) {
          %a = aten.exp.default(%x) : f32[4]
          %b = aten.neg.default(%x) : f32[4]
          return %a
        }
    """)
    a, b = (n.output for n in g.nodes)
    slots = g.output_slots()
    assert is_returned(a, slots) and not is_returned(b, slots)
    g.replace_uses({a: b}, slots)
    assert is_dead(a, slots) and not is_dead(b, slots) and is_dead(a) and not is_dead(b)


def test_dead_nodes_frees_a_chain_only_up_to_what_escapes():
    g = parse_graph("""
        graph @g(%x: f32[4]) {
          %a = aten.exp.default(%x) : f32[4]
          %b = aten.neg.default(%a) : f32[4]
          %c = aten.mul.Tensor(%b, %b) : f32[4]
          %keep = aten.sin.default(%a) : f32[4]
          return %keep
        }
    """)
    a, b, c, keep = g.nodes
    assert dead_nodes([a, b, c]) == [c, b]  # %a is read by %keep, outside the set
    assert dead_nodes([a, b, c, keep]) == [c, b]  # %keep is returned, so %a stays


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.data())
def test_liveness_agrees_with_erase_on_random_graphs(g, data):
    values = [v for n in g.nodes for v in n.outputs]
    for v in values:  # is_dead is exactly erase's condition
        assert is_dead(v) == g.is_dead(v) == (not v.uses and v not in g.outputs)
        assert (GraphOutput(g, 0) in readers(v)) == (g.outputs[0] is v)
        assert len(readers(v)) == len(v.users()) + g.outputs.count(v)
    nodes = list(g.nodes)
    picked = sorted(data.draw(st.sets(st.integers(0, len(nodes) - 1))))
    chosen = [nodes[i] for i in picked]
    doomed = dead_nodes(chosen, g.output_slots())
    for n in doomed:  # erasable one by one in the order given, users first
        g.erase(n)
    verify(g, REGISTRY)
    left = [n for n in chosen if n.graph is g]
    # what stays is read by something outside the doomed set (a node, or the return)
    assert all(not all(g.is_dead(v) for v in n.outputs) for n in left)
