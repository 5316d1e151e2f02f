"""Differential property test of ``dedup.regions``: random graphs made of a random block
repeated (not always adjacently, with random glue) give what they gave before the pass,
verify, and print/parse back exactly."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchloom.api import (CALL_SUBGRAPH, Graph, PassContext, TensorType, parse_graph, print_graph,
                           verify)
from torchloom.tools import build_function, load_plugins
from torchloom_dedup.regions import DedupRegions

REGISTRY = load_plugins().registry
T = TensorType.make((3, 4), torch.float32, "cpu")
UNARY = ["aten.tanh.default", "aten.sigmoid.default", "aten.neg.default", "aten.abs.default"]
BINARY = ["aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor", "aten.maximum.default"]

# a block step: (op, operand picks); operands index into the values the block has so far
step = st.one_of(
    st.tuples(st.sampled_from(UNARY), st.tuples(st.integers(0, 99))),
    st.tuples(st.sampled_from(BINARY), st.tuples(st.integers(0, 99), st.integers(0, 99))))


def build(block, copies, glue) -> Graph:
    g = Graph("random")
    x, w = g.add_input(T, "x"), g.add_input(T, "w")
    carry, outs = x, []
    for c in range(copies):
        values = [carry, w]
        for op, picks in block:
            node = g.create(op, [values[p % len(values)] for p in picks], [T])
            values.append(node.output)
        carry = values[-1]
        outs.append(values[len(values) // 2])
        if c in glue:  # unrelated nodes between copies
            g.create("aten.exp.default", [w], [T])
            carry = g.create("aten.mul.Tensor", [carry, w], [T]).output
    g.set_outputs([carry, *outs])
    return g


def _short_period(block) -> bool:
    """Whether the block's node tokens (op, and whether a binary op reads one value twice)
    repeat with a period at most a third of its length: DedupRegions documents that it
    does not find such blocks (``[tanh, tanh, tanh]`` copied: a period of 1)."""
    tokens = []
    for k, (op, picks) in enumerate(block):
        n = 2 + k  # values the block has at this step
        tokens.append((op, len({p % n for p in picks})))
    return any(3 * p <= len(tokens) and all(tokens[i] == tokens[i % p] for i in range(len(tokens)))
               for p in range(1, len(tokens)))


def _connected(block) -> bool:
    """Whether the block's nodes are one piece through the values they pass each other or
    the inputs (``carry``, ``w``) they share: DedupRegions leaves other windows alone."""
    root = list(range(len(block)))

    def find(i: int) -> int:
        while root[i] != i:
            i = root[i]
        return i
    reader: dict[int, int] = {}
    for k, (_, picks) in enumerate(block):
        for p in picks:
            value = p % (2 + k)
            other = value - 2 if value >= 2 else reader.setdefault(value, k)
            root[find(k)] = find(other)
    return len({find(k) for k in range(len(block))}) == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block=st.lists(step, min_size=2, max_size=7), copies=st.integers(2, 5),
       glue=st.sets(st.integers(0, 4), max_size=3))
def test_dedup_regions_preserves_results(block, copies, glue):
    graph = build(block, copies, glue)
    torch.manual_seed(0)
    args = [torch.randn(3, 4), torch.randn(3, 4)]
    expected = build_function(graph, REGISTRY).fn(*args)
    result = DedupRegions(min_nodes=2).run(graph, PassContext(registry=REGISTRY))
    verify(graph, REGISTRY)
    calls = [n for n in graph.nodes if n.op == CALL_SUBGRAPH]
    assert result.changed == bool(calls)
    if len(block) >= 2 and not glue and not _short_period(block) and _connected(block):
        assert result.stats["occurrences"] >= 2  # back-to-back copies are always found
    for e, a in zip(expected, build_function(graph, REGISTRY).fn(*args)):
        torch.testing.assert_close(a, e, equal_nan=True)
    assert print_graph(parse_graph(print_graph(graph))) == print_graph(graph)
