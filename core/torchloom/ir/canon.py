"""Canonical form and structural hash.

Two graphs that differ only in value and graph names (alpha-equivalent), or in the names
of their size symbols (``f32[s3, 8]`` and ``f32[s7, 8]``: symbols are numbered by first
appearance), have the same canonical text and hash; any change of op, attribute, shape,
dtype, device, stride, wiring, region content or of which dims share a symbol changes them. Used for kernel caches, dedup and compile caches.

Attributes that hold sizes (a view's ``size = ["s3", 8]``) are renumbered with the same
numbering as the types: a string attribute that is a size expression over symbols of the
graph's types is printed bare (``s0``), renamed, so it never equals a quoted string
attribute, and one occurrence changed to another symbol changes the text.
"""

from __future__ import annotations

import hashlib

from torchloom.ir.graph import CALL_SUBGRAPH, Graph
from torchloom.ir.symbols import SymbolicDimError, parse_dim, rename_dim, symbols_of
from torchloom.ir.text import format_attr, format_attrs, format_type
from torchloom.ir.types import ScalarType, TensorType


def canonical_text(graph: Graph) -> str:
    """The graph printed with values numbered in definition order and names dropped.

    Shared subgraphs that the graph calls follow it, numbered in order of first call, and
    calls name them by that number, so subgraph names do not matter either."""
    lines: list[str] = []
    callees: dict[str, int] = {}
    types: dict = {}  # type -> its canonical text, symbols renamed (one numbering)
    types["graph symbols"] = lambda: _type_symbols(graph)  # computed at the first str attr
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
        lines.append(f"{indent}{n.op}({ins}){_format_attrs(attrs, types)}:{out_types}")
        if n.region is not None:
            _emit(n.region, lines, indent + " ", callees, types)
    lines.append(indent + "return " + ",".join(str(ids[v]) for v in graph.outputs))


def _format_attrs(attrs, types: dict) -> str:
    """``format_attrs`` with size expressions over the graph's symbols renamed and bare."""
    if not attrs or not any(_has_str(v) for v in attrs.values()):
        return format_attrs(attrs)
    graph_symbols = types["graph symbols"]
    if callable(graph_symbols):
        graph_symbols = types["graph symbols"] = graph_symbols()
    symbols = types["symbols"]

    def fmt(v) -> str:
        if isinstance(v, (tuple, list)):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        if isinstance(v, str) and _is_size(v, graph_symbols):
            for s in symbols_of(v):
                symbols.setdefault(s, f"s{len(symbols)}")
            return rename_dim(v, symbols)
        return format_attr(v)

    return " {" + ", ".join(f"{k} = {fmt(attrs[k])}" for k in sorted(attrs)) + "}"


def _has_str(v) -> bool:
    if isinstance(v, (tuple, list)):
        return any(_has_str(x) for x in v)
    return isinstance(v, str)


def _is_size(text: str, graph_symbols: frozenset) -> bool:
    """Whether ``text`` is a size expression over symbols the graph's types name."""
    names = symbols_of(text)
    if not names or not graph_symbols.issuperset(names):
        return False
    try:
        parse_dim(text)
    except SymbolicDimError:
        return False
    return True


def _type_symbols(graph: Graph) -> frozenset:
    """Every size symbol in the types of ``graph``, its regions and the subgraphs it calls
    (transitively): what the canonical text prints. Only those: a fusion group's key must
    not cost a walk over every shared subgraph of the module."""
    found: set[str] = set()
    subgraphs = graph.root.subgraphs
    graphs, called = [graph], set()
    while graphs:
        g = graphs.pop()
        for v in [*g.inputs, *(o for n in g.nodes for o in n.outputs)]:
            t = v.type
            if isinstance(t, TensorType) and not t.is_static:
                for d in (*t.shape, *(t.strides or ())):
                    found.update(symbols_of(d))
            elif isinstance(t, ScalarType) and t.size is not None:
                found.add(t.size)
        for n in g.nodes:
            if n.region is not None:
                graphs.append(n.region)
            callee = n.attrs.get("callee") if n.op == CALL_SUBGRAPH else None
            if isinstance(callee, str) and callee in subgraphs and callee not in called:
                called.add(callee)
                graphs.append(subgraphs[callee])
    return frozenset(found)


def _renamed(t, symbols: dict[str, str]):
    """``t`` with its size symbols numbered by first appearance (``symbols`` grows); an
    ``int[s4]`` (an int that is a size) in the same numbering as the tensors' dims."""
    if isinstance(t, ScalarType) and t.size is not None:
        return ScalarType(t.kind, size=symbols.setdefault(t.size, f"s{len(symbols)}"))
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
