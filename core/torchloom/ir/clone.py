"""Deep copies of a graph, optionally with its sizes mapped.

``clone_graph`` copies a graph with its regions and shared subgraphs; ``dim`` maps every
size of every tensor type (shapes and strides, inputs and node outputs, regions included)
and ``attr`` every node attribute value, so that a caller who wants the same program at
other sizes (``torchloom reduce`` shrinking a dim, a codegen renaming size symbols) gets
a new graph built that way, never by editing a copy's values or its printed text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from torchloom.ir.graph import Graph, Node, Value
from torchloom.ir.types import Dim, TensorType, Type


def clone_graph(graph: Graph, name: str | None = None, *,
                dim: Callable[[Dim], Dim] | None = None,
                attr: Callable[[Any], Any] | None = None) -> tuple[Graph, dict[Value, Value]]:
    """Deep-copy a graph; returns the copy and the value mapping old -> new. ``dim``
    (when given) maps each size of each tensor type, ``attr`` each attribute value (the
    value as stored: a list stays for ``attr`` to walk)."""
    retype = _retyper(dim)
    g = Graph(name or graph.name)
    mapping: dict[Value, Value] = {}
    for v in graph.inputs:
        nv = Value(v.name, retype(v.type), graph=g)
        g._names.add(v.name)
        g.inputs.append(nv)
        mapping[v] = nv
    for n in graph.nodes:
        region = (clone_graph(n.region, dim=dim, attr=attr)[0]
                  if n.region is not None else None)
        node_attrs = n.attrs if attr is None else {k: attr(a) for k, a in n.attrs.items()}
        nn = Node(n.op, [mapping[v] for v in n.inputs], node_attrs, region)
        if region is not None:
            region.owner = nn
        nn.outputs = [Value(v.name, retype(v.type), nn, i, g) for i, v in enumerate(n.outputs)]
        nn.meta = dict(n.meta)
        g.insert(nn)
        mapping.update(zip(n.outputs, nn.outputs))
    g.outputs = [mapping[v] for v in graph.outputs]
    g._counter = graph._counter
    for sub in graph.subgraphs.values():
        g.add_subgraph(clone_graph(sub, dim=dim, attr=attr)[0])
    return g, mapping


def _retyper(dim: Callable[[Dim], Dim] | None) -> Callable[[Type], Type]:
    if dim is None:
        return lambda t: t

    def retype(t: Type) -> Type:
        if not isinstance(t, TensorType):
            return t
        return attrs.evolve(t, shape=tuple(dim(d) for d in t.shape),
                            strides=None if t.strides is None else tuple(dim(d) for d in t.strides))
    return retype
