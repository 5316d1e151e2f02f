"""Importing a 10k-node aot-style FX graph into IR takes under a second on this machine.

The FX graph is built directly (tracing 10k ops would dominate the run): chains of
pointwise ops, keepdim reductions and expands, each node carrying ``meta['val']`` as
aot_autograd leaves it. The time is the best of several rounds, so a busy machine does
not fail the gate; the issue states this target as an absolute bound.
"""

from __future__ import annotations

import time

import torch
import torch.fx

from torchloom.frontend.fx import import_fx
from torchloom.ir import verify
from torchloom.ops.aten import default_registry

NODES = 10_000
MAX_SECONDS = 1.0


def make_fx_graph(nodes: int) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    full, reduced = torch.randn(4, 8), torch.randn(4, 1)
    x.meta["val"] = y.meta["val"] = full
    pointwise = [torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor, torch.ops.aten.sub.Tensor]
    cur, count = x, 0
    while count < nodes:
        if count % 4 == 3:
            cur = g.call_function(torch.ops.aten.sum.dim_IntList, (cur, [1], True))
            cur.meta["val"] = reduced
            cur = g.call_function(torch.ops.aten.expand.default, (cur, [4, 8]))
            cur.meta["val"] = full.expand(4, 8)
            count += 2
        else:
            cur = g.call_function(pointwise[count % 3], (cur, y))
            cur.meta["val"] = full
            count += 1
    g.output((cur,))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_import_10k_node_fx_graph_under_one_second(benchmark):
    gm = make_fx_graph(NODES)
    imported = benchmark.pedantic(import_fx, args=(gm, None), rounds=5, warmup_rounds=1)
    assert len(imported.graph) >= NODES
    verify(imported.graph, default_registry())
    best = benchmark.stats.stats.min
    benchmark.extra_info["best_seconds"] = best
    assert best < MAX_SECONDS, f"importing {NODES} nodes took {best:.2f} s (best of 5)"
