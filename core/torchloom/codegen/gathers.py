"""Gathers: ops reading rows of a table at indices a tensor holds.

An embedding's element ``(i..., j)`` is ``weight[ids[i...], j]``. A target that takes
gathers (``GATHERS`` of its value walk) checks each index as eager does
(:meth:`torchloom.codegen.writer.ValueWalk.checked_index`): every index of a group's
gathers, whether or not an output reads the gathered row (eager raises for an index out of
range even where the result is multiplied into an empty tensor), so the indices to check are
read off the region (:func:`gathered_rows`), never off the values a walk visits.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from torchloom.ir.graph import Graph, Node, Value

#: the gather ops
GATHER_OPS = frozenset({"aten.embedding.default"})


def gathered_rows(region: Graph) -> dict[Value, int]:
    """Each value the gathers of ``region`` read indices from -> the fewest rows of a
    table read at them (an index is in range where it is below that), in region order."""
    rows: dict[Value, int] = {}
    for node in region.nodes:
        if node.op in GATHER_OPS:
            ids, n = node.inputs[1], node.inputs[0].type.shape[0]
            rows[ids] = min(n, rows.get(ids, n))
    return rows


def input_read_bytes(v: Value, tables: Collection[Value], readers: Iterable[Node],
                     size: Callable[[Value], int]) -> int:
    """The bytes of ``v`` (known as ``tables``: it and the region inputs bound to it) its
    ``readers`` must read: all of it (``size(v)``), but of a table only gathers read, the
    rows they make (``size`` of their results), at most the table."""
    whole, rows, gathers = size(v), 0, False
    for g in readers:
        if g.op not in GATHER_OPS or g.inputs[0] not in tables or \
                any(x in tables for x in g.inputs[1:]):
            return whole
        rows, gathers = rows + size(g.outputs[0]), True
    return min(whole, rows) if gathers else whole
