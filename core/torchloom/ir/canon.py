"""Canonical form and structural hash.

Two graphs that differ only in value and graph names (alpha-equivalent), or in the names
of their size symbols (``f32[s3, 8]`` and ``f32[s7, 8]``: symbols are numbered by first
appearance), have the same canonical text and hash; any change of op, attribute, shape,
dtype, device, stride, wiring, region content or of which dims share a symbol changes them. Used for kernel caches, dedup and compile caches.
"""

from __future__ import annotations

import hashlib

from torchloom.ir.graph import CALL_SUBGRAPH, Graph
from torchloom.ir.symbols import rename_dim, symbols_of
from torchloom.ir.text import format_attrs, format_type
from torchloom.ir.types import TensorType


def canonical_text(graph: Graph) -> str:
    """The graph printed with values numbered in definition order and names dropped.

    Shared subgraphs that the graph calls follow it, numbered in order of first call, and
    calls name them by that number, so subgraph names do not matter either."""
    lines: list[str] = []
    callees: dict[str, int] = {}
    types: dict = {}  # type -> its canonical text, symbols renamed (one numbering)
    _emit(graph, lines, "", callees, types)
    subgraphs = graph.root.subgraphs
    done = 0
    while done < len(callees):  # emitting a subgraph may discover further callees
        name = list(callees)[done]
        done += 1
        if name in subgraphs:
            lines.append(f"subgraph {callees[name]}")
            _emit(subgraphs[name], lines, "", callees, types)
    return "\n".join(lines)


def _emit(graph: Graph, lines: list[str], indent: str, callees: dict[str, int],
          types: dict) -> None:
    symbols: dict[str, str] = types.setdefault("symbols", {})

    def fmt(t) -> str:
        text = types.get(t)  # a graph repeats few types many times
        if text is None:
            text = types[t] = format_type(_renamed(t, symbols))
        return text

    ids = {}
    for i, v in enumerate(graph.inputs):
        ids[v] = i
    lines.append(indent + "(" + ", ".join(fmt(v.type) for v in graph.inputs) + ")")
    for n in graph.nodes:
        ins = ",".join(str(ids[v]) for v in n.inputs)
        for v in n.outputs:
            ids[v] = len(ids)
        out_types = ",".join(fmt(v.type) for v in n.outputs)
        attrs = n.attrs
        if n.op == CALL_SUBGRAPH and isinstance(attrs.get("callee"), str):
            attrs = {**attrs, "callee": callees.setdefault(attrs["callee"], len(callees))}
        lines.append(f"{indent}{n.op}({ins}){format_attrs(attrs)}:{out_types}")
        if n.region is not None:
            _emit(n.region, lines, indent + " ", callees, types)
    lines.append(indent + "return " + ",".join(str(ids[v]) for v in graph.outputs))


def _renamed(t, symbols: dict[str, str]):
    """``t`` with its size symbols numbered by first appearance (``symbols`` grows)."""
    if not isinstance(t, TensorType) or t.is_static:
        return t
    dims = t.shape + (t.strides or ())
    for d in dims:
        for s in symbols_of(d):
            symbols.setdefault(s, f"s{len(symbols)}")
    strides = None if t.strides is None else [rename_dim(d, symbols) for d in t.strides]
    return TensorType(tuple(rename_dim(d, symbols) for d in t.shape), t.dtype, t.device,
                      strides)


def structural_hash(graph: Graph) -> str:
    """A hex digest of :func:`canonical_text`."""
    return hashlib.sha256(canonical_text(graph).encode()).hexdigest()


def alpha_equivalent(a: Graph, b: Graph) -> bool:
    return canonical_text(a) == canonical_text(b)
