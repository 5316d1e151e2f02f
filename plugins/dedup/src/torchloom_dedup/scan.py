"""What ``dedup.regions`` searches, kept up to date across extractions: the scanned node
list and its tokens (:class:`Scan`), where an extraction moved positions (:class:`Moved`),
and the candidates (:class:`Candidate`)."""

from __future__ import annotations

import bisect

import attrs

from torchloom.api import (CALL_SUBGRAPH, Graph, Node, TensorType, Value, attrs_key,
                           canonical_text, format_attrs, mutated_values)


@attrs.frozen
class Candidate:
    """``count`` windows of ``length`` consecutive nodes that have equal tokens."""

    starts: tuple[int, ...]
    length: int

    @property
    def saved(self) -> int:
        return self.length * (len(self.starts) - 1)


@attrs.define
class Scan:
    """What a search reads, kept up to date across extractions instead of rescanning the
    graph per region: the top-level nodes in order, their tokens, the values some node
    writes, the graph's outputs. Extracting a region changes the graph only at its
    windows (each becomes its hoisted views, then the call), and a node outside them keeps
    its token (its operands become call results of the same types), so an update costs the
    windows' nodes (and a list splice), not the graph."""

    nodes: list[Node]
    tokens: list[int]
    mutated: set
    #: each graph output, with its slots in ``graph.outputs``
    output_slots: dict
    tokenizer: "Tokenizer"

    @classmethod
    def of(cls, graph: Graph, registry) -> "Scan":
        nodes = list(graph.nodes)
        tokenizer = Tokenizer(registry)
        output_slots: dict[Value, list[int]] = {}
        for i, v in enumerate(graph.outputs):
            output_slots.setdefault(v, []).append(i)
        return cls(nodes, [tokenizer.token(n, i) for i, n in enumerate(nodes)],
                   mutated_values(graph, registry), output_slots, tokenizer)

    def update(self, windows, calls: list[Node], replaced: dict) -> "Moved":
        """Splice ``windows`` (regions' ``_Windows``) out for their ``calls``."""
        nodes, tokens = [], []
        done = 0
        moved = Moved(windows.length)
        for occ, call in sorted(zip(windows.occurrences, calls), key=lambda p: p[0].start):
            nodes += self.nodes[done:occ.start]
            tokens += self.tokens[done:occ.start]
            hoisted = set(occ.hoisted)
            moved.add(occ.start, windows.length - len(hoisted) - 1)
            for i in range(occ.start, occ.start + windows.length):
                if self.nodes[i] in hoisted:
                    nodes.append(self.nodes[i])
                    tokens.append(self.tokens[i])
            nodes.append(call)
            tokens.append(self.tokenizer.token(call, len(nodes) - 1))
            done = occ.start + windows.length
        nodes += self.nodes[done:]
        tokens += self.tokens[done:]
        self.nodes, self.tokens = nodes, tokens
        for old, new in replaced.items():  # a writer of a replaced value now writes its call's
            if old in self.mutated:
                self.mutated.discard(old)
                self.mutated.add(new)
        return moved


class Moved:
    """Where an extraction moved the scanned positions: each window of ``length`` nodes
    from ``starts[i]`` became ``length - shrink[i]`` nodes (its hoisted views, the call)."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.starts: list[int] = []
        self.shrunk: list[int] = [0]  # shrink of the windows before each, summed

    def add(self, start: int, shrink: int) -> None:
        self.starts.append(start)
        self.shrunk.append(self.shrunk[-1] + shrink)

    def candidates(self, old: list[Candidate], min_occurrences: int) -> list[Candidate]:
        """``old`` at the new positions, without the windows an extracted one overlaps;
        a candidate left with too few windows is dropped."""
        out = []
        for cand in old:
            starts = []
            for s in cand.starts:
                i = bisect.bisect_right(self.starts, s + cand.length - 1)  # windows <= end
                if i and self.starts[i - 1] + self.length > s:
                    continue  # overlaps the window extracted at starts[i - 1]
                starts.append(s - self.shrunk[i])
            if len(starts) >= min_occurrences:
                out.append(Candidate(tuple(starts), cand.length))
        return out


class Tokenizer:
    """Equal ints for nodes that are equal but for their operands; -1-i for barriers. An
    operand read twice by a node (``mul(x, x)``) is part of the token: occurrences of a
    region always agree on it, and it tells apart nodes that differ only in wiring."""

    def __init__(self, registry) -> None:
        self.registry = registry
        self.ids: dict[tuple, int] = {}
        self.mutates: dict[str, bool] = {}

    def token(self, n: Node, i: int) -> int:
        op = n.op
        barrier = self.mutates.get(op)
        if barrier is None:
            barrier = self.mutates[op] = (n.region is None and op != CALL_SUBGRAPH
                                          and bool(self.registry.get(op).mutates))
        if barrier:
            return -1 - i  # a node that writes its inputs never joins a region
        sig = [op, _attrs_key(n.attrs)]
        inputs = n.inputs
        for k, v in enumerate(inputs):  # the type, and which operand repeats which
            sig.append(_type_key(v.type))
            sig.append(inputs.index(v) if inputs.count(v) > 1 else k)
        sig.append(None)  # inputs | outputs
        for v in n.outputs:
            sig.append(_type_key(v.type))
        if n.region is not None:
            sig.append(canonical_text(n.region))
        key = tuple(sig)
        token = self.ids.get(key)
        if token is None:
            token = self.ids[key] = len(self.ids)
        return token


def _type_key(t) -> object:
    """A type as a plain tuple: hashed and compared in C, not through attrs methods."""
    if type(t) is TensorType:
        return (t.shape, t.dtype, t.device, t.strides)
    return t


def _attrs_key(attrs) -> object:
    if not attrs:
        return ()
    try:
        key = attrs_key(attrs)  # 0.0 and -0.0, 1 and 1.0 differ
    except TypeError:  # lists and other unhashable values: their text form
        return format_attrs(attrs)
    return key
