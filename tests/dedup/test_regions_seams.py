"""``dedup.regions`` leaves seams alone: a repeated window that reads about one value
computed outside it per node (an add tree summing values computed just before it) is
not a layer, and a call there would make each of those values a tensor in memory."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.api import CALL_SUBGRAPH, Graph, PassContext, TensorType, verify
from torchloom.testing.programs import FAMILIES, family
from torchloom.tools import build_function, load_plugins
from torchloom_dedup.regions import DedupRegions

REGISTRY = load_plugins().registry
T = TensorType.make((4, 8), torch.float32, "cpu")
UNARY = ["aten.tanh.default", "aten.sigmoid.default", "aten.neg.default", "aten.relu.default"]


def _ctx() -> PassContext:
    return PassContext(registry=REGISTRY)


def fan_blocks(width: int, blocks: int, ops: list[int]) -> Graph:
    """``blocks`` fan-out blocks: ``width`` unary leaves of the carried value (ops picked
    from ``ops`` in turn), summed back by a chain of adds."""
    g = Graph("fan")
    carry = g.add_input(T, "x")
    k = 0
    for _ in range(blocks):
        leaves = []
        for _ in range(width):
            leaves.append(g.create(UNARY[ops[k % len(ops)] % 4], [carry], [T]).output)
            k += 1
        acc = leaves[0]
        for leaf in leaves[1:]:
            acc = g.create("aten.add.Tensor", [acc, leaf], [T]).output
        carry = acc
    g.set_outputs([carry])
    return g


def _computed_inputs(call) -> int:
    return sum(v.producer is not None for v in call.inputs)


def _check_no_seams(graph: Graph, per_input: int = 2) -> int:
    calls = [n for n in graph.nodes if n.op == CALL_SUBGRAPH]
    for call in calls:
        size = len(graph.subgraphs[call.attrs["callee"]])
        assert _computed_inputs(call) * per_input <= size, (call, size)
    return len(calls)


def test_the_add_tree_of_fan_out_blocks_is_a_seam_not_a_region():
    """The generated fan-out family (32 leaves drawn at random, summed by a chain of
    adds): what repeats is the add chain with the leaf before it."""
    graph = family("fanout", 2000).graph()
    result = DedupRegions().run(graph, _ctx())
    assert result.stats["regions"] == 0
    # with the limit lifted, the seam is extracted, and each call reads as many
    # computed values as the region has nodes
    seams = family("fanout", 2000).graph()
    result = DedupRegions(min_nodes_per_input=1).run(seams, _ctx())
    verify(seams, REGISTRY)
    assert result.stats["regions"] >= 1
    calls = [n for n in seams.nodes if n.op == CALL_SUBGRAPH]
    assert all(_computed_inputs(n) == len(seams.subgraphs[n.attrs["callee"]]) for n in calls)


def test_a_layer_that_reads_its_weights_is_still_a_region():
    """Graph inputs (weights) do not count: a block reading the carried value and four
    weights per 8 nodes is extracted."""
    g = Graph("layers")
    carry = g.add_input(T, "x")
    for layer in range(4):
        w = [g.add_input(T, f"w{layer}_{i}") for i in range(4)]
        for i, binary in enumerate(["mul", "add", "sub", "maximum"]):
            op = "aten.maximum.default" if binary == "maximum" else f"aten.{binary}.Tensor"
            carry = g.create(op, [carry, w[i]], [T]).output
            carry = g.create(UNARY[i], [carry], [T]).output
    g.set_outputs([carry])
    result = DedupRegions().run(g, _ctx())
    verify(g, REGISTRY)
    assert (result.stats["regions"], result.stats["occurrences"]) == (1, 4)


@settings(max_examples=30, deadline=None)
@given(width=st.integers(4, 40), blocks=st.integers(2, 8),
       ops=st.lists(st.integers(0, 3), min_size=1, max_size=6))
def test_no_region_reads_more_computed_values_than_half_its_nodes(width, blocks, ops):
    graph = fan_blocks(width, blocks, ops)
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    expected = build_function(graph, REGISTRY).fn(x)
    DedupRegions().run(graph, _ctx())
    verify(graph, REGISTRY)
    _check_no_seams(graph)
    for e, a in zip(expected, build_function(graph, REGISTRY).fn(x)):
        torch.testing.assert_close(a, e)


def test_generated_families_get_no_seam_regions():
    for name in FAMILIES:
        for seed in (0, 1):
            graph = family(name, 2000, seed=seed).graph()
            DedupRegions().run(graph, _ctx())
            _check_no_seams(graph)
