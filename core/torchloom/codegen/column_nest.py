"""The column form's walks (:mod:`torchloom.codegen.columns`' plan), written once for every
target: :func:`walks` over a :class:`ColumnTarget`, which the ``cpu`` codegen (blocks of
columns under SIMD loops, its ``columns.py``) and the core's lowering (scalar loops over
every column, :mod:`torchloom.codegen.lower_columns`) each give.

Per walk of the plan: its reductions' accumulators (an array of one value per column,
started at the reduction's identity), one walk over the reduced elements (``r``, their
coordinates declared in it) and, for each, a loop over the columns (``x``) folding every
accumulator and storing the full-shape outputs (in the first walk, or in a walk of their
own after the last results where one reads a result); then a loop over the columns taking
each reduction's result (readable by later walks at the column, stored where it is an
output), and after the last results the outputs of a column's values::

    sum(g, dim=0) over f32[512, 64]:     acc_sum = {0, ...}
                                         Loop r in [0, 512): Loop x: acc_sum[x] += g[r, x]
                                         Loop x: Store out[x] = acc_sum[x]

Each column combines its elements in order, as the row form does: the same values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs

from torchloom.codegen.columns import PER_COLUMN, PER_ELEMENT, Columns
from torchloom.codegen.indexing import ZERO, Coords
from torchloom.codegen.schedule import ReductionNest
from torchloom.codegen.writer import Expr
from torchloom.ir import Node, Value


@attrs.frozen
class Accumulator:
    """A reduction's accumulators in a column walk: ``array`` (one value per column) of
    ``dtype`` (compute), combining with ``kind``; ``nan``: an array of NaN flags beside a
    max/min's, where the target keeps one (None: none)."""

    node: Node
    kind: str
    dtype: str
    array: str
    nan: str | None = None


class ColumnTarget(Protocol):
    """What :func:`walks` asks of a target: its index math (``ix``, ``known``), the value
    walk's output placement (``output_place``, ``element_coords``: an output's coordinates
    at a walk's element), ``store`` and ``set_result``, and how it writes the form's
    pieces."""

    ix: Any
    known: dict

    def inner_coords(self, index: str, shape) -> tuple[list, list]:
        """The coordinates of columns ``index`` over ``shape``: (the statements declaring
        them in each loop over the columns, the coordinates)."""

    def reduced_coords(self, index: str, shape) -> list:
        """The coordinates of the reduced element ``index`` over ``shape`` (declared once
        per element, where the target declares them), remembered as delinearised from
        ``index`` (reduced dims laid out end to end in memory are then read at ``r`` times
        the innermost's stride, not through the coordinates' divisions: channels-last N,
        H and W)."""

    def output_place(self, v: Value) -> str: ...

    def element_coords(self, v: Value, full: Coords) -> Coords:
        """Output ``v``'s coordinates at P's element ``full``: ``full`` itself, or for
        another view of P its element in memory order
        (``OutputPlacement.element_coords``)."""

    def store(self, key: Any, v: Value, coords: Coords) -> None: ...

    def set_result(self, value: Value, coords: Coords, e: Expr) -> None: ...

    def accumulators(self, nodes: Sequence[Node]) -> list[Accumulator]:
        """The walk's accumulators for ``nodes``, declared and started."""

    def over_reduced(self, write: Callable[[], None], rows: tuple[str, str] | None) -> None:
        """``write()``'s statements in a loop over the reduced elements (``rows``: its
        first and past-the-last element, default all)."""

    def begin_columns(self) -> None:
        """Open a loop over the columns."""

    def end_columns(self, header: list) -> None:
        """Close it, ``header`` declaring a column's coordinates first."""

    def fold(self, acc: Accumulator, full: Coords) -> None:
        """Reduction ``acc.node``'s input at element ``full`` folded into its column's
        accumulator."""

    def result(self, acc: Accumulator) -> Expr:
        """The reduction's result at the column, as a value a later walk may read at that
        column (the cpu writes it back to its array where anything reads it; the lowering
        computes it again from the accumulator where it is read)."""


def walks(target: ColumnTarget, plan: Columns, nest: ReductionNest,
          outputs: Sequence[tuple[Any, Value]]) -> None:
    """The walks of ``plan`` over ``nest``, storing ``outputs`` (key, value)."""
    header, xs = target.inner_coords("x", nest.kept_shape)
    kept = column_of(nest, xs)
    members = {node for nodes in plan.walks for node in nodes}
    full_outputs = stored_per_element(target, members, outputs)
    for level, nodes in enumerate(plan.walks):
        accs = target.accumulators(nodes)
        walk(target, nest, accs, kept, header, full_outputs if level == 0 and not plan.late
             else [])
        results(target, nest, accs, xs, header, outputs,
                members if level == len(plan.walks) - 1 else None)
    if plan.late:
        walk(target, nest, [], kept, header, full_outputs)


def stored_per_element(target: ColumnTarget, reductions: set[Node],
                       outputs: Sequence[tuple[Any, Value]]) -> list[tuple[Any, Value]]:
    """The ``outputs`` (key, value) a walk stores at each of its elements: those none of
    ``reductions`` computes, of P's elements in some view (:data:`PER_ELEMENT`)."""
    return [(key, v) for key, v in outputs
            if v.producer not in reductions and target.output_place(v) in PER_ELEMENT]


def column_of(nest: ReductionNest, xs: Sequence[Any]) -> list:
    """The coordinates of the full shape's elements at the column ``xs``, the reduced
    dims' left for a walk to set."""
    kept: list[Any] = [ZERO] * len(nest.shape)
    for d, c in zip(nest.kept, xs):
        kept[d] = c
    return kept


def result_coords(nest: ReductionNest, xs: Sequence[Any], keepdim: bool) -> tuple:
    """The coordinates of a column's result at the column ``xs``: the kept dims', or with
    ``keepdim`` the full shape's with the reduced dims 0."""
    if not keepdim:
        return tuple(xs)
    return tuple(ZERO if d in nest.rdims else c for d, c in enumerate(column_of(nest, xs)))


def walk(target: ColumnTarget, nest: ReductionNest, accs: Sequence[Accumulator],
         kept: Sequence[Any], header: list, stores: Sequence[tuple[Any, Value]],
         rows: tuple[str, str] | None = None) -> None:
    """One walk over the reduced elements (``rows``: the first and past-the-last walked,
    default all) and, for each, the columns: ``accs`` folded, ``stores`` stored at the
    element (at their coordinates there)."""

    def write() -> None:
        coords = list(kept)
        for d, c in zip(nest.rdims, target.reduced_coords("r", nest.red_shape)):
            coords[d] = c
        full = tuple(coords)
        target.begin_columns()
        for acc in accs:
            target.fold(acc, full)
        for key, v in stores:
            target.store(key, v, target.element_coords(v, full))
        target.end_columns(header)

    target.over_reduced(write, rows)


def results(target: ColumnTarget, nest: ReductionNest, accs: Sequence[Accumulator],
            xs: Sequence[Any], header: list, outputs: Sequence[tuple[Any, Value]],
            last: set[Node] | None) -> None:
    """One loop over the columns: each reduction's result (recorded for what reads it,
    stored where it is one of ``outputs``); after the last walk (``last``: every
    reduction of the nest), the outputs of a column's values (:data:`PER_COLUMN`) that no
    reduction computes too."""
    keepdim = result_coords(nest, xs, True)
    target.begin_columns()
    for acc in accs:
        (value,) = acc.node.outputs
        coords = keepdim if acc.node.attrs.get("keepdim", False) else tuple(xs)
        target.set_result(value, coords, target.result(acc))
        for key, out in outputs:
            if out is value:
                target.store(key, out, coords)
    for key, out in outputs if last is not None else ():
        place = target.output_place(out)
        if out.producer not in last and place in PER_COLUMN:
            target.store(key, out, tuple(xs) if place == "row" else keepdim)
    target.end_columns(header)
