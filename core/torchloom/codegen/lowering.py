"""The graph the plan builder emits: regions that run op by op are inlined, then
decomposed composites whose primitives all run op by op become the composite again.

A fusion group on the ``eager`` codegen would otherwise cost a Python call, a tuple and
an unpacking per call on top of its ops, and its decomposed composites (layer_norm split
into nine primitives by ``fusion.decompose``) many small kernels where eager ran one.
Inlining every such group into one flat graph also lets an instance split between two
eager groups, or between a group and the top level, run whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Union

from torchloom.codegen.recompose import recompose
from torchloom.ir.graph import CALL_SUBGRAPH, Graph, Node, Value

#: for a region node: its kernel (called), or a graph to run inline in its place
KernelOf = Callable[[Node], Union[Callable, Graph]]


def lower(graph: Graph, registry: Any, kernel_of: KernelOf,
          recompose_composites: bool = True) -> tuple[Graph, dict[Node, Callable]]:
    """A flat copy of ``graph`` (same inputs and outputs, in order) and the kernel each of
    its region-call nodes calls; the original graph is not changed."""
    flat = Graph(graph.name)
    env: dict[Value, Value] = {v: flat.add_input(v.type, v.name) for v in graph.inputs}
    kernels: dict[Node, Callable] = {}
    _copy(graph, flat, env, kernel_of, kernels)
    flat.set_outputs([env[v] for v in graph.outputs])
    if recompose_composites:
        recompose(flat, registry)
    return flat, kernels


def _copy(src: Graph, flat: Graph, env: dict[Value, Value], kernel_of: KernelOf,
          kernels: dict[Node, Callable]) -> None:
    for node in src.nodes:
        inputs = [env[v] for v in node.inputs]
        calls = node.region is not None or node.op == CALL_SUBGRAPH
        target = kernel_of(node) if calls else None
        if isinstance(target, Graph):  # run the region's ops here, in the enclosing plan
            inner = dict(zip(target.inputs, inputs))
            _copy(target, flat, inner, kernel_of, kernels)
            env.update(zip(node.outputs, (inner[v] for v in target.outputs)))
            continue
        copy = flat.create(node.op, inputs, [v.type for v in node.outputs], node.attrs,
                           names=[v.name for v in node.outputs])
        if target is not None:
            kernels[copy] = target
        env.update(zip(node.outputs, copy.outputs))


__all__ = ["lower", "KernelOf"]
