"""A reduction nest's row form, written once for every target: :class:`RowForm`, mixed into
the ``cpu`` and ``triton`` codegens' kernel writers and the core's lowering
(:mod:`torchloom.codegen.lower`).

A row is one element of the nest's kept dims (``x``; a GPU program takes a block of rows),
its elements the reduced dims' (``r``). Per row: the row's coordinates, then its
reductions (each target its own loops over the row: the cpu one SIMD loop per reduction
with its numerics, triton a block reduction over a row's lanes per reduction or its looped
passes, the lowering one loop per level of reductions), then the outputs stored once per
row (a row's shape: a reduction's result, values computed from results), and, where the
nest has outputs of its own shape or carries column sums (the row + column form), one
last loop over the row storing those and adding each column sum's operand::

    sum(a, dim=1) and a - mean over f32[8, 20]:    row x: coordinates of x and r
                                                     <reductions over r>
                                                     Store s[x] = ...
                                                     Loop r in [0, 20): Store d[x, r] = ...

What the writer gives (each target its own way): ``row_coords`` and
``inner_coords`` (:mod:`.walk_nest`'s), ``begin_reductions`` (what a target readies once
the row's coordinates are known: the cpu's row buffers and blocks of lanes),
``reduce_row`` (the reductions: their results recorded for what reads them),
``place_outputs`` and ``store`` (:class:`~torchloom.codegen.placement.OutputPlacement`'s),
``carries_columns``, ``begin_row_loop``, ``carry`` and ``end_row_loop`` (the last loop over
the row: a SIMD loop, a scalar one).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torchloom.codegen.indexing import Coords
from torchloom.codegen.schedule import ReductionNest
from torchloom.ir import Value


class RowForm:
    """A reduction nest's row (see the module docstring); mixed into a target's writer,
    which gives the methods the docstring names. Sets the writer's ``full``, ``row`` and
    ``row_keepdim``: the coordinates of element ``(x, r)``, of row ``x``, and of row ``x``
    with the reduced dims kept as 0 (keepdim results)."""

    full: Coords | None
    row: Coords | None
    row_keepdim: Coords | None

    def row_coordinates(self, nest: ReductionNest) -> tuple[list, list, list]:
        """The row's coordinates (``x``), and a row's element's (``r``): (``xs``, the
        statements that declare ``r``'s in each loop over the row, ``rs``); sets ``full``,
        ``row`` and ``row_keepdim``."""
        xs = self.row_coords("x", nest.kept_shape)
        header, rs = self.inner_coords("r", nest.red_shape)
        self.full, self.row, self.row_keepdim = nest.coordinates(xs, rs)
        return xs, header, rs

    def row_form(self, nest: ReductionNest, outputs: Iterable[tuple[Any, Value]]) -> bool:
        """One row of ``nest``'s statements, storing ``outputs`` (key, value) where they
        are placed; whether it ends in a loop over the row (outputs of the nest's shape, or
        column sums carried)."""
        self.begin_reductions(*self.row_coordinates(nest))
        self.reduce_row()
        last = self.place_outputs(outputs, self.store)
        if not (last or self.carries_columns()):
            return False
        self.begin_row_loop()
        for key, v, coords in last:
            self.store(key, v, coords)
        self.carry()
        self.end_row_loop()
        return True
