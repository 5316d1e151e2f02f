"""Helpers shared by the fusion tests: run fusion passes on IR with the verifier after
each one (as ``verify = "each"`` does) and compare the result with the original graph."""

from __future__ import annotations

import functools

import torch

from torchloom.api import FUSION_GROUP, Graph, PassContext, clone_graph, parse_graph, verify
from torchloom.tools import build_function, load_plugins
from torchloom_fusion.decompose import Decompose
from torchloom_fusion.functionalize import Functionalize
from torchloom_fusion.horizontal import HorizontalFusion
from torchloom_fusion.merge_groups import MergeGroups
from torchloom_fusion.vertical import VerticalFusion


@functools.cache
def plugin_registry():
    """One op registry for the whole test session (loading plugins costs a little)."""
    return load_plugins().registry


def fusion_pipeline(**limits):
    """The fusion passes in default-pipeline order, fixpoint included."""
    return [Decompose(), Functionalize(), ("fixpoint", [VerticalFusion(**limits),
                                                       HorizontalFusion(**limits)]),
            MergeGroups(**limits)]


def run_passes(graph: Graph, passes, registry) -> dict:
    """Run passes (a ``("fixpoint", [...])`` entry repeats until nothing changes) and
    verify after every one; returns the summed stats."""
    ctx = PassContext(registry=registry)
    stats: dict = {}

    def one(p) -> bool:
        result = p.run(graph, ctx)
        verify(graph, registry)
        for k, v in result.stats.items():
            stats[f"{p.name}.{k}"] = stats.get(f"{p.name}.{k}", 0) + v
        return result.changed

    for p in passes:
        if isinstance(p, tuple):
            for _ in range(10):
                if not [q for q in p[1] if one(q)]:
                    break
            else:
                raise AssertionError("fixpoint did not converge")
        else:
            one(p)
    return stats


def groups(graph: Graph) -> list:
    return [n for n in graph.nodes if n.op == FUSION_GROUP]


def example_inputs(graph: Graph, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for v in graph.inputs:
        t = v.type
        if t.dtype in ("f32", "f64", "f16", "bf16"):
            out.append(torch.randn(t.shape, generator=g, dtype=t.torch_dtype))
        elif t.dtype == "b8":
            out.append(torch.rand(t.shape, generator=g) > 0.5)
        else:
            out.append(torch.randint(-5, 5, t.shape, generator=g, dtype=t.torch_dtype))
    return out


def run_graph(graph: Graph, registry, inputs) -> tuple:
    """Run the graph's ops as they are: decomposed composites stay primitives."""
    return build_function(graph, registry, recompose=False).fn(*[x.clone() for x in inputs])


def fuse_and_compare(text: str, registry, passes=None, seed: int = 0) -> Graph:
    """Parse, fuse, verify, and check the fused graph computes what the original does."""
    original = parse_graph(text)
    fused = clone_graph(original)[0]
    run_passes(fused, passes if passes is not None else fusion_pipeline(), registry)
    inputs = example_inputs(original, seed)
    expected = run_graph(original, registry, inputs)
    actual = run_graph(fused, registry, inputs)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e, equal_nan=True)
    return fused


def strides_that_show(t: torch.Tensor) -> list[int]:
    """The strides of ``t``'s dims of more than one element: a dim of one may have any
    stride (the graph's types do not tell them apart), so layouts compare on these."""
    return [s for n, s in zip(t.shape, t.stride()) if n > 1]
