"""Where a reduction kernel's outputs go: which elements an output holds (P's, a row's,
another view of either) and the coordinates a writer stores it at, once per row or in the
last loop over the row. :class:`OutputPlacement` is a mixin of the value walk
(:class:`~torchloom.codegen.writer.ValueWalk`), so the cpu and triton writers and the
core's lowering place their outputs alike.

An output of ``f32[8, 512]`` reduced over dim 1 (P ``[8, 512]``)::

    f32[8, 512] (the input's shape)   "full"       stored in the last loop, at (x, r)
    f32[8, 1]   (keepdim)             "keepdim"    stored once per row, at (x, 0)
    f32[8]                            "row"        stored once per row, at (x,)
    f32[2, 4]                         "rows"       stored once per row, the row reshaped
    f32[512, 8] (P, transposed)       "full view"  stored in the last loop, in memory order
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torchloom.codegen.indexing import Coords, Unsupported, memory_order, prod, same, same_shape
from torchloom.ir import Value


class OutputPlacement:
    """Output placement of a reduction kernel's writer: it has ``reduction_nest`` (and its
    ``shape`` P, ``rdims``, ``kept_shape``: :class:`~torchloom.codegen.schedule.PlannedNest`),
    the coordinates ``full``, ``row`` and ``row_keepdim``, ``ix`` (its ``IndexMath``),
    ``known`` and ``tensor_type``."""

    def output_place(self, v: Value) -> str:
        """Which elements a reduction kernel's output ``v`` holds (of its nest's shape P, its
        rows, its elements): ``"full"`` (P's), ``"keepdim"``
        (a row's result, P with the reduced dims 1), ``"row"`` (the kept dims), ``"rows"``
        (another view of the rows), ``"full view"`` (another view of P: element i goes to
        i)."""
        shape = tuple(self.tensor_type(v).shape)
        if same_shape(shape, self.shape):
            return "full"
        if same_shape(shape, [1 if d in self.rdims else s for d, s in enumerate(self.shape)]):
            return "keepdim"
        if same_shape(shape, self.kept_shape):
            return "row"
        if same(prod(shape), self.reduction_nest.rows):
            return "rows"
        if same(prod(shape), self.reduction_nest.numel):
            return "full view"
        raise Unsupported(f"output %{v.name} of shape {list(shape)} has neither the elements "
                          f"of the reduced shape {list(self.shape)} nor those of a row")


    def place_output(self, v: Value) -> tuple[bool, Coords]:
        """Where a reduction kernel stores output ``v`` (:meth:`output_place`; the writer
        also has the coordinates ``full``, ``row``, ``row_keepdim``): (stored in the last
        loop over the row, at these coordinates)."""
        place = self.output_place(v)
        shape = tuple(self.tensor_type(v).shape)
        if place == "full":
            return True, self.full
        if place == "keepdim":
            return False, self.row_keepdim
        if place == "row":
            return False, self.row
        if place == "rows":
            return False, self.ix.reshape(self.row, self.kept_shape, shape, self.known)
        return True, self.view_coords(v, self.full)

    def element_coords(self, v: Value, full: Coords) -> Coords:
        """The coordinates of output ``v``, of P's elements in some view (``"full"`` or
        ``"full view"``), at P's element ``full`` (:meth:`view_coords` for another view)."""
        return full if self.output_place(v) == "full" else self.view_coords(v, full)

    def view_coords(self, v: Value, full: Coords) -> Coords:
        """The coordinates of output ``v``, another view of P, at P's element ``full``: P's
        element i goes to the output's i-th element in memory order, so a permuted output
        (a transposed gradient) reads its values at their own rows (in logical order, a
        row result would be read at other rows)."""
        shape = tuple(self.tensor_type(v).shape)
        order = memory_order(self.tensor_type(v))
        stored = self.ix.reshape(full, self.shape, [shape[d] for d in order], self.known)
        coords = [""] * len(shape)
        for k, d in enumerate(order):
            coords[d] = stored[k]
        return tuple(coords)

    def place_outputs(self, outputs: Iterable[tuple[Any, Value]],
                      store: Callable[[Any, Value, Coords], None]) -> list[tuple[Any, Value, Coords]]:
        """:meth:`place_output` of each (key, output) of ``outputs`` in turn: ``store(key, v,
        coords)`` at once for one stored once per row; returns the others, (key, v, coords)
        in order, for the last loop over the row."""
        last = []
        for key, v in outputs:
            in_loop, coords = self.place_output(v)
            if in_loop:
                last.append((key, v, coords))
            else:
                store(key, v, coords)
        return last
