"""Staged blocks of rows for row-form reductions whose tensors lie across the rows.

A row-form reduction walks row ``x`` with SIMD loops over ``r``. A tensor laid out with
the row dim innermost (``x`` contiguous, each step of ``r`` a whole stride away: Whisper's
residual stream after its convolutions' ``permute(0, 2, 1)``, a ConvNeXt block's
channels) is then read and written one element per cache line, and each of a row's
elements on another page past 1 KB strides: the layer_norm of Whisper's [1, 512, 256]
residual, read and written that way, took 0.94 ms a call against Inductor's 0.06-0.3 ms
(which lays its buffers out contiguously, or tiles them).

Staged, the nest runs over blocks of :data:`BLOCK` rows: before a block, each such input
is copied into a buffer on the thread's stack in row order (``st[(x - xlo) * R + r]``), a
loop over ``r`` whose inner SIMD loop reads the block's ``BLOCK`` neighbouring elements:
whole cache lines); the block's rows then run as before, reading and writing the buffers;
after it, each such output is copied out the same way. Every element is computed by the
same statements as before; a row's sums may take another lane order (the row loop now
reads contiguous memory and vectorizes where, reading across the rows, it may not have),
as any SIMD reduction does (Whisper's shape: bit for bit the unstaged results).

Column sums carried by the row nest (rows_and_columns.py: layer_norm's backward, its weight and
bias gradients) stay as they are: each thread's share is then a run of whole blocks, its
rows in order, adding into its partials as before.

Taken for static sizes, where the row loop did not overrun (overrun.py), for a tensor
read or written at the row form's element (one reduced dim larger than 1, its coordinate
``r``; the row's coordinates each at most once) with a step of at least
:data:`STRIDED` elements per ``r`` and of one per row over a *run* of rows (the trailing
kept dims dense in row order: ConvNeXt's [2, 56, 56] rows of channels, 3,136 rows a run,
one image's pixels), its block buffer at most :data:`MOST_BYTES`. A block never crosses
the end of a run (7 x 7 pixels: blocks of 16, 16, 16 and 1 rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from torchloom.api import expr, indexing, stmt

from torchloom_codegen_cpu.nest import ParallelLoop
from torchloom_codegen_cpu.ops import ITEMSIZE, STORAGE
from torchloom_codegen_cpu.render import Simd, smaller

#: rows a block stages (a cache line of f32 across the rows)
BLOCK = 16
#: a tensor stepping over at least this many elements per ``r`` lies across the rows
STRIDED = 16
#: the most bytes of one staged tensor's block buffer (on each thread's stack)
MOST_BYTES = 32768
#: the most bytes of all of a nest's block buffers (a thread's stack is megabytes)
MOST_BYTES_IN_ALL = 4 * MOST_BYTES


@attrs.frozen
class Staged:
    """One tensor of a nest read or written through a block buffer: its C pointer, its
    buffer's name, the coordinates it is addressed at in the row form (the row's
    coordinate names, ``r`` and ``0``), its strides and shape, its storage dtype, and
    ``run``: how many consecutive rows lie one element apart in it (from a row's first
    kept dim of such a run on, every kept dim is dense in row order: a block of rows
    within one run is one stride-1 stretch per ``r``)."""

    pointer: str
    buffer: str
    coords: indexing.Coords
    strides: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    output: bool
    run: int = 0


def run_across(coords: indexing.Coords, strides, shape, row: indexing.Coords,
               kept_shape: Sequence[Any]) -> int:
    """How many consecutive rows a tensor addressed at ``coords`` holds one element apart
    while each step of ``r`` is at least :data:`STRIDED` elements (0: it does not lie
    across the rows). ``row``: the row's coordinate name per kept dim (``"0"`` for a dim
    of one), of sizes ``kept_shape``. Static strides; one coordinate ``r`` (one reduced dim
    larger than one); every other coordinate 0 or one kept dim's, each at most once."""
    if strides is None or not all(isinstance(d, int) for d in (*strides, *shape)) or \
            not all(isinstance(d, int) for d in kept_shape):
        return 0
    coords, row = [str(c) for c in coords], [str(c) for c in row]  # (names: their texts)
    named = [c for c in coords if c != "0"]
    if named.count("r") != 1 or len(set(named)) != len(named) or \
            not set(named) <= {"r", *row} - {"0"}:
        return 0
    by = dict(zip(coords, strides))
    if by["r"] < STRIDED:
        return 0
    run, step = 1, 1
    for name, size in reversed(list(zip(row, kept_shape))):
        if name == "0":
            continue  # (a dim of one)
        if by.get(name, 0) != step:
            break
        run, step = run * size, step * size
    return run if run > 1 else 0


def buffer(pointer: str) -> str:
    """The block buffer's C name of the tensor at ``pointer``."""
    return f"st_{pointer}"


def offset(rnumel: int) -> expr.Code:
    """The block buffer's element of row ``x`` at ``r``: ``(x - xlo) * rnumel + r``."""
    return expr.Op("({0} - {1}) * {2} + {3}", expr.SUM, (
        expr.Name("x"), expr.Name("xlo"), expr.Literal(str(rnumel), rnumel), expr.Name("r")))


def worth_it(rows: Any, rnumel: Any, staged: list[Staged]) -> bool:
    """Whether a static nest of ``rows`` rows of ``rnumel`` elements stages ``staged``."""
    return bool(staged) and isinstance(rows, int) and isinstance(rnumel, int) and \
        rows >= 2 * BLOCK and rnumel >= STRIDED and \
        all(BLOCK * rnumel * ITEMSIZE[s.dtype] <= MOST_BYTES for s in staged) and \
        sum(BLOCK * rnumel * ITEMSIZE[s.dtype] for s in staged) <= MOST_BYTES_IN_ALL


def blocked(lines: list, rows: int, rnumel: int, staged: list[Staged],
            base: Callable[[Staged], expr.Code]) -> tuple[ParallelLoop, list]:
    """The loop over blocks ``xs`` and its body: the block's buffers, the staged inputs
    copied in, ``lines`` (one row ``x``) over the block's rows, the staged outputs copied
    out. A block is at most :data:`BLOCK` rows of one run (the shortest of the staged
    tensors': each longer run is a multiple of it, runs being products of the trailing
    kept dims); ``base(s)``: the C offset of ``s``'s element at row ``xlo``, ``r`` = 0."""
    run = min(s.run for s in staged)
    per_run = -(-run // BLOCK)
    end = expr.times(expr.plus(expr.over("xs", per_run), 1), run)
    head = [stmt.Declare("int64_t", "xlo", expr.plus(expr.times(expr.over("xs", per_run), run),
                                                     expr.times(expr.modulo("xs", per_run),
                                                                BLOCK))),
            stmt.Declare("int64_t", "xhi", smaller(expr.plus("xlo", BLOCK), end))]
    for s in staged:
        head.append(stmt.Array(STORAGE[s.dtype], s.buffer, str(BLOCK * rnumel)))
        head.append(stmt.Declare("int64_t", f"b_{s.buffer}", base(s)))

    def copy(s: Staged) -> stmt.Loop:
        step = dict(zip(s.coords, s.strides))[expr.Name("r")]
        inner = stmt.Element(s.buffer, offset(rnumel))
        outer = stmt.Element(s.pointer, expr.Op("{0} + ({1} - {2}) + {3} * {4}", expr.SUM, (
            expr.Name(f"b_{s.buffer}"), expr.Name("x"), expr.Name("xlo"), expr.Name("r"),
            expr.Literal(str(step), step))))
        target, source = (outer, inner) if s.output else (inner, outer)
        copy = stmt.Store(target, expr.Load(source.pointer, source.offset))
        return stmt.Loop("r", "0", str(rnumel), (stmt.Loop(
            "x", "xlo", "xhi", (copy,), annotation=Simd()),))
    body = [*head, *(copy(s) for s in staged if not s.output),
            stmt.Loop("x", "xlo", "xhi", tuple(lines)),
            *(copy(s) for s in staged if s.output)]
    return ParallelLoop("xs", rows // run * per_run), body


def entry(known: Staged | None, pointer: str, coords, t, output: bool,
          row: Sequence[str], kept_shape: Sequence[Any]) -> Staged | None:
    """What a writer records for the tensor at ``pointer`` (C name), addressed at
    ``coords`` in the row form, having recorded ``known`` before: a :class:`Staged` where
    it lies across the rows, one without coordinates (never staged) once it was addressed
    at two different ones (or an output at one that does not lie across: its block would
    be copied out over what was stored directly), None where nothing is to be recorded."""
    if known is not None:
        return None if known.coords in (tuple(coords), ()) else attrs.evolve(known, coords=())
    strides = t.actual_strides()
    run = run_across(coords, strides, t.shape, row, kept_shape)
    if not run:
        return Staged(pointer, buffer(pointer), (), (), (), t.dtype, output) if output \
            else None
    return Staged(pointer, buffer(pointer), tuple(coords), tuple(strides), tuple(t.shape),
                  t.dtype, output, run)


def usable(found: dict[str, Staged]) -> list[Staged]:
    """The tensors to stage of those found (each addressed at one coordinate tuple)."""
    return [s for s in found.values() if s.coords]
