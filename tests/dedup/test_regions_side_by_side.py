"""``dedup.regions`` leaves runs of unrelated ops alone: a decomposed ``_foreach_*`` op
(one op per tensor, then the next op's run) repeats, but a call of it would cut every
tensor's chain into pieces that fusion could no longer join."""

from __future__ import annotations

import pytest
import torch

from torchloom.api import CALL_SUBGRAPH, Graph, PassContext, TensorType, verify
from torchloom.tools import build_function, load_plugins
from torchloom_dedup.regions import DedupRegions

REGISTRY = load_plugins().registry


def _op_major(count: int, ops: list[str], shapes) -> Graph:
    """``count`` independent chains ``x_i -> ops[0] -> ops[1] ...`` written op by op, as
    aot_autograd traces a decomposed foreach step (every ``ops[0]`` first)."""
    g = Graph("foreach")
    types = [TensorType.make(shapes[i % len(shapes)], torch.float32, "cpu") for i in range(count)]
    values = [g.add_input(t, f"x{i}") for i, t in enumerate(types)]
    for op in ops:
        values = [g.create(op, [v], [t]).output for v, t in zip(values, types)]
    g.set_outputs(values)
    return g


@pytest.mark.parametrize("count", [8, 12, 30])
@pytest.mark.parametrize("shapes", [[(4,)], [(4,), (2, 3), (5, 1)]])
def test_runs_of_unrelated_ops_make_no_region(count, shapes):
    # two runs of `neg` with a run of `tanh` between: the runs repeat, with equal wiring
    graph = _op_major(count, ["aten.neg.default", "aten.tanh.default", "aten.neg.default",
                              "aten.tanh.default"], shapes)
    args = [torch.randn(v.type.shape) for v in graph.inputs]
    expected = build_function(graph, REGISTRY).fn(*args)
    result = DedupRegions(min_nodes=2).run(graph, PassContext(registry=REGISTRY))
    verify(graph, REGISTRY)
    assert not result.changed and result.stats["regions"] == 0
    assert not [n for n in graph.nodes if n.op == CALL_SUBGRAPH]
    for e, a in zip(expected, build_function(graph, REGISTRY).fn(*args)):
        torch.testing.assert_close(a, e)


def test_the_same_chains_written_chain_by_chain_are_found():
    # the same computation in chain order: each chain is one piece, repeated
    g = Graph("chains")
    t = TensorType.make((4,), torch.float32, "cpu")
    outs = []
    for i in range(6):
        v = g.add_input(t, f"x{i}")
        for op in ["aten.neg.default", "aten.tanh.default"] * 2:
            v = g.create(op, [v], [t]).output
        outs.append(v)
    g.set_outputs(outs)
    result = DedupRegions(min_nodes=2).run(g, PassContext(registry=REGISTRY))
    verify(g, REGISTRY)
    assert result.stats["occurrences"] >= 6
