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

    Records go into three flat lists (a count followed by the items for every list
    slot) so that taking a snapshot allocates no per-node container: that keeps it linear
    in the graph's size instead of waking Python's cyclic garbage collector every few
    hundred nodes.
    """

    __slots__ = ("_graphs", "_nodes", "_values")

    def __init__(self, graph: Graph):
        self._graphs: list = []
        self._nodes: list = []
        self._values: list = []
        self._record(graph)

    def _record(self, graph: Graph) -> None:
        self._graphs.append((graph, list(graph.inputs), list(graph.outputs), graph.first,
                             graph.last, graph._len, set(graph._names), graph._counter,
                             graph.owner, graph.name, dict(graph.subgraphs), graph.parent))
        nodes, values = self._nodes, self._values
        for v in graph.inputs:
            values += (v, v.name, v.type, v.producer, v.index, v.graph, len(v.uses))
            values += v.uses
        for n in graph.nodes:
            meta = n.meta
            nodes += (n, n.op, n.attrs, n.region, n.graph, n.prev, n.next,
                      dict(meta) if meta else None, len(n.inputs))
            nodes += n.inputs
            nodes.append(len(n.outputs))
            nodes += n.outputs
            for v in n.outputs:
                values += (v, v.name, v.type, v.producer, v.index, v.graph, len(v.uses))
                values += v.uses
            if n.region is not None:
                self._record(n.region)
        for sub in graph.subgraphs.values():  # shared subgraphs of a top-level graph
            self._record(sub)

    def restore(self) -> None:
        """Write every recorded slot back (copies, so the snapshot can be restored again)."""
        for (g, inputs, outputs, first, last, length, names, counter, owner,
             name, subgraphs, parent) in self._graphs:
            g.inputs, g.outputs, g.first, g.last = list(inputs), list(outputs), first, last
            g._len, g._names, g._counter = length, set(names), counter
            g.owner, g.name, g._positions_valid = owner, name, False
            g.subgraphs, g.parent = dict(subgraphs), parent
        nodes, i = self._nodes, 0
        while i < len(nodes):
            n, n.op, n.attrs, n.region, n.graph, n.prev, n.next, meta, k = nodes[i:i + 9]
            n.meta = dict(meta) if meta else {}
            i += 9
            n.inputs = nodes[i:i + k]
            i += k
            k = nodes[i]
            n.outputs = nodes[i + 1:i + 1 + k]
            i += 1 + k
        values, i = self._values, 0
        while i < len(values):
            v, v.name, v.type, v.producer, v.index, v.graph, k = values[i:i + 7]
            v.uses = values[i + 7:i + 7 + k]
            i += 7 + k
