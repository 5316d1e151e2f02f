"""``dedup.regions``: repeated regions become calls of one shared subgraph."""

from __future__ import annotations

from collections.abc import Container
from typing import ClassVar

import attrs

from torchloom.api import (CALL_SUBGRAPH, Deduplication, Graph, Node, Pass, PassContext,
                           PassResult, Value)

from torchloom_dedup.scan import Candidate, Scan

_positive = attrs.validators.ge(1)


@attrs.frozen
class DedupRegions(Pass):
    """Find maximal repeated regions by structure and replace each occurrence with a call
    of one shared subgraph, so later passes and the codegen see the region once.

    before (with ``min_nodes = 2``; the default, 8, keeps calls for regions worth one)::

        graph @main(%x: f32[4, 8], %w: f32[8]) {
          %s = aten.mul.Tensor(%x, %w) : f32[4, 8]
          %t = aten.tanh.default(%s) : f32[4, 8]
          %s_1 = aten.mul.Tensor(%t, %w) : f32[4, 8]
          %t_1 = aten.tanh.default(%s_1) : f32[4, 8]
          return %t_1
        }

    after::

        graph @main(%x: f32[4, 8], %w: f32[8]) {
          %t_2 = torchloom.call_subgraph(%x, %w) {callee = "region"} : f32[4, 8]
          %t_3 = torchloom.call_subgraph(%t_2, %w) {callee = "region"} : f32[4, 8]
          return %t_3
        }
        graph @region(%x: f32[4, 8], %w: f32[8]) {
          %s = aten.mul.Tensor(%x, %w) : f32[4, 8]
          %t = aten.tanh.default(%s) : f32[4, 8]
          return %t
        }

    How: every node gets a token (op, attributes, input and output types, operands read
    twice). From anchor tokens, windows of consecutive nodes are grown while their tokens
    agree, keeping the largest agreeing set of non-overlapping occurrences; each number of
    occurrences gives a candidate (its longest window), and candidates are tried in order of
    nodes saved (length x (occurrences - 1)); occurrences need not be adjacent. A window is
    a contiguous stretch of the topological order, so replacing it by one node keeps the
    graph valid. Occurrences are then grouped by exact wiring (which input or earlier node
    each operand comes from), and the largest group becomes the subgraph; a candidate whose
    occurrences disagree on wiring gives way to the next. The subgraph's outputs are the
    values any occurrence uses outside the window.

    Skipped: windows whose nodes are not one piece through the values they pass or the
    inputs they share (side-by-side runs of unrelated ops, as a decomposed ``_foreach_*``
    op makes), windows containing a node that writes its inputs, occurrences whose inputs
    or outputs some node mutates (an output written through a view of another one), and
    regions whose outputs alias (are views of) their inputs. Not
    found: a region whose own tokens repeat with a period at most a third of its length
    (three ``tanh`` in a row, copied): windows grow to at most twice the spacing of their
    anchor's occurrences (``_OVERLAP``), which keeps a block repeated m times from costing
    O(m^2), so such a region is seen only as its shorter period, whose wiring differs.

    Stats: ``regions``, ``occurrences``, ``nodes_deduplicated`` (nodes later passes no
    longer see), ``subgraph_nodes``; the first three are also its ``Deduplication``, which
    ``explain``'s ``dedup`` summary adds up.
    """

    name: ClassVar[str] = "dedup.regions"
    #: a region smaller than this is not worth a call
    min_nodes: int = attrs.field(default=8, validator=_positive)
    min_occurrences: int = attrs.field(default=2, validator=attrs.validators.ge(2))
    #: how many regions to extract (the graph is scanned once; each extraction updates
    #: the scan at its windows; the next region comes from the last search's candidates
    #: the extraction left whole, and the tokens are searched again only when none of
    #: those validates)
    max_regions: int = attrs.field(default=4, validator=_positive)
    #: anchor tokens tried per scan (one per distinct occurrence count)
    max_anchors: int = attrs.field(default=16, validator=_positive)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        stats = {"regions": 0, "occurrences": 0, "nodes_deduplicated": 0, "subgraph_nodes": 0}
        if graph.parent is not None or graph.owner is not None:
            return PassResult(False, stats)  # shared subgraphs are made from the top level
        scan = Scan.of(graph, ctx.registry)
        left: list[Candidate] = []  # the last search's untried candidates, still valid
        for _ in range(self.max_regions):
            found = self._extract_best(graph, scan, left, ctx)
            if found is None:
                break
            sub, occurrences = found
            stats["regions"] += 1
            stats["occurrences"] += occurrences
            stats["nodes_deduplicated"] += len(sub) * (occurrences - 1)
            stats["subgraph_nodes"] += len(sub)
            ctx.note(f"dedup.regions: @{sub.name} ({len(sub)} nodes) replaces {occurrences} "
                     f"occurrences in @{graph.name}")
        made = Deduplication(stats["regions"], stats["occurrences"],
                             stats["nodes_deduplicated"])
        return PassResult(stats["regions"] > 0, stats, deduplication=made)

    # ---- search ----------------------------------------------------------------------
    def _extract_best(self, graph: Graph, scan: Scan, left: list[Candidate],
                      ctx: PassContext):
        """Extract the best candidate that validates: first from ``left`` (what the last
        search found and no extraction has touched since: its windows are still equal
        tokens), then from a new search. A search costs the graph; a graph with several
        regions (more of them the larger it is) would otherwise pay one per region."""
        for fresh in (False, True):
            if fresh:
                left[:] = self._candidates(scan.tokens)
            left.sort(key=lambda c: (-c.saved, c.starts[0]))
            tried, left[:] = left[: self.max_anchors], left[self.max_anchors:]
            for k, cand in enumerate(tried):
                windows = self._validate(scan, cand, ctx)
                if windows is not None:
                    sub, calls, replaced = _replace(graph, windows, scan.output_slots)
                    moved = scan.update(windows, calls, replaced)
                    left[:] = moved.candidates(tried[k + 1:] + left, self.min_occurrences)
                    return sub, len(calls)
        return None

    def _candidates(self, tokens: list[int]) -> list[Candidate]:
        positions: dict[int, list[int]] = {}
        for i, t in enumerate(tokens):
            if t >= 0:
                positions.setdefault(t, []).append(i)
        by_count: dict[int, list[int]] = {}
        for t, ps in positions.items():
            if len(ps) >= self.min_occurrences:
                by_count.setdefault(len(ps), []).append(ps)
        anchors = [group[0] for _, group in sorted(by_count.items())][: self.max_anchors]
        found = []
        covered: set[int] = set()  # an anchor inside found windows would find them again
        for ps in anchors:
            if all(p in covered for p in ps):
                continue
            grown = self._grow(tokens, ps)
            if grown:
                found.extend(grown)
                best = max(grown, key=lambda c: c.saved)
                for start in best.starts:
                    covered.update(range(start, start + best.length))
        return found

    def _grow(self, tokens: list[int], anchor: list[int]) -> list[Candidate]:
        """Grow windows around the anchor positions: left while all agree, then right,
        splitting the positions by the next token and keeping the part with the most
        non-overlapping windows. Each number of windows gives a candidate (its longest
        windows): the one saving most may not validate (equal tokens, other wiring),
        and a longer one with fewer windows then may."""
        left, anchor_gap = 0, _min_gap(anchor)
        while True:
            ps = [p - left - 1 for p in anchor]
            if ps[0] < 0 or tokens[ps[0]] < 0 or any(tokens[p] != tokens[ps[0]] for p in ps):
                break
            if anchor_gap < left + 2:
                break
            left += 1
        alive = [p - left for p in anchor]  # windows so far equal, overlapping or not
        length = left + 1
        found = []
        # Windows overlapping by more than their gap only repeat a shorter period (a
        # block repeated m times would otherwise grow to m/2 blocks, each step over all m
        # windows: quadratic); growth stops there, which keeps it O(n log n).
        gap = _min_gap(alive)  # (kept with alive: a scan of it per step cost O(m))
        while length <= _OVERLAP * gap:
            starts = list(alive) if length <= gap else _non_overlapping(alive, length)
            if len(starts) < self.min_occurrences:
                break
            if length >= self.min_nodes:
                if found and len(found[-1].starts) == len(starts):
                    found.pop()  # as many windows, but shorter: this one saves more
                found.append(Candidate(tuple(starts), length))
            parts: dict[int, list[int]] = {}
            for s in alive:
                i = s + length
                if i < len(tokens) and tokens[i] >= 0:
                    parts.setdefault(tokens[i], []).append(s)
            if not parts:
                break
            if len(parts) == 1:
                (kept,) = parts.values()
            else:
                kept = max(parts.values(),
                           key=lambda ps: len(_non_overlapping(ps, length + 1)))
            if len(kept) != len(alive):  # (a part of alive: as long, it is alive)
                gap = _min_gap(kept)
            alive = kept
            length += 1
        return found

    def _validate(self, scan: Scan, cand: Candidate,
                  ctx: PassContext) -> "_Windows | None":
        nodes, mutated, graph_outputs = scan.nodes, scan.mutated, scan.output_slots
        occurrences = [_Occurrence.of(nodes[s:s + cand.length], graph_outputs, s)
                       for s in cand.starts]
        for _ in range(2):  # the second round runs once aliasing views were hoisted out
            groups: dict[tuple, list[_Occurrence]] = {}
            for occ in occurrences:  # (an output written later may alias another one)
                if not any(v in mutated for v in occ.inputs) and not any(
                        occ.nodes[k].outputs[i] in mutated for k, i in occ.escaping):
                    groups.setdefault(occ.wiring, []).append(occ)
            if not groups:
                return None
            best = max(groups.values(), key=len)
            if len(best) < self.min_occurrences or len(best[0].nodes) < self.min_nodes:
                return None
            if not best[0].connected():
                return None  # unrelated pieces side by side: a call would only part them
            outputs = sorted({o for occ in best for o in occ.escaping})
            if not outputs:
                return None
            aliasing = [o for o in outputs if _aliases_input(best[0], o, ctx.registry)]
            if not aliasing:
                return _Windows(best, outputs, cand.length)
            # Views of inputs that escape (e.g. a transposed weight saved for backward)
            # leave the region: they run before each call, and their results become inputs.
            hoist = _alias_chains(best[0], aliasing, ctx.registry)
            if hoist is None or len(hoist) == len(best[0].nodes):  # nothing left to share
                return None
            occurrences = [occ.without(hoist, graph_outputs) for occ in best]
        return None


@attrs.define
class _Occurrence:
    nodes: list[Node]
    inputs: list[Value]
    #: per node, per operand: ("in", k) for the k-th input, ("n", offset, index) inside
    wiring: tuple
    #: (offset, output index) of values used after the window
    escaping: set
    #: the window's last node: the call goes right after it
    last: Node
    #: nodes of the window that stay outside the region (they run before the call)
    hoisted: list[Node] = attrs.field(factory=list)
    #: the window's first position in the scanned node list
    start: int = 0

    def without(self, offsets: set[int], graph_outputs: Container[Value]) -> "_Occurrence":
        out = _Occurrence.of([n for i, n in enumerate(self.nodes) if i not in offsets],
                             graph_outputs, self.start)
        out.last = self.last
        out.hoisted = self.hoisted + [self.nodes[i] for i in sorted(offsets)]
        return out

    @classmethod
    def of(cls, nodes: list[Node], graph_outputs: Container[Value],
           start: int) -> "_Occurrence":
        offset = {n: i for i, n in enumerate(nodes)}
        inputs: list[Value] = []
        index: dict[Value, int] = {}
        wiring = []
        for n in nodes:
            ops = []
            for v in n.inputs:
                if v.producer in offset:
                    ops.append(("n", offset[v.producer], v.index))
                else:
                    if v not in index:
                        index[v] = len(inputs)
                        inputs.append(v)
                    ops.append(("in", index[v]))
            wiring.append(tuple(ops))
        escaping = set()
        for i, n in enumerate(nodes):
            for v in n.outputs:
                if v in graph_outputs or any(u not in offset for u in v.uses):
                    escaping.add((i, v.index))
        return cls(nodes, inputs, tuple(wiring), escaping, nodes[-1], start=start)

    def value(self, ref: tuple[int, int]) -> Value:
        return self.nodes[ref[0]].outputs[ref[1]]

    def connected(self) -> bool:
        """Whether the window's nodes are one piece: joined through the values they pass
        each other or the inputs they share. A run of unrelated ops (``_foreach_div``
        decomposed: one ``div`` per tensor, then the next op's run) repeats too, but as a
        call it would cut each tensor's chain of ops into pieces no fusion joins again."""
        root = list(range(len(self.nodes)))

        def find(i: int) -> int:
            while root[i] != i:
                root[i] = root[root[i]]
                i = root[i]
            return i
        reader: dict[int, int] = {}  # input index -> a node reading it
        for i, operands in enumerate(self.wiring):
            for operand in operands:
                other = operand[1] if operand[0] == "n" else reader.setdefault(operand[1], i)
                root[find(i)] = find(other)
        return len({find(i) for i in range(len(self.nodes))}) == 1


@attrs.define
class _Windows:
    occurrences: list[_Occurrence]
    outputs: list[tuple[int, int]]
    #: the length of each occurrence's window (hoisted nodes included)
    length: int


#: how far windows may grow past the smallest gap between their starts (see _grow)
_OVERLAP = 2


def _non_overlapping(starts: list[int], length: int) -> list[int]:
    out: list[int] = []
    for s in starts:
        if not out or s >= out[-1] + length:
            out.append(s)
    return out


def _min_gap(ps: list[int]) -> int:
    return min((b - a for a, b in zip(ps, ps[1:])), default=1 << 30)


def _aliases_input(occ: _Occurrence, ref: tuple[int, int], registry) -> bool:
    """Whether the region output at ``ref`` is a view of one of the region's inputs."""
    inside = {n: i for i, n in enumerate(occ.nodes)}
    node, index = occ.nodes[ref[0]], ref[1]
    while True:
        if node.region is not None or node.op == CALL_SUBGRAPH:
            return False
        source = registry.get(node.op).aliased_input(node, index)
        if source is None:
            return False
        v = node.inputs[source]
        if v.producer not in inside:
            return True
        node, index = v.producer, v.index


def _alias_chains(occ: _Occurrence, refs: list[tuple[int, int]], registry) -> set[int] | None:
    """Offsets of the view chains that make the outputs at ``refs`` alias an input;
    None when such a chain also reads a value computed in the window."""
    inside = {n: i for i, n in enumerate(occ.nodes)}
    chain: set[int] = set()
    for offset, index in refs:
        node = occ.nodes[offset]
        while node in inside:
            chain.add(inside[node])
            v = node.inputs[registry.get(node.op).aliased_input(node, index)]
            node, index = v.producer, v.index
    for i in chain:
        if any(v.producer in inside and inside[v.producer] not in chain
               for v in occ.nodes[i].inputs):
            return None
    return chain


def _replace(graph: Graph, windows: _Windows, output_slots: dict):
    """Build the shared subgraph from the first occurrence; replace every occurrence.
    Returns the subgraph, the calls (one per occurrence, in order) and the map from each
    replaced value to the call result that replaces it; ``output_slots`` (each graph
    output with its slots) is kept up to date."""
    first = windows.occurrences[0]
    sub = Graph(graph.fresh_subgraph_name("region"))
    mapping: dict[Value, Value] = {}
    for v in first.inputs:
        mapping[v] = sub.add_input(v.type, v.name)
    for n in first.nodes:
        region = n.region.clone() if n.region is not None else None
        new = sub.create(n.op, [mapping[v] for v in n.inputs], [v.type for v in n.outputs],
                         n.attrs, names=[v.name for v in n.outputs], region=region)
        new.meta = dict(n.meta)
        mapping.update(zip(n.outputs, new.outputs))
    sub.set_outputs([mapping[first.value(ref)] for ref in windows.outputs])
    graph.add_subgraph(sub)
    replaced: dict[Value, Value] = {}  # an occurrence may read an earlier one's results
    calls = []
    for occ in windows.occurrences:
        # After the window's last node: every input (hoisted views included) is defined
        # by then, and every use of an escaping value comes later.
        olds = [occ.value(ref) for ref in windows.outputs]
        call = graph.create(CALL_SUBGRAPH, [replaced.get(v, v) for v in occ.inputs],
                            [v.type for v in olds], {"callee": sub.name},
                            names=[v.name for v in olds], after=occ.last)
        calls.append(call)
        redirect: dict[Value, Value] = {}
        for old, new in zip(olds, call.outputs):
            redirect.setdefault(old, new)
            replaced[old] = new
        graph.replace_uses(redirect, output_slots)
    # all at once: a value every occurrence reads has its use list filtered once
    graph.erase_many([n for occ in windows.occurrences for n in occ.nodes])
    return sub, calls, replaced
