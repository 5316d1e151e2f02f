"""The kernel schedule, target-independent: what a fusion group's loop nests are, computed
once as frozen data that every codegen renders (see DESIGN.md, "Codegen and runtime").

This module holds the first piece, the shape of a reduction nest: the shape ``P`` that
every reduction of the nest reads, the dims it reduces and keeps, and the counts a
renderer loops over. A row reduction of ``f32[8, 512]`` over dim 1::

    ReductionNest(shape=(8, 512), rdims=(1,))
      kept (0,), kept_shape [8], red_shape [512], rows 8, rnumel 512, numel 4096

A column reduction (``sum(g, dim=0)`` of ``[512, 1024]``) has its kept dims innermost
(:attr:`ReductionNest.columns`). Sizes may be symbols (:mod:`torchloom.ir.symbols`).

What the native writers (``cpu``, ``triton``) read from here rather than derive each:
:func:`nest_classes` (the nests of a group whose reductions differ), :meth:`ReductionNest.of`
(one nest's plan), :meth:`ReductionNest.coordinates` (a row's coordinates from the kept
and reduced dims' names), :class:`RowsAndColumns` (two nests of one shape, one reducing
its rows and one its columns, written as one kernel), :func:`max_shift` (softmax's
``a - max(a)``: cpu's cheaper exp, triton's online rows), :func:`elementwise_numel` (a
pointwise kernel's element count) and :class:`PlannedNest` (a writer's fields over its
nest).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import attrs

from torchloom.codegen.expr import Code
from torchloom.codegen.indexing import ZERO, Coords, Unsupported, node, prod, same
from torchloom.codegen.writer import reduced_dims, same_shape, upstream_nodes
from torchloom.ir import Node, Value


@attrs.frozen
class ReductionNest:
    """The loop nest every reduction of a nest shares: input shape ``shape`` (P), the dims
    it reduces (``rdims``, sorted) and those it keeps."""

    shape: tuple[Any, ...]
    rdims: tuple[int, ...]

    @classmethod
    def of(cls, reductions: Sequence[Node], tensor_type: Callable[[Any], Any]
           ) -> ReductionNest:
        """The nest of ``reductions`` (their inputs' types read by ``tensor_type``);
        :class:`Unsupported` when they reduce different shapes or dims."""
        first = reductions[0]
        shape = tuple(tensor_type(first.inputs[0]).shape)
        rdims = reduced_dims(first, len(shape))
        for n in reductions[1:]:
            other = tuple(tensor_type(n.inputs[0]).shape)
            if not same_shape(other, shape) or reduced_dims(n, len(other)) != rdims:
                raise Unsupported(f"reductions over different shapes or dims "
                                  f"({first.op} and {n.op})")
        return cls(shape, rdims)

    def coordinates(self, xs: Sequence[Code | str], rs: Sequence[Code | str]
                    ) -> tuple[Coords, Coords, Coords]:
        """(``full``, ``row``, ``row_keepdim``): the coordinates of element (x, r) of P from
        the names of the kept dims' coordinates ``xs`` and the reduced dims' ``rs``, of row
        x, and of row x with the reduced dims kept as 0 (keepdim results)."""
        xs, rs = [node(c) for c in xs], [node(c) for c in rs]
        full: list[Code] = [ZERO] * len(self.shape)
        for d, c in zip(self.kept, xs):
            full[d] = c
        for d, c in zip(self.rdims, rs):
            full[d] = c
        row_keepdim = tuple(ZERO if d in self.rdims else full[d] for d in range(len(self.shape)))
        return tuple(full), tuple(xs), row_keepdim

    @property
    def kept(self) -> list[int]:
        return [d for d in range(len(self.shape)) if d not in self.rdims]

    @property
    def kept_shape(self) -> list[Any]:
        return [self.shape[d] for d in self.kept]

    @property
    def red_shape(self) -> list[Any]:
        return [self.shape[d] for d in self.rdims]

    @property
    def rows(self) -> Any:
        """Elements of the kept dims: one row per combination."""
        return prod(self.kept_shape)

    @property
    def rnumel(self) -> Any:
        """Elements of a row (the reduced dims)."""
        return prod(self.red_shape)

    @property
    def numel(self) -> Any:
        return prod([self.rows, self.rnumel])

    @property
    def columns(self) -> bool:
        """Whether the kept dims end innermost: each row is read with a stride (a column
        reduction), where a renderer walks the rows in memory order instead; never for a
        nest that reduces nothing (a pointwise writer's)."""
        kept = self.kept
        return bool(self.rdims) and bool(kept) and kept[-1] == len(self.shape) - 1


def nest_classes(reductions: Sequence[Node], shape_of: Callable[[Any], Any]
                 ) -> list[list[Node]]:
    """``reductions`` grouped by (input shape, reduced dims), in order of first appearance:
    one class per nest (a ``several_nests`` group has more than one); ``shape_of`` reads
    a value's shape."""
    classes: dict[tuple, list[Node]] = {}
    for n in reductions:
        shape = tuple(shape_of(n.inputs[0]))
        classes.setdefault((shape, reduced_dims(n, len(shape))), []).append(n)
    return list(classes.values())


@attrs.frozen
class RowsAndColumns:
    """One shape P reduced both ways in one kernel, the row + column form (a layer norm's
    backward: per row the statistics of the input gradient, per column the weight and bias
    gradients, from one read of P): ``rows``, the reductions whose reduced dims hold P's
    last; ``columns``, those reducing the other dims, dim 0 among them; between them they
    reduce every dim of P once. Planned here, once, for every codegen (:meth:`of`); each
    renders it under conditions of its own in its ``rows_and_columns.py`` (cpu: column sums
    carried by a row nest of whole vectors; triton: rows held whole by one program).
    ``sum`` of ``f32[R, C]`` over dim 1 and over dim 0::

        RowsAndColumns(shape=(R, C), rows=(<sum dim [1]>,), columns=(<sum dim [0]>,))
          row_nest ReductionNest((R, C), (1,)), column_nest ReductionNest((R, C), (0,))"""

    shape: tuple[Any, ...]
    rows: tuple[Node, ...]
    columns: tuple[Node, ...]

    @classmethod
    def of(cls, reductions: Sequence[Node], shape_of: Callable[[Any], Any]
           ) -> RowsAndColumns | None:
        """The row + column plan of ``reductions`` (``shape_of`` reads a value's shape), or
        None when they are not two nests of this form."""
        classes = nest_classes(reductions, shape_of)
        if len(classes) != 2:
            return None
        (shape, a_dims), (other, b_dims) = (_signature(c[0], shape_of) for c in classes)
        if shape != other or not a_dims or not b_dims:
            return None
        rank = len(shape)
        if sorted(a_dims + b_dims) != list(range(rank)):
            return None
        rows, columns = classes if a_dims[-1] == rank - 1 else classes[::-1]
        if reduced_dims(columns[0], rank)[0] != 0:
            return None
        return cls(shape, tuple(rows), tuple(columns))

    @property
    def row_nest(self) -> ReductionNest:
        return ReductionNest(self.shape, reduced_dims(self.rows[0], len(self.shape)))

    @property
    def column_nest(self) -> ReductionNest:
        return ReductionNest(self.shape, reduced_dims(self.columns[0], len(self.shape)))

    @property
    def trailing(self) -> bool:
        """Whether the rows reduce P's innermost dims, a run (and so the columns its
        outermost ones): each row lies whole in memory."""
        rdims, rank = self.row_nest.rdims, len(self.shape)
        return rdims == tuple(range(rank - len(rdims), rank))


def _signature(n: Node, shape_of: Callable[[Any], Any]) -> tuple[tuple, tuple[int, ...]]:
    """(input shape, reduced dims) of reduction ``n``: its nest's."""
    shape = tuple(shape_of(n.inputs[0]))
    return shape, reduced_dims(n, len(shape))


#: reductions whose keepdim result is >= every element it reduced (or NaN) -> that output
_MAXIMA = {"aten.amax.default": 0, "aten.max.dim": 0}


def reductions_read(node: Node, reductions: Collection[Node]) -> set[Node]:
    """The reductions of ``reductions`` that ``node``'s input is computed from inside the
    region (softmax's sum of ``exp(x - max)`` reads the max)."""
    return upstream_nodes(node.inputs[:1]) & set(reductions)


def levels(reductions: Sequence[Node]) -> list[list[Node]]:
    """``reductions`` by pass over the rows: one reading another's result comes in a
    pass after it (softmax: the max, then the sum of ``exp(x - max)``); each level in
    the order ``reductions`` lists them. cpu's column walks and triton's looped passes."""
    members, level = set(reductions), {}

    def of(n: Node) -> int:  # (whatever the list's order)
        if n not in level:
            level[n] = 1 + max((of(m) for m in reductions_read(n, members)), default=-1)
        return level[n]
    depth = max((of(n) for n in reductions), default=0)
    return [[n for n in reductions if level[n] == k] for k in range(depth + 1)]


def max_shift(v: Value) -> Node | None:
    """The maximum ``m`` when ``v`` is softmax's shift ``a - m(a)``: ``sub.Tensor(a, m)``
    with alpha 1, ``m`` the keepdim maxima (``amax``, or ``max.dim``'s values) of that same
    ``a``, so every element of ``v`` is <= 0 or NaN; else None. The cpu codegen takes a
    cheaper exp of such a value, triton's looped rows accumulate ``sum(exp(v))`` online
    beside ``m`` (the shape and dtype each needs are its own to check)."""
    node = v.producer
    if node is None or node.op != "aten.sub.Tensor" or node.attrs.get("alpha", 1) != 1 or \
            len(node.inputs) != 2:  # (a scalar other is an attribute)
        return None
    a, m = node.inputs
    top = m.producer
    if top is None or _MAXIMA.get(top.op) != m.index or not top.attrs.get("keepdim", False):
        return None
    return top if top.inputs[0] is a else None


def elementwise_numel(shapes: Sequence[Sequence[Any]],
                      shown: Sequence[Sequence[Any]] | None = None) -> Any:
    """The element count of a pointwise kernel writing outputs of ``shapes`` (the first
    output's); :class:`Unsupported` when they differ (``shown``: the shapes the reason
    names, when ``shapes`` are rewritten ones)."""
    shown = shapes if shown is None else shown
    numel = prod(shapes[0])
    for shape, given in zip(shapes, shown):
        if not same(prod(shape), numel):
            raise Unsupported(f"pointwise outputs with different element counts "
                              f"{list(shown[0])} and {list(given)}")
    return numel


class PlannedNest:
    """A kernel writer's fields over the nest it writes, ``reduction_nest`` (mixed into the
    native writers, which set it once): P's ``shape``, ``rdims``, ``kept``, ``kept_shape``,
    ``red_shape`` and a row's length ``rnumel``. A pointwise writer's nest reduces nothing
    (``rdims`` empty)."""

    reduction_nest: ReductionNest = ReductionNest((), ())

    @property
    def shape(self) -> tuple[Any, ...]:
        return self.reduction_nest.shape

    @property
    def rdims(self) -> tuple[int, ...]:
        return self.reduction_nest.rdims

    @property
    def kept(self) -> list[int]:
        return self.reduction_nest.kept

    @property
    def kept_shape(self) -> list[Any]:
        return self.reduction_nest.kept_shape

    @property
    def red_shape(self) -> list[Any]:
        return self.reduction_nest.red_shape

    @property
    def rnumel(self) -> Any:
        return self.reduction_nest.rnumel
