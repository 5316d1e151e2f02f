"""A nest's rows over dims of symbolic sizes walked by one loop per dim.

A nest loops over its rows by one index ``x`` and declares each row's coordinates from it
(``kernel.KernelWriter.row_coords``): ``x0 = x / (4 * S_0)``, ``x1 = (x / S_0) % 4``,
``x2 = x % S_0`` for rows of shape ``[2, 4, S_0]``. By constants a C compiler divides with a
multiply and a shift; by a size known only at the call it divides, ~10 cycles a division
on the Intel Xeon of RESULTS.md, and a row of 8 floats costs two: the dynamic transformer
stack's head split (rows ``[2, 4, S]`` of 8 elements) took 3.0 us a call at S = 66 where
nested loops take 1.2 (24 against 7.9 us at S = 600; on threads 13 against 5).

:func:`nested` writes such a nest's loop as one loop per dim of more than one element,
the coordinates their variables and ``x`` computed from them by multiplies (what the body
still reads it for: the rows of its outputs)::

    for (int64_t x = 0; x < (8 * S_0); x++) {      for (int64_t x0 = 0; x0 < 2; x0++)
      const int64_t x0 = x / (4 * S_0);              for (int64_t x1 = 0; x1 < 4; x1++)
      const int64_t x1 = (x / S_0) % 4;        ->      for (int64_t x2 = 0; x2 < S_0; x2++) {
      const int64_t x2 = x % S_0;                        const int64_t x = (x0 * 4 + x1) * S_0 + x2;
      ...                                                ...

On threads the loops are one OpenMP loop (``collapse``): gcc gives each thread its first
row's coordinates by division once and steps them after. Rows of constant sizes, or of
one dim, keep the single loop (no division to save).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from torchloom.api import expr, indexing, stmt

from torchloom_codegen_cpu.nest import Writer
from torchloom_codegen_cpu.render import Pragma

#: the pragma of nested row loops shared out by OpenMP as one (``{n}``: how many)
PARALLEL_FOR_NESTED = ("#pragma omp parallel for collapse({n}) num_threads(nthreads) "
                       "schedule(static)")


def divides_by_sizes(shape: Sequence[Any]) -> bool:
    """Whether the row coordinates of ``shape`` divide by a symbolic size: a dim of more
    than one element after the first such is symbolic."""
    real = [d for d in shape if d != 1]
    return any(not isinstance(d, int) for d in real[1:])


def loops(w: Writer, body: Sequence[Any]) -> tuple[list, list] | None:
    """:func:`nested` for writer ``w``'s nest: where its loop is the one over rows ``x``
    (not blocks of them) and its body declared the coordinates of one walk over those
    rows."""
    if w.loop.var != "x" or w.loop.blocks is not None or len(w.row_walks) != 1:
        return None
    index, shape = w.row_walks[0]
    if index != "x" or w.loop.trips is None or not indexing.same(indexing.prod(list(shape)),
                                                                 w.loop.trips):
        return None  # (the rows are another walk's: a pointwise walk's chunks)
    return nested(body, index, shape, w.ix.size_code)


def nested(body: Sequence[Any], index: str, shape: Sequence[Any],
           size_code: Callable[[Any], expr.Code]) -> tuple[list, list] | None:
    """(the loops on one thread, on threads) walking the rows of ``shape`` by one loop
    per dim, around ``body`` (a row's statements, which declared the coordinates of row
    ``index`` it reads as ``x{k}``, k the dim: ``row_coords``); None where no coordinate
    divides by a symbolic size, or none is read. ``size_code``: a dim's C expression."""
    if not divides_by_sizes(shape):
        return None
    dims = [(f"x{k}", d) for k, d in enumerate(shape) if d != 1]
    names = {name for name, _ in dims}
    inner = [s for s in body if not (isinstance(s, stmt.Declare) and s.name in names)]
    if len(inner) == len(body):
        return None  # the row reads no coordinate (its index alone): nothing divides
    linear: expr.Code = expr.Name(dims[0][0])
    for name, d in dims[1:]:
        linear = expr.plus(expr.times(linear, expr.paren(size_code(d))), expr.Name(name))
    statements: tuple = tuple(stmt.drop_unused(
        [stmt.Declare("int64_t", index, linear), *inner]))
    for name, d in reversed(dims):
        statements = (stmt.Loop(name, "0", expr.paren(size_code(d)), statements),)
    (loop,) = statements
    shared = attrs.evolve(loop, annotation=Pragma(PARALLEL_FOR_NESTED.format(n=len(dims))))
    return [loop], [shared]


__all__ = ["PARALLEL_FOR_NESTED", "divides_by_sizes", "loops", "nested"]
