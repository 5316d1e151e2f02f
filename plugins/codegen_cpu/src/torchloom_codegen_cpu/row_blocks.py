"""Rows over several reduced dims: their coordinates without a division per element.

A reduction nest's row loop declares each coordinate of element ``r`` from it
(``kernel.KernelWriter.inner_coords``): for a batch norm's gradient over ``[2, 32, 112,
112]`` (dims 0, 2 and 3 reduced, a row per channel) ``r0 = r / 12544``, ``r1 = (r / 112) %
112``, ``r2 = r % 112``, and reads ``in[r0 * 401408 + x * 12544 + r1 * 112 + r2]``. gcc 12
vectorizes no 64-bit division: the row's loops ran scalar, 8.9 ms a call where the same
loops without the divisions take 0.16 (C harness, 2 threads, bit-equal; ResNet's training
step spent half its time there, RESULTS.md session 65).

Two changes take them out:

- each run of the row's trailing dims (``r1, r2``) is an index of its own, ``rs1 = r %
  12544``, which the index math reads where a tensor lays those dims end to end
  (``indexing.IndexMath.address``: ``in[r0 * 401408 + x * 12544 + rs1]``);
- a static row of whole blocks of :data:`WIDTH` lanes runs as a loop over blocks ``rb``
  around a SIMD loop over lanes ``rl`` (the lane form of ``lanes.py`` already does), and a
  coordinate whose dims inside it span whole blocks is the block's (``r0 = rb / 784``,
  declared once a block), a run of such dims the block's start plus the lane (``rs1 = (rb
  % 784) * 16 + rl``): unit-stride loads in the lanes.

A coordinate not of those kinds is declared from ``r`` as before (correct, and as slow).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from torchloom.api import expr, stmt

#: lanes of a block: one AVX-512 vector of f32 (``row_loops.TAIL``)
WIDTH = 16


@attrs.frozen
class Run:
    """Trailing dims ``dims`` (their positions) of a row, over sizes ``sizes``, read as one
    index ``name`` (of ``span`` elements)."""

    name: str
    dims: tuple[int, ...]
    sizes: tuple[int, ...]
    span: int


@attrs.frozen
class RowBlocks:
    """The coordinates of a row's elements in blocks of ``width`` lanes: ``block`` declared
    once a block (from ``rb``), ``lane`` in the SIMD loop over its lanes (``r`` first);
    ``header``: the row loop's declarations they stand for."""

    header: tuple
    block: tuple
    lane: tuple
    width: int


def runs(index: str, shape: Sequence[Any]) -> list[Run]:
    """The runs of two or more trailing dims of a static row ``shape`` (each shorter than
    the row's real dims: the whole is ``index`` itself), outermost first; none for a row
    of one real dim or of symbolic sizes."""
    real = [k for k, d in enumerate(shape) if d != 1]
    if len(real) < 3 or not all(isinstance(d, int) for d in shape):
        return []
    out = []
    for start in range(1, len(real) - 1):
        dims = tuple(real[start:])
        sizes = tuple(shape[k] for k in dims)
        span = 1
        for d in sizes:
            span *= d
        out.append(Run(f"{index}s{dims[0]}", dims, sizes, span))
    return out


def run_declarations(index: str, found: Sequence[Run]) -> list[stmt.Declare]:
    """Each run's index declared from the row's ``index``: ``rs1 = r % 12544``."""
    return [stmt.Declare("int64_t", run.name, expr.modulo(index, run.span)) for run in found]


def blocked(index: str, shape: Sequence[Any], header: Sequence[Any], found: Sequence[Run],
            width: int = WIDTH) -> RowBlocks | None:
    """The row's coordinates (``header``: ``index``'s declarations of the coordinates
    ``{index}{k}`` and the runs ``found``) in blocks of ``width`` lanes; None where the
    row is not static, has one real dim, or no coordinate or run is a block's."""
    real = [k for k, d in enumerate(shape) if d != 1]
    if len(real) < 2 or not all(isinstance(d, int) for d in shape):
        return None
    inner = {}  # each real dim's span of the elements inside it
    span = 1
    for k in reversed(real):
        inner[k] = span
        span *= shape[k]
    lane = expr.Name(f"{index}l")
    block_var = expr.Name(f"{index}b")
    by_block: dict[str, expr.Code] = {}
    for k in real:
        if inner[k] % width == 0:
            at: expr.Code = expr.over(block_var, inner[k] // width) if inner[k] > width \
                else block_var
            by_block[f"{index}{k}"] = at if k == real[0] else expr.modulo(
                expr.paren(at), shape[k])
    by_lane = {run.name: expr.plus(expr.times(expr.paren(expr.modulo(
        block_var, run.span // width)), width), lane)
        for run in found if run.span % width == 0}
    if not by_block and not by_lane:
        return None
    block, lanes = [], [stmt.Declare("int64_t", index,
                                     expr.plus(expr.times(block_var, width), lane))]
    for s in header:
        if isinstance(s, stmt.Declare) and s.name in by_block:
            block.append(stmt.Declare("int64_t", s.name, by_block[s.name]))
        elif isinstance(s, stmt.Declare) and s.name in by_lane:
            lanes.append(stmt.Declare("int64_t", s.name, by_lane[s.name]))
        else:
            lanes.append(s)
    return RowBlocks(tuple(header), tuple(block), tuple(lanes), width)


def loops(blocks: RowBlocks, count: int, body: Sequence[Any], annotation: Any) -> stmt.Loop:
    """``count`` blocks of the row (``blocks.width`` lanes each) around ``body``, the lane
    loop's statements under ``annotation`` (a SIMD pragma)."""
    index = blocks.lane[0].name
    return stmt.Loop(f"{index}b", "0", str(count), (
        *blocks.block,
        stmt.Loop(f"{index}l", "0", str(blocks.width), tuple(body), blocks.lane, annotation)))


__all__ = ["WIDTH", "Run", "RowBlocks", "runs", "run_declarations", "blocked", "loops"]
