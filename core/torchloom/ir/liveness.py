"""Liveness that counts graph outputs.

``value.uses`` lists the *nodes* reading a value; a value the graph returns is read by
the caller too, and ``graph.erase`` refuses a node whose result is returned
(``cannot erase %sigmoid: still used``: the forward of a training graph returns what the
backward saves). These helpers answer "may this go?" with both kinds of reader::

    readers(value)            # [<Node ...>, GraphOutput(graph, 2)]: nodes, then returns
    is_dead(value)            # no node reads it and the graph does not return it
    dead_nodes(nodes)         # of ``nodes`` (a matched subgraph), those erasable once
                              # their own readers among them are gone, users first

``slots`` (``graph.output_slots()``, kept current by passing it to
``graph.replace_uses``) answers "is it returned?" in O(1) instead of a scan of the
outputs, for a pass that asks once per node of a large graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from torchloom.ir.graph import Graph, Node, Value


@attrs.frozen
class GraphOutput:
    """A read of a value by its graph's ``return``, at output slot ``index``."""

    graph: Graph = attrs.field(eq=False)
    index: int


def readers(value: Value) -> list[Node | GraphOutput]:
    """Every reader of ``value``: the distinct nodes reading it, then one
    :class:`GraphOutput` per output slot of its graph returning it."""
    found: list[Node | GraphOutput] = list(value.users())
    graph = value.graph
    if graph is not None:
        found += [GraphOutput(graph, i) for i, v in enumerate(graph.outputs) if v is value]
    return found


def is_returned(value: Value, slots: Mapping[Value, Sequence[int]] | None = None) -> bool:
    """Whether ``value``'s graph returns it (through ``slots`` when given)."""
    if slots is not None:
        return bool(slots.get(value))
    graph = value.graph
    return graph is not None and any(v is value for v in graph.outputs)


def is_dead(value: Value, slots: Mapping[Value, Sequence[int]] | None = None) -> bool:
    """True when nothing reads ``value``: no node input and no graph output."""
    return not value.uses and not is_returned(value, slots)


def dead_nodes(nodes: Iterable[Node], slots: Mapping[Value, Sequence[int]] | None = None
               ) -> list[Node]:
    """Of ``nodes`` (given in topological order: a matched subgraph), those that can be
    erased together: none of their results is returned, and every node reading one is
    itself erasable. Users first, so ``graph.erase`` can take them one by one. One pass
    from the last node back: a node's readers among them are decided before it."""
    doomed: set[Node] = set()
    for node in reversed(list(dict.fromkeys(nodes))):
        if all(not is_returned(v, slots) and all(u in doomed for u in v.uses)
               for v in node.outputs):
            doomed.add(node)
    return [n for n in reversed(list(dict.fromkeys(nodes))) if n in doomed]


__all__ = ["GraphOutput", "dead_nodes", "is_dead", "is_returned", "readers"]
