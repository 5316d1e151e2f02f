"""A pointwise nest's loops, written once for every target: :class:`WalkNest`, mixed into
the ``cpu`` codegen's kernel writer and the core's lowering (:mod:`torchloom.codegen.lower_walks`).

The nest walks its :class:`~torchloom.codegen.walks.Walk` (turned where its rows are too
short, :func:`tiles.turned`): a loop ``x`` over its rows and in it a loop ``j`` over a
row, whose values not read at ``j`` are computed once per row, before it. A target that
runs rows on threads cuts long rows into chunks (:class:`RowChunks`) so that one long row
still spreads over them: ``x`` then counts (row, chunk) pairs, ``row`` the row and ``j``
runs over the chunk ``[j0, j1)``. A flat walk is one row of every element, cut into
chunks alike, an element's coordinates declared in the loop over it where a read needs
them. Rows read across by an input are walked in tiles (:func:`tiles.tile_rows`)::

    f32[64, 300] = tanh(a + b[:, None]):          Loop x in [0, 64): Loop j in [0, 300): ...
    the same over f32[2, 10000], chunks of 4096:  Loop x in [0, 6):
                                                    row = x / 3; j0 = x % 3 * 4096
                                                    j1 = min(j0 + 4096, 10000)
                                                    Loop j in [j0, j1): ...

The same for every target: coordinates are declared, once per row (``x0 = x / 8``:
:meth:`WalkNest.row_coords`) or at the top of each loop over an inner index
(``j0 = j / 300``: :meth:`WalkNest.inner_coords`, the names then said to depend on it: a
value read at them stays in the loop), and the reduction forms read them too
(:mod:`.row_form`, :mod:`.column_nest`); a row's statements are a scope of the writer's
:class:`~torchloom.codegen.statements.Statements` and the loop over it a phase
(:meth:`WalkNest.begin_inner`: what is not read at ``j`` goes before it), annotated with
the target's ``ROW_LOOP`` (the cpu's SIMD pragma).

What the writer gives (each target its own way): ``region``, ``registry``,
``tensor_type`` and ``read_back`` (the values earlier nests stored), ``ix`` and ``known``
(its index math), ``row_values`` and ``row_walks`` (empty, filled by
:meth:`WalkNest.row_coords`), ``em`` (its statements), ``store``, and ``smaller`` with
``INDEX`` (the target's minimum of two indices, its index type); its choices are data:
``CHUNK`` and ``FLAT_CHUNK`` (rows cut into chunks: :class:`RowChunks`), ``ROW_LOOP``; it
may override ``walk_index`` (the linear index of the walk's element) and
``writes_tiles``.
The loop ``x`` may run a single trip (a flat walk, one dim, no dims): a target's threads
or vectors that need many go on ``j`` or on chunks of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from torchloom.codegen import expr, stmt, tiles
from torchloom.codegen.expr import Code, Name
from torchloom.codegen.indexing import ZERO, Coords, Unsupported, is_zero, prod
from torchloom.codegen.samples import same
from torchloom.codegen.walks import Walk
from torchloom.ir import Value


@attrs.frozen
class RowChunks:
    """A walk's rows in chunks of ``size`` elements, ``count`` chunks a row (an int, or a
    size expression for symbolic rows); ``cut``: whether rows are cut at all (else a row
    is one chunk, or none for rows of no elements)."""

    size: Any
    count: Any
    cut: bool

    @classmethod
    def of(cls, walk: Walk, chunk: int | None, flat_chunk: int | None) -> RowChunks:
        """Rows of ``walk`` cut into chunks of ``chunk`` elements where longer than two
        chunks (a flat walk's one row: into chunks of ``flat_chunk``; symbolic rows:
        always, counted at run time); None for either: rows whole."""
        inner = walk.inner
        whole = chunk is None if not walk.flat else flat_chunk is None
        if not isinstance(inner, int):
            return cls(chunk, f"CeilDiv({inner}, {chunk})", True) if not whole else \
                cls(inner, 1, False)
        if whole:
            size = inner
        elif walk.flat:
            size = min(inner, flat_chunk)
        else:
            size = inner if inner <= 2 * chunk else chunk
        count = -(-inner // size) if inner else 0
        return cls(size, count, count > 1)

    def trips(self, walk: Walk) -> Any:
        """The loop ``x``'s trip count: (row, chunk) pairs."""
        return prod([walk.rows, self.count])


@attrs.frozen
class Walked:
    """A pointwise nest written (:meth:`WalkNest.walk_outputs`): its ``rows`` ((row, chunk)
    pairs), and the loop over them: its variable ``var`` (``x``; ``xt`` over tiles), its
    ``trips`` and its ``body`` (a row's statements, or a tile's)."""

    rows: Any
    var: str
    trips: Any
    body: list


class WalkNest:
    """A pointwise nest's loops over its walk (see the module docstring); mixed into a
    target's writer, which gives the methods the docstring names."""

    INDEX = "int64_t"
    #: rows cut into chunks of ``CHUNK`` elements where longer than two chunks, a flat
    #: walk's one row into chunks of ``FLAT_CHUNK`` (a target running rows on threads);
    #: None: rows whole (:meth:`RowChunks.of`)
    CHUNK: int | None = None
    FLAT_CHUNK: int | None = None
    #: the annotation of the loop over a row (``j``; the cpu's SIMD pragma): None, none
    ROW_LOOP: Any = None
    #: the row coordinates' names -> their index math (``x0`` -> ``x / 8``)
    row_values: dict[str, Code]
    #: (index, shape) of each walk whose row coordinates were declared
    row_walks: list[tuple[str, tuple]]

    # ---- coordinates -------------------------------------------------------------------
    def declared_coords(self, index: str, shape: Sequence[Any], prefix: str
                        ) -> tuple[list[stmt.Declare], list[Code]]:
        """The coordinates of linear index ``index`` over ``shape``, each that is neither 0
        nor ``index`` itself a name ``{prefix}{k}`` (``k``: its dim): (their declarations,
        the coordinates), remembered as delinearised from ``index``."""
        declared, names = [], []
        for k, c in enumerate(self.ix.delinear(index, shape)):
            if is_zero(c) or c == Name(index):
                names.append(c)
                continue
            declared.append(stmt.Declare(self.INDEX, f"{prefix}{k}", c))
            names.append(Name(f"{prefix}{k}"))
        self.ix.remember(self.known, names, shape, index)
        return declared, names

    def row_coords(self, index: str, shape: Sequence[Any]) -> list[Code]:
        """The coordinates of row ``index`` over ``shape`` (``x0 = x / 8 % 4``), declared
        among the row's statements; also read by :meth:`coordinate_values`."""
        self.row_walks.append((index, tuple(shape)))
        declared, names = self.declared_coords(index, shape, "x")
        for d in declared:
            self.row_statement(d)
            self.row_values[d.name] = d.expr
        return names

    def reduced_coords(self, index: str, shape: Sequence[Any]) -> list[Code]:
        """The coordinates of reduced element ``index`` over ``shape`` (``r0 = r / 8``),
        declared among the statements of the loop over it (a column walk's)."""
        declared, names = self.declared_coords(index, shape, index)
        for d in declared:
            self.row_statement(d)
        return names

    def inner_coords(self, index: str, shape: Sequence[Any]) -> tuple[list[stmt.Declare],
                                                                       list[Code]]:
        """The coordinates of inner index ``index`` (``r`` over a row, ``x`` over a column
        walk's columns, ``j`` over a flat walk), declared in each loop over it: (their
        declarations, the coordinates); they depend on ``index``."""
        self.em.inner(index)
        declared, names = self.declared_coords(index, shape, index)
        for d in declared:
            self.em.inner(d.name)
        return declared, names

    def coordinate_values(self) -> dict[str, Code]:
        return self.row_values

    # ---- a row and the loop over it ----------------------------------------------------
    def begin_row(self) -> None:
        """Open a row's statements (a scope of the writer's statements)."""
        self.em.open()

    def row_statement(self, statement: Any) -> None:
        """``statement`` among the row's (before the loop over it)."""
        self.em.statement(statement, False)

    def end_row(self) -> list:
        """Close the row: its statements."""
        return self.em.close()

    def begin_inner(self, index: str) -> None:
        """Open the loop over a row: a phase over ``index`` (statements that read no name
        depending on it go before the loop)."""
        self.em.inner(index)
        self.em.open_phase()

    def end_inner(self, index: str, start: str, end: str, header: list) -> stmt.Loop:
        """Close it: the loop of ``index`` over ``[start, end)``, ``header`` (its
        coordinates' declarations) first in it, among the row's statements."""
        body = self.em.close_phase()
        loop = stmt.Loop(index, start, end, tuple(body), tuple(header), self.ROW_LOOP)
        self.em.statement(loop, False)
        return loop

    def walk_outputs(self, outputs: Sequence[tuple[str, Value]]) -> Walked:
        """The nest storing ``outputs`` (pointer, value): its walk planned
        (:meth:`planned_walk`), its rows cut into the target's chunks, the loop over them."""
        walk = self.planned_walk([v for _, v in outputs])
        chunks = RowChunks.of(walk, self.CHUNK, self.FLAT_CHUNK)
        return Walked(chunks.trips(walk), *self.walk_rows(outputs, walk, chunks))

    def planned_walk(self, outputs: Sequence[Value]) -> Walk:
        """The walk of a nest storing ``outputs``: the schedule's, turned where its rows
        are too short and an input is read across them (:func:`tiles.turned`)."""
        planned = Walk.of(outputs, self.tensor_type)
        return tiles.turned(planned, lambda: self.tile_plan(outputs, planned.order[-1]))

    def tile_plan(self, outputs: Sequence[Value], d0: int) -> tiles.Tiles | None:
        """The tile plan of a walk of ``outputs`` with innermost dim ``d0``
        (:func:`tiles.across`; the values earlier nests stored, ``read_back``, read from
        memory)."""
        return tiles.across(self.region, self.registry, self.tensor_type, outputs, d0,
                            list(self.read_back))

    def walk_rows(self, outputs: Sequence[tuple[str, Value]], walk: Walk, chunks: RowChunks
                  ) -> tuple[str, Any, list]:
        """The walk's loop over rows, storing ``outputs`` (pointer, value) at each element:
        (its variable, its trip count, its body)."""
        size = self.ix.size_code
        sizes, order, inner = walk.sizes, walk.order, walk.inner
        self.begin_row()
        if chunks.cut:
            count, end = expr.paren(size(chunks.count)), expr.paren(size(inner))
            self.row_statement(stmt.Declare(self.INDEX, "row", expr.over("x", count)))
            self.row_statement(stmt.Declare(self.INDEX, "j0", expr.times(
                expr.modulo("x", count), chunks.size)))
            self.row_statement(stmt.Declare(self.INDEX, "j1", self.smaller(
                expr.plus("j0", chunks.size), end)))
            row, bounds = "row", ("j0", "j1")
        else:
            row, bounds = "x", ("0", str(size(inner)))
        header: list = []
        if walk.flat:  # the element's coordinates, declared per element where a read needs them
            header, logical = self.inner_coords("j", walk.shape)
        else:
            walked = [*self.row_coords(row, sizes[:-1]), Name("j") if inner != 1 else ZERO]
            self.ix.remember(self.known, walked, sizes, self.walk_index(row, sizes))
            logical = [ZERO] * len(order)
            for d, c in zip(order, walked):
                logical[d] = c
        self.begin_inner("j")
        for pointer, v in outputs:
            self.store(pointer, v, self._walked(v, walk.shape, tuple(logical)))
        row_loop = self.end_inner("j", *bounds, header)
        lines = self.end_row()

        def plan() -> tiles.Tiles | None:  # (asked last: it probes the group)
            return self.tile_plan([v for _, v in outputs], order[-1])
        tiled = None if chunks.cut or walk.flat or not self.writes_tiles() else tiles.tile_rows(
            sizes, lines, row_loop, plan, self.smaller, self.INDEX)
        if tiled is not None:
            return "xt", tiled[0], tiled[1]
        return "x", chunks.trips(walk), lines

    def walk_index(self, row: str, sizes: Sequence[Any]) -> str:
        """The linear index of the walk's element ``(row, j)`` (``sizes``: the walk's)."""
        if prod(list(sizes[:-1])) == 1:
            return "j"
        return f"{row} * {expr.par(self.ix.size_code(sizes[-1]))} + j"

    def _walked(self, v: Value, shape: tuple, coords: Coords) -> Coords:
        """Output ``v``'s coordinates at the walk's element ``coords`` (of ``shape``): the
        same, or reshaped where ``v`` has as many elements in another shape."""
        out = tuple(self.tensor_type(v).shape)
        if out == tuple(shape):
            return coords
        if not same(prod(out), prod(shape)):
            raise Unsupported(f"output %{v.name} of shape {list(out)} is not walked by "
                              f"the loop over {list(shape)}")
        return self.ix.reshape(coords, shape, out, self.known)

    def writes_tiles(self) -> bool:
        """Whether the target walks rows read across in tiles (it can write ``smaller``)."""
        return True

    def smaller(self, a: Code, b: Code) -> Code:
        """The smaller of two indices."""
        raise NotImplementedError
