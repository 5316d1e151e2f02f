"""Exact, cheap rollback of a graph for the pass manager.

Before every pass the manager records the *state* of the graph's existing objects (each
graph's fields, each node's and each value's slots, regions included) rather than
deep-copying the graph: no Node or Value is allocated, and the objects callers hold stay
the same objects after a rollback. Restoring writes every recorded slot back, so whatever
a pass did — edited input lists or use lists, swapped attrs, moved, erased or inserted
nodes, changed types — is undone; nodes the pass created are simply no longer linked.
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

    __slots__ = ("_graphs", "_records")

    def __init__(self, graph: Graph):
        self._graphs: list[tuple] = []
        self._records: list = []
        self._record(graph)

    def _record(self, graph: Graph) -> None:
        # Only what a pass could change and the order cannot tell: a node's ``prev``,
        # ``next`` and ``graph`` follow from the order of the records, a value's
        # ``producer``, ``index`` and ``graph`` from its place in its node's record.
        rec = self._records
        start, count, regions = len(rec), 0, []
        for v in graph.inputs:
            rec += (v, v.name, v.type, len(v.uses))
            rec += v.uses
        for n in graph.nodes:
            meta = n.meta
            rec += (n, n.op, n.attrs, n.region, dict(meta) if meta else None, len(n.inputs))
            rec += n.inputs
            outputs = n.outputs
            rec.append(len(outputs))
            for v in outputs:
                rec += (v, v.name, v.type, len(v.uses))
                rec += v.uses
            if n.region is not None:
                regions.append(n.region)
            count += 1
        self._graphs.append((graph, list(graph.inputs), list(graph.outputs), count,
                             set(graph._names), graph._counter, graph.owner, graph.name,
                             dict(graph.subgraphs), graph.parent, start))
        for region in regions:
            self._record(region)
        for sub in graph.subgraphs.values():  # shared subgraphs of a top-level graph
            self._record(sub)

    def restore(self) -> None:
        """Write every recorded slot back (copies, so the snapshot can be restored again)."""
        rec = self._records
        for (g, inputs, outputs, count, names, counter, owner, name, subgraphs, parent,
             i) in self._graphs:
            g.inputs, g.outputs, g._len, g._names = list(inputs), list(outputs), count, set(names)
            g._counter, g.owner, g.name, g._positions_valid = counter, owner, name, False
            g.subgraphs, g.parent = dict(subgraphs), parent
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
