"""Shared helpers of the views tests: run one pass on IR text and compare numerics."""

from __future__ import annotations

import torch

from torchloom.api import DTYPES, PassContext, TensorType, clone_graph, parse_graph, verify
from torchloom.tools import load_plugins
from torchloom.runtime.executor import CompiledGraph


def random_inputs(graph, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for v in graph.inputs:
        t: TensorType = v.type
        base = torch.randn(t.numel(), generator=gen, dtype=torch.float64).to(DTYPES[t.dtype])
        strides = t.actual_strides()
        size = 1 + sum((d - 1) * s for d, s in zip(t.shape, strides)) if t.shape else 1
        storage = torch.randn(max(size, 1), generator=gen, dtype=torch.float64).to(DTYPES[t.dtype])
        out.append(torch.as_strided(storage, t.shape, strides) if t.strides else
                   base.reshape(t.shape))
    return out


def run_pass(pass_name: str, text: str, **options):
    """Parse ``text``, run the pass, verify; returns (graph before, graph after, ctx, result)."""
    plugins = load_plugins()
    graph = parse_graph(text)
    before, _ = clone_graph(graph)
    ctx = PassContext(registry=plugins.registry)
    result = plugins.pass_class(pass_name)(**options).run(graph, ctx)
    verify(graph, plugins.registry)
    return before, graph, ctx, result, plugins


def assert_same_results(before, after, plugins) -> None:
    inputs = random_inputs(before)
    chain = plugins.codegen_chain("eager")
    expected = CompiledGraph(before, plugins.registry, chain)(*inputs)
    actual = CompiledGraph(after, plugins.registry, chain)(*inputs)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e)
        assert a.shape == e.shape and a.stride() == e.stride()


# a view of a private temporary, written in place through the view
MUTATED_VIEW = """graph @m(%x: f32[4, 6], %s: f32[24]) {
  %t = aten.exp.default(%x) : f32[4, 6]
  %v = aten.view.default(%t) {size = [24]} : f32[24]
  %w = aten.mul_.Tensor(%v, %s) : f32[24]
  %n = aten.neg.default(%w) : f32[24]
  return %n
}
"""
