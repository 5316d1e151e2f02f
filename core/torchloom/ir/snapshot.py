"""Exact, cheap rollback of a graph for the pass manager.

Before every pass the manager records the *state* of the graph's existing objects (each
graph's fields, each node's and each value's slots, regions included) rather than
deep-copying the graph: no Node or Value is allocated, and the objects callers hold stay
the same objects after a rollback. Restoring writes every recorded slot back, so whatever
a pass did — edited input lists or use lists, swapped attrs, moved, erased or inserted
nodes, changed types — is undone; nodes the pass created are simply no longer linked.

The same record tells what a pass changed: ``changed_since(earlier)`` compares two
snapshots unit by unit (a unit is a top-level graph or a shared subgraph, each with its
regions), so that ``verify = "each"`` re-checks only the units a pass touched, and the
snapshot taken after one pass is the rollback point of the next.
"""

from __future__ import annotations

from torchloom.ir.graph import Graph

class GraphSnapshot:
    """The recorded state of a graph (and of its regions). ``restore()`` puts it back.

    Per graph, one tuple; per node and per value, records appended to one flat list (a
    count followed by the items for every list slot), so that taking a snapshot allocates
    no per-node container. That keeps it linear in the graph's size instead of waking
    Python's cyclic garbage collector every few hundred nodes.
    """

    __slots__ = ("_graphs", "_records", "_units", "_spans")

    def __init__(self, graph: Graph):
        self._graphs: list[tuple] = []
        self._records: list = []
        #: unit graph -> (first record, end record, first graph tuple, end graph tuple)
        self._units: dict[Graph, tuple[int, int, int, int]] = {}
        #: every graph -> (first record, end of its own records, its graph tuple, its
        #: regions)
        self._spans: dict[Graph, tuple[int, int, int, list[Graph]]] = {}
        self._record_unit(graph)

    def _record_unit(self, graph: Graph) -> None:
        """Record ``graph`` and its regions as one unit, then each of its shared
        subgraphs as a unit of its own."""
        rec_start, graphs_start = len(self._records), len(self._graphs)
        self._record(graph)
        self._units[graph] = (rec_start, len(self._records), graphs_start, len(self._graphs))
        for sub in graph.subgraphs.values():  # shared subgraphs of a top-level graph
            self._record_unit(sub)

    def changed_since(self, earlier: "GraphSnapshot") -> set[Graph]:
        """The units (top-level graph, shared subgraphs) whose recorded state differs
        from ``earlier``'s, or that ``earlier`` did not have."""
        changed = set()
        for unit, (r0, r1, g0, g1) in self._units.items():
            old = earlier._units.get(unit)
            if old is None or not self._same(earlier, (r0, r1, g0, g1), old):
                changed.add(unit)
        return changed

    def unchanged_regions(self, earlier: "GraphSnapshot") -> set[Graph]:
        """The regions whose recorded state, and that of every region nested in them,
        equals ``earlier``'s: ``verify`` need not look inside them again."""
        mine, theirs = self._records, earlier._records
        my_graphs, their_graphs, their_spans = self._graphs, earlier._graphs, earlier._spans
        same: dict[Graph, bool] = {}
        # a graph's span is recorded before its regions': in reverse, children come first
        for g, (r0, r1, gi, children) in reversed(self._spans.items()):
            if g.owner is None:
                continue  # a unit (changed_since's answer), not a region
            old = their_spans.get(g)
            try:  # identity first, then ``==`` (types, names, attrs, copies of meta)
                same[g] = (old is not None and r1 - r0 == old[1] - old[0]
                           and all([same[c] for c in children])
                           and mine[r0:r1] == theirs[old[0]:old[1]]
                           and my_graphs[gi][:-1] == their_graphs[old[2]][:-1])
            except Exception:  # a value whose ``==`` does not give a bool: call it changed
                same[g] = False
        return {g for g, found in same.items() if found}

    def _same(self, earlier: "GraphSnapshot", mine: tuple, theirs: tuple) -> bool:
        r0, r1, g0, g1 = mine
        s0, s1, h0, h1 = theirs
        if r1 - r0 != s1 - s0 or g1 - g0 != h1 - h0:
            return False
        mine_all = r0 == 0 and r1 == len(self._records)  # (no copy of a whole record)
        theirs_all = s0 == 0 and s1 == len(earlier._records)
        try:  # identity first, then ``==`` (types, names, attrs, copies of meta)
            return ((self._records == earlier._records if mine_all and theirs_all else
                     self._records[r0:r1] == earlier._records[s0:s1])
                    and all(a[:-1] == b[:-1] for a, b in
                            zip(self._graphs[g0:g1], earlier._graphs[h0:h1])))
        except Exception:  # a value whose ``==`` does not give a bool: call it changed
            return False

    def _record(self, graph: Graph) -> None:
        # Only what a pass could change and the order cannot tell: a node's ``prev``,
        # ``next`` and ``graph`` follow from the order of the records, a value's
        # ``producer``, ``index`` and ``graph`` from its place in its node's record.
        rec = self._records
        start, count, regions = len(rec), 0, []
        for v in graph.inputs:
            rec += (v, v.name, v.type, len(v.uses))
            rec += v.uses
        n = graph.first
        while n is not None:  # (the linked list itself: no generator per node)
            meta, region, inputs, outputs = n.meta, n.region, n.inputs, n.outputs
            rec += (n, n.op, n.attrs, region, dict(meta) if meta else None, len(inputs))
            rec += inputs
            rec.append(len(outputs))
            for v in outputs:
                uses = v.uses
                rec += (v, v.name, v.type, len(uses))
                rec += uses
            if region is not None:
                regions.append(region)
            count += 1
            n = n.next
        self._spans[graph] = (start, len(rec), len(self._graphs), regions)
        self._graphs.append((graph, list(graph.inputs), list(graph.outputs), count,
                             set(graph._names), graph._counter, graph.owner, graph.name,
                             dict(graph.subgraphs) if graph.subgraphs else None,
                             graph.parent, start))
        for region in regions:
            self._record(region)

    def restore(self) -> None:
        """Write every recorded slot back (copies, so the snapshot can be restored again)."""
        rec = self._records
        for (g, inputs, outputs, count, names, counter, owner, name, subgraphs, parent,
             i) in self._graphs:
            g.inputs, g.outputs, g._len, g._names = list(inputs), list(outputs), count, set(names)
            g._counter, g.owner, g.name, g._positions_valid = counter, owner, name, False
            g.subgraphs, g.parent = dict(subgraphs) if subgraphs else {}, parent
            for _ in inputs:
                i = self._restore_value(i, None, 0, g)
            prev = None
            for _ in range(count):
                n, n.op, n.attrs, n.region, meta, k = rec[i:i + 6]
                n.meta = dict(meta) if meta else {}
                n.inputs = rec[i + 6:i + 6 + k]
                i += 6 + k
                k, i = rec[i], i + 1
                n.outputs = []
                for index in range(k):
                    n.outputs.append(rec[i])
                    i = self._restore_value(i, n, index, g)
                n.graph, n.prev = g, prev
                if prev is None:
                    g.first = n
                else:
                    prev.next = n
                prev = n
            if prev is None:
                g.first = None
            else:
                prev.next = None
            g.last = prev

    def _restore_value(self, i: int, producer, index: int, graph: Graph) -> int:
        v, v.name, v.type, k = self._records[i:i + 4]
        v.producer, v.index, v.graph = producer, index, graph
        v.uses = self._records[i + 4:i + 4 + k]
        return i + 4 + k
