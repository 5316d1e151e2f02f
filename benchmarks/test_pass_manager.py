"""Pass-manager overhead per no-op pass, and verify(), on 10k- and 50k-node graphs.

Gate: both are linear in graph size, i.e. time(50k) / time(10k) <= 8 (5 is exact linearity;
a quadratic step shows as 25). The no-op pass is memory-bound (a snapshot of every node),
and on the shared 2-core machine the same code measured 4.9 to 6.3 alone and up to 7.3
beside a running test session. Sizes are timed in interleaved rounds, in CPU time of this
process (other processes on a busy machine do not count), and the minimum of each is kept.
The 10k time is the mean over five different 10k graphs visited in turn: 50k nodes of live
objects, like the 50k graph, so that both sizes run in the same CPU-cache regime and the
ratio measures the algorithm (a quadratic step shows up as 25x), not the point where one
graph stops fitting in the cache.
The pass manager takes a snapshot after every pass (the next pass's rollback point); that
snapshot is what the no-op pass measures.
"""

from __future__ import annotations

import json
import sys
import time
from typing import ClassVar

import attrs
import pytest
import torch
from timing import gc_paused, in_fresh_interpreter

from torchloom.ir.graph import Graph
from torchloom.ir.types import TensorType
from torchloom.ir.verify import verify
from torchloom.passes.base import Pass, PassContext, PassResult
from torchloom.passes.manager import PassManager
from torchloom.passes.pipeline import PassStep, Pipeline
from torchloom.plugins.loader import load_plugins

SMALL, LARGE = 10_000, 50_000
NOOP_PASSES = 5
MAX_RATIO = 8.0


@attrs.frozen
class NoOp(Pass):
    """Looks at nothing, changes nothing: what remains is the manager's own cost."""

    name: ClassVar[str] = "bench.noop"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        return PassResult(False)


def make_graph(n: int) -> Graph:
    """``n`` pointwise nodes in a chain; every third also reads a value a few nodes back,
    every seventh reads its input twice (bounded fan-out, like real aten graphs)."""
    t = TensorType.make((16, 16), torch.float32, "cpu")
    g = Graph(f"chain{n}")
    v = older = g.add_input(t, "x")
    for i in range(n):
        if i % 3 == 0:
            node = g.create("aten.add.Tensor", [v, older], [t])
            older = v
        elif i % 7 == 0:
            node = g.create("aten.mul.Tensor", [v, v], [t])
        else:
            node = g.create("aten.exp.default", [v], [t])
        v = node.output
    g.set_outputs([v])
    return g


def graphs_by_size() -> dict[int, list[Graph]]:
    """One 50k-node graph, and five 10k-node ones (the same 50k nodes of live objects: both
    sizes in the same CPU-cache regime)."""
    return {LARGE: [make_graph(LARGE)],
            SMALL: [make_graph(SMALL) for _ in range(LARGE // SMALL)]}


def noop_pipeline() -> Pipeline:
    return Pipeline("noop", "<bench>", "", steps=tuple(
        PassStep(NoOp(), i + 1, "bench", "0") for i in range(NOOP_PASSES)), verify="off")


@pytest.fixture(scope="module")
def setup():
    plugins = load_plugins(entry_points=[])
    graphs = graphs_by_size()
    pipeline = noop_pipeline()
    return plugins, graphs, pipeline


def interleaved_min(fn, graphs: dict[int, list[Graph]], rounds: int = 5) -> dict[int, float]:
    """Per size, the minimum over rounds of the mean CPU time of ``fn(graph)`` over its
    graphs."""
    best = {n: float("inf") for n in graphs}
    for _ in range(rounds):
        for n, gs in graphs.items():
            with gc_paused():
                t0 = time.process_time()
                for g in gs:
                    fn(g)
                best[n] = min(best[n], (time.process_time() - t0) / len(gs))
    return best


def manager_per_pass_seconds() -> dict[int, float]:
    """CPU seconds per no-op pass at both sizes (interleaved rounds, minimum kept)."""
    plugins = load_plugins(entry_points=[])
    graphs = graphs_by_size()
    pipeline = noop_pipeline()

    def run(graph):
        ctx = PassContext(registry=plugins.registry)
        report = PassManager(pipeline, plugins).run(graph, ctx)
        assert len(report.records) == NOOP_PASSES and not any(r.changed for r in report.records)

    best = interleaved_min(run, graphs)
    return {n: best[n] / NOOP_PASSES for n in best}


def verify_seconds() -> dict[int, float]:
    """CPU seconds of ``verify()`` at both sizes (interleaved rounds, minimum kept), after
    one warm-up call per graph (the type-inference memo: the steady state is measured)."""
    plugins = load_plugins(entry_points=[])
    graphs = graphs_by_size()
    for gs in graphs.values():
        for g in gs:
            verify(g, plugins.registry)
    return interleaved_min(lambda g: verify(g, plugins.registry), graphs)


def fresh(measure: str) -> dict[int, float]:
    """``measure`` (this module's function of that name) run in a fresh interpreter: after
    hundreds of other tests this process's heap is large and fragmented, and a 50k-node
    graph then pays for the cache misses of that history rather than for its own
    algorithm (the verify gate failed at 8.3 in CI's timed phase, measured in-process)."""
    return {int(k): v for k, v in in_fresh_interpreter(__file__, measure, timeout=600).items()}


def test_pass_manager_overhead_per_noop_pass_is_linear(benchmark, setup):
    plugins, graphs, pipeline = setup

    def run(graph):
        ctx = PassContext(registry=plugins.registry)
        PassManager(pipeline, plugins).run(graph, ctx)

    benchmark.pedantic(run, args=(graphs[SMALL][0],), rounds=3, iterations=1)
    per_pass = fresh("manager_per_pass_seconds")
    ratio = per_pass[LARGE] / per_pass[SMALL]
    benchmark.extra_info.update(per_pass_ms_10k=per_pass[SMALL] * 1e3,
                                per_pass_ms_50k=per_pass[LARGE] * 1e3, ratio_50k_10k=ratio)
    assert ratio <= MAX_RATIO, (f"pass-manager overhead is not linear: {per_pass[SMALL]*1e3:.2f}"
                                f" ms per pass on 10k nodes, {per_pass[LARGE]*1e3:.2f} on 50k")


def test_verify_is_linear(benchmark, setup):
    plugins, graphs, _ = setup
    benchmark.pedantic(verify, args=(graphs[SMALL][0], plugins.registry), rounds=3,
                       iterations=1)
    best = fresh("verify_seconds")
    ratio = best[LARGE] / best[SMALL]
    benchmark.extra_info.update(verify_ms_10k=best[SMALL] * 1e3,
                                verify_ms_50k=best[LARGE] * 1e3, ratio_50k_10k=ratio)
    assert ratio <= MAX_RATIO, (f"verify() is not linear: {best[SMALL]*1e3:.1f} ms on 10k "
                                f"nodes, {best[LARGE]*1e3:.1f} ms on 50k")


if __name__ == "__main__":  # one gate's measurement, in a fresh process
    print(json.dumps(globals()[sys.argv[1]]()))
