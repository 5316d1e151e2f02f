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
same statements as before, so results are bit for bit those of the row form.

Taken for static sizes, where the row loop did not overrun (overrun.py), without column
sums carried, for a tensor read or written at the row form's element ``(x, r)`` (one kept
and one reduced dim larger than 1) with a step of at least :data:`STRIDED` elements per
``r`` and of one per ``x``, its block buffer at most :data:`MOST_BYTES`.
"""

from __future__ import annotations

from typing import Any

import attrs

from torchloom.api import indexing, stmt

from torchloom_codegen_cpu.nest import ParallelLoop
from torchloom_codegen_cpu.ops import ITEMSIZE, STORAGE
from torchloom_codegen_cpu.render import Simd

#: rows a block stages (a cache line of f32 across the rows)
BLOCK = 16
#: a tensor stepping over at least this many elements per ``r`` lies across the rows
STRIDED = 16
#: the most bytes of one staged tensor's block buffer (on each thread's stack)
MOST_BYTES = 32768


@attrs.frozen
class Staged:
    """One tensor of a nest read or written through a block buffer: its C pointer, its
    buffer's name, the coordinates it is addressed at in the row form (names ``x``,
    ``r`` and ``0``), its strides and shape, and its storage dtype."""

    pointer: str
    buffer: str
    coords: indexing.Coords
    strides: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    output: bool


def across_rows(coords: indexing.Coords, strides, shape) -> bool:
    """Whether a tensor addressed at ``coords`` lies across the rows: static strides, one
    coordinate each for ``x`` and ``r`` (the others 0), a step of 1 per ``x`` and of at
    least :data:`STRIDED` per ``r``."""
    if strides is None or not all(isinstance(s, int) for s in (*strides, *shape)):
        return False
    by = {c: s for c, s in zip(coords, strides)}
    return sorted(coords).count("x") == 1 and sorted(coords).count("r") == 1 and \
        all(c in ("x", "r", "0") for c in coords) and by["x"] == 1 and by["r"] >= STRIDED


def buffer(pointer: str) -> str:
    """The block buffer's C name of the tensor at ``pointer``."""
    return f"st_{pointer}"


def offset(rnumel: int) -> str:
    """The block buffer's element of row ``x`` at ``r``."""
    return f"(x - xlo) * {rnumel} + r"


def worth_it(rows: Any, rnumel: Any, staged: list[Staged]) -> bool:
    """Whether a static nest of ``rows`` rows of ``rnumel`` elements stages ``staged``."""
    return bool(staged) and isinstance(rows, int) and isinstance(rnumel, int) and \
        rows >= 2 * BLOCK and rnumel >= STRIDED and \
        all(BLOCK * rnumel * ITEMSIZE[s.dtype] <= MOST_BYTES for s in staged)


def blocked(lines: list, rows: int, rnumel: int, staged: list[Staged],
            address) -> tuple[ParallelLoop, list]:
    """The loop over blocks ``xs`` and its body: the block's buffers, the staged inputs
    copied in, ``lines`` (one row ``x``) over the block's rows, the staged outputs copied
    out. ``address(s)``: the C offset of ``s``'s element at ``(x, r)``."""
    head = [stmt.Declare("int64_t", "xlo", f"xs * {BLOCK}"),
            stmt.Declare("int64_t", "xhi", f"xlo + {BLOCK} < {rows} ? xlo + {BLOCK} : {rows}")]
    for s in staged:
        head.append(stmt.Raw(f"{STORAGE[s.dtype]} {s.buffer}[{BLOCK * rnumel}];"))

    def copy(s: Staged) -> stmt.Loop:
        inner = f"{s.buffer}[{offset(rnumel)}]"
        outer = f"{s.pointer}[{address(s)}]"
        target, source = (outer, inner) if s.output else (inner, outer)
        return stmt.Loop("r", "0", str(rnumel), (stmt.Loop(
            "x", "xlo", "xhi", (stmt.Raw(f"{target} = {source};"),), annotation=Simd()),))
    body = [*head, *(copy(s) for s in staged if not s.output),
            stmt.Loop("x", "xlo", "xhi", tuple(lines)),
            *(copy(s) for s in staged if s.output)]
    return ParallelLoop("xs", -(-rows // BLOCK)), body


def entry(known: Staged | None, pointer: str, coords, t, output: bool) -> Staged | None:
    """What a writer records for the tensor at ``pointer`` (C name), addressed at
    ``coords`` in the row form, having recorded ``known`` before: a :class:`Staged` where
    it lies across the rows, one without coordinates (never staged) once it was addressed
    at two different ones, None where nothing is to be recorded."""
    if known is not None:
        return None if known.coords in (coords, ()) else attrs.evolve(known, coords=())
    strides = t.actual_strides()
    if not across_rows(coords, strides, t.shape):
        return None
    return Staged(pointer, buffer(pointer), tuple(coords), tuple(strides), tuple(t.shape),
                  t.dtype, output)


def usable(found: dict[str, Staged]) -> list[Staged]:
    """The tensors to stage of those found (each addressed at one coordinate tuple)."""
    return [s for s in found.values() if s.coords]
