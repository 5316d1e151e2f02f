"""Coordinates that index math reads as one index: runs of dims delinearised from an index
(``indexing.Known``, filled by ``IndexMath.remember``), found in the coordinates of a
linear index or of a tensor's element offset.

A reduction's row over ``[2, 112, 112]`` declares ``r0, r1, r2`` from ``r`` and the index of
the run ``r1, r2`` as ``rs1`` (the cpu codegen's ``row_blocks``); a tensor laying those two
dims end to end reads ``rs1`` where it read ``r1 * 112 + r2``, with no division by 112 per
element to compute them.
"""

from __future__ import annotations

from typing import Any

from torchloom.codegen.coords import is_zero, key, total
from torchloom.codegen.expr import Code
from torchloom.codegen.samples import prod, same
from torchloom.ir.symbols import Dim


def known_runs(coords: tuple[Code, ...], shape: tuple[Dim, ...],
               known: dict) -> tuple[list[Code], list[Dim]]:
    """``coords`` over ``shape`` with each longest run that ``known`` maps to an index
    replaced by that index (over the run's product of sizes), from the outermost dim."""
    out_c: list[Code] = []
    out_d: list[Dim] = []
    i, n = 0, len(coords)
    while i < n:
        for j in range(n, i + 1, -1):  # runs of two or more dims, the longest first
            index = known.get((key(coords[i:j]), shape[i:j]))
            if index is not None:
                out_c.append(index)
                out_d.append(prod(shape[i:j]))
                i = j
                break
        else:
            out_c.append(coords[i])
            out_d.append(shape[i])
            i += 1
    return out_c, out_d


def fold_runs(ix: Any, real: list[tuple[Code, Dim, Dim]], known: dict) -> Code | None:
    """The offset of ``real`` (coordinate, stride, size; in memory order) with each run
    of dims laid out end to end whose coordinates ``known`` maps to an index read as that
    index times the run's innermost stride (``ix``: the kernel's ``IndexMath``); None
    where no run folds."""
    terms: list[Code] = []
    folded = False
    i = 0
    while i < len(real):
        j = i + 1  # the run real[i:j]: each dim's stride its inner neighbour's span
        while j < len(real) and not same(real[j - 1][1], 0) and same(
                real[j - 1][1], prod([real[j][1], real[j][2]])):
            j += 1
        run = real[i:j]
        cs, ds = known_runs(tuple(c for c, _, _ in run), tuple(d for _, _, d in run),
                            known) if len(run) > 1 else ([], [])
        if len(run) > 1 and len(cs) < len(run):  # (a run of one dim has nothing to fold)
            folded = True
            terms.append(ix.times(ix.linear(cs, ds), run[-1][1]))
        else:
            terms += [ix.times(c, s) for c, s, _ in run if s != 0 and not is_zero(c)]
        i = j
    return total(terms) if folded else None


__all__ = ["fold_runs", "known_runs"]
