"""Region surgery (``torchloom.ir.regions``): after any sequence of wraps, absorbs, merges
and edits of a region node's inputs and outputs, every value's uses are exactly the nodes
reading it, the verifier passes, and the graph computes what it computed before."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchloom.ir import Graph, Node, TensorType, Value, parse_graph, verify
from torchloom.ir.graph import FUSION_GROUP
from torchloom.ir.regions import (RegionEditor, add_region_input, remove_region_input,
                                  select_region_inputs, select_region_outputs)
from torchloom.ops.aten import default_registry

T = TensorType.make([4], "f32")
REGISTRY = default_registry()
UNARY = {"aten.neg.default": torch.neg, "aten.exp.default": torch.exp,
         "aten.sin.default": torch.sin}
BINARY = {"aten.add.Tensor": torch.add, "aten.mul.Tensor": torch.mul}
OPS = {**UNARY, **BINARY}


# ---- random graphs, and what they compute -----------------------------------------------
@st.composite
def graphs(draw) -> Graph:
    g = Graph("g")
    values = [g.add_input(T, f"x{i}") for i in range(draw(st.integers(1, 3)))]
    for _ in range(draw(st.integers(2, 12))):
        op = draw(st.sampled_from(sorted(OPS)))
        arity = 1 if op in UNARY else 2
        args = [values[draw(st.integers(0, len(values) - 1))] for _ in range(arity)]
        values.append(g.create(op, args, [T]).output)
    outs = draw(st.lists(st.integers(0, len(values) - 1), min_size=1, max_size=4))
    g.set_outputs([values[i] for i in outs])
    return g


def run(g: Graph, args: list[torch.Tensor]) -> list[torch.Tensor]:
    env: dict[Value, torch.Tensor] = dict(zip(g.inputs, args))
    for n in g.nodes:
        ins = [env[v] for v in n.inputs]
        outs = run(n.region, ins) if n.region is not None else [OPS[n.op](*ins)]
        env.update(zip(n.outputs, outs))
    return [env[v] for v in g.outputs]


def check_uses(g: Graph) -> None:
    """Every value's use list holds exactly one entry per input slot reading it."""
    values = list(g.inputs)
    readers: Counter = Counter()
    for n in g.nodes:
        values.extend(n.outputs)
        readers.update((id(v), id(n)) for v in n.inputs)
        for i, v in enumerate(n.outputs):
            assert v.producer is n and v.index == i and v.graph is g
        if n.region is not None:
            check_uses(n.region)
    for v in values:
        assert Counter((id(v), id(u)) for u in v.uses) == \
            Counter({k: c for k, c in readers.items() if k[0] == id(v)}), v


def check(g: Graph, args, expected) -> None:
    check_uses(g)
    verify(g, REGISTRY)
    for got, want in zip(run(g, args), expected, strict=True):
        torch.testing.assert_close(got, want, equal_nan=True)  # (exp overflows: sin(inf) is NaN)


# ---- legal moves (the caller's rule: keep the order topological) ------------------------
def live_readers(v: Value) -> list[Node]:
    return [u for u in v.uses if u.graph is v.graph]


def slot_b_ok(g: Graph, a: Node, b: Node) -> bool:
    """Every reader of a's outputs other than b comes after b."""
    return all(u is b or u.position > b.position for v in a.outputs for u in live_readers(v))


def slot_a_ok(g: Graph, a: Node, b: Node) -> bool:
    """Every input of b not made by a is defined before a."""
    return all(v.producer is None or v.producer is a or v.producer.position < a.position
               for v in b.inputs)


def is_group(n: Node) -> bool:
    return n.op == FUSION_GROUP


def edit_step(g: Graph, edit: RegionEditor, kind: int, i: int, j: int, first: bool) -> None:
    g.renumber()
    nodes = list(g.nodes)
    if kind == 0:  # wrap a plain node
        plain = [n for n in nodes if not is_group(n)]
        if plain:
            edit.wrap(plain[i % len(plain)])
        return
    groups = [n for n in nodes if is_group(n)]
    if not groups:
        return
    if kind == 1:  # absorb a plain producer of a group's input
        group = groups[i % len(groups)]
        producers = [v.producer for v in group.inputs
                     if v.producer is not None and not is_group(v.producer)]
        if not producers:
            return
        p = producers[j % len(producers)]
        slots = [s for s, ok in ((group, slot_b_ok(g, p, group)), (p, slot_a_ok(g, p, group)))
                 if ok]
        if slots:
            edit.absorb(p, group, at=slots[0] if first else slots[-1])
        return
    if len(groups) < 2:  # merge two groups
        return
    a, b = groups[i % len(groups)], groups[j % len(groups)]
    if a is b:
        return
    if a.position > b.position:
        a, b = b, a
    slots = [s for s, ok in ((b, slot_b_ok(g, a, b)), (a, slot_a_ok(g, a, b))) if ok]
    if slots:
        edit.merge(a, b, at=slots[0] if first else slots[-1])


def trim_step(g: Graph, kind: int, i: int, j: int) -> None:
    """One-off edits of a group's inputs and outputs (use lists exact at once)."""
    groups = [n for n in g.nodes if is_group(n)]
    if not groups:
        return
    group = groups[i % len(groups)]
    region = group.region
    if kind == 0:  # reorder the inputs, dropping unread parameters
        keep = [k for k, p in enumerate(region.inputs) if p.uses or p in region.outputs]
        select_region_inputs(group, keep[j % len(keep):] + keep[:j % len(keep)] if keep else [])
    elif kind == 1:  # pass one more (earlier) value, read by nothing inside: then drop it
        g.renumber()
        earlier = list(g.inputs) + [v for n in g.nodes if n.position < group.position
                                    for v in n.outputs]
        inner = add_region_input(group, earlier[j % len(earlier)], "extra")
        assert group.inputs[-1] is earlier[j % len(earlier)] and region.inputs[-1] is inner
        if j % 2:
            remove_region_input(group, len(group.inputs) - 1)
    else:  # drop outputs read by no one (keeping at least one)
        returned = set(g.outputs)
        keep = [k for k, v in enumerate(group.outputs) if v.uses or v in returned]
        if keep and len(keep) < len(group.outputs):
            select_region_outputs(group, keep)


steps = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 50), st.integers(0, 50),
                           st.booleans()), max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=graphs(), batches=st.lists(st.tuples(steps, steps), min_size=1, max_size=3))
def test_any_sequence_of_region_edits_keeps_uses_exact_and_the_graph_valid(g, batches):
    torch.manual_seed(0)
    args = [torch.randn(4) for _ in g.inputs]
    expected = run(g, args)
    nodes_before = Counter(n.op for n in g.walk() if not is_group(n))
    for edits, trims in batches:
        with RegionEditor(g) as edit:
            for kind, i, j, first in edits:
                edit_step(g, edit, kind, i, j, first)
        check(g, args, expected)
        for kind, i, j, _ in trims:
            trim_step(g, kind, i, j)
            check(g, args, expected)
    assert Counter(n.op for n in g.walk() if not is_group(n)) == nodes_before


# ---- the operations one by one ------------------------------------------------------------
CHAIN = """\
graph @g(%x: f32[4], %y: f32[4]) {
  %a = aten.exp.default(%x) : f32[4]
  %b = aten.add.Tensor(%a, %y) : f32[4]
  %c = aten.neg.default(%b) : f32[4]
  %d = aten.mul.Tensor(%a, %c) : f32[4]
  return %d, %b
}
"""


def test_wrap_puts_a_node_alone_in_a_group_in_its_place():
    g = parse_graph(CHAIN)
    a, b, c, d = g.nodes
    with RegionEditor(g) as edit:
        group = edit.wrap(b)
    assert list(g.nodes) == [a, group, c, d] and list(group.region.nodes) == [b]
    assert group.inputs == [a.output, g.inputs[1]] and g.outputs[1] is group.output
    assert c.inputs == [group.output] and b.graph is group.region
    assert Counter(a.output.uses) == Counter([group, d]) and g.inputs[1].uses == [group]
    verify(g, REGISTRY)


def test_uses_are_swept_when_the_editor_closes_and_not_before():
    g = parse_graph(CHAIN)
    a, b, c, d = g.nodes
    edit = RegionEditor(g)
    edit.wrap(b)
    assert b in a.output.uses  # stale: b moved into the region
    edit.close()
    assert b not in a.output.uses
    verify(g, REGISTRY)


def test_absorb_exports_what_is_still_read_outside_and_may_move_the_group_up():
    g = parse_graph(CHAIN)
    a, b, c, d = g.nodes
    with RegionEditor(g) as edit:
        group = edit.wrap(c)
        exported = edit.absorb(b, group, at=group)  # %b is read by no one else: slot c
        assert list(exported) == [b.output] and g.outputs[1] is exported[b.output]
        exported = edit.absorb(a, group, at=a)  # %a is also read by %d: exported
    assert list(g.nodes) == [group, d] and list(group.region.nodes) == [a, b, c]
    assert d.inputs == [exported[a.output], group.outputs[0]]
    assert group.inputs == list(g.inputs)
    verify(g, REGISTRY)


def test_merge_moves_the_smaller_region_and_drops_outputs_read_only_inside():
    g = parse_graph(CHAIN)
    a, b, c, d = g.nodes
    with RegionEditor(g) as edit:
        ga, gc = edit.wrap(a), edit.wrap(c)
        ga = edit.merge(ga, edit.wrap(b), at=ga)  # %b: one node each; a hosts
        merged = edit.merge(ga, gc, at=gc)
    assert merged is ga and list(g.nodes) == [ga, d]
    assert list(ga.region.nodes) == [a, b, c]
    # %a is read by %d, %b is returned: both stay outputs; %c joins them
    assert [v.name for v in ga.outputs] == ["a", "b", "c"] and d.inputs == [ga.outputs[0],
                                                                         ga.outputs[2]]
    verify(g, REGISTRY)


def test_dropping_a_read_parameter_or_output_is_refused():
    g = parse_graph(CHAIN)
    with RegionEditor(g) as edit:
        group = edit.wrap(list(g.nodes)[1])
    with pytest.raises(ValueError, match="is read"):
        remove_region_input(group, 0)
    with pytest.raises(ValueError, match="still read"):
        select_region_outputs(group, [])
    with pytest.raises(ValueError, match="repeat"):
        select_region_inputs(group, [0, 0])
    verify(g, REGISTRY)


def test_replace_uses_with_an_output_index_redirects_outputs_and_keeps_the_index():
    g = parse_graph(CHAIN)
    a, b, c, d = g.nodes
    slots = g.output_slots()
    e = g.create("aten.sin.default", [g.inputs[0]], [T], before=a)
    assert g.replace_uses({b.output: e.output}, slots) == 2  # %c reads it, and a return
    assert g.outputs[1] is e.output and slots == {d.output: [0], e.output: [1]}
    assert c.inputs == [e.output] and b.output.uses == [] and e.output.uses == [c]
