"""Facts about symbolic sizes judged at sample points, for the native codegens' index math.

No symbolic algebra runs: two sizes are :func:`same` when they are equal at three fixed
pseudo-random points (two with every symbol large, one with every symbol below 64, so that
sizes equal only past a threshold, ``64 - Max(0, 64 - s)`` and ``s``, are told apart) and,
where either is more than a polynomial of its symbols, at small sizes and around its
constants too (``symbols.agree_at_small_sizes``), as ``symbols.symbolic_contiguous``
judges strides. :func:`sample_value` is a size at a
representative point (for choices that only cost speed), :func:`view_groups` the dims of a
view's output and input in groups of equal size. What cannot be judged raises
:class:`Unsupported` (the reason a codegen declines a group with).
"""

from __future__ import annotations

from collections.abc import Sequence

import ast

from torchloom.ir.symbols import (Dim, SymbolicDimError, agree_at_small_sizes, evaluate,
                                  parse_dim, sample_points, symbols_of)


class Unsupported(Exception):
    """The group cannot be compiled by this codegen; the message is the reason."""


def view_groups(outs: list[int], ins: list[int], out_shape: Sequence[Dim],
                in_shape: Sequence[Dim]) -> list[tuple[list[int], list[int]]]:
    """The dims ``outs`` of a view's output and ``ins`` of its input in groups of equal
    size products, the fewest dims each (judged at sample points); one group of them all
    where sizes do not line up at the points (``[s0]`` as ``[ceil(s0/2), s0//ceil(s0/2)]``:
    equal only at the sizes Dynamo's guards keep, even ones): a view keeps every element's
    row-major index, so one group is right wherever the view is valid, at the cost of more
    division."""
    groups = []
    i = j = 0
    while i < len(outs):
        if j >= len(ins):
            return [(outs, ins)] if ins else []
        group_o, group_i = [outs[i]], [ins[j]]
        po, pi = points(out_shape[outs[i]]), points(in_shape[ins[j]])
        i, j = i + 1, j + 1
        while po != pi:
            if po[0] < pi[0] and i < len(outs):
                group_o.append(outs[i])
                po = tuple(a * b for a, b in zip(po, points(out_shape[outs[i]])))
                i += 1
            elif po[0] >= pi[0] and j < len(ins):
                group_i.append(ins[j])
                pi = tuple(a * b for a, b in zip(pi, points(in_shape[ins[j]])))
                j += 1
            else:
                return [(outs, ins)]
        if not agree_at_small_sizes(prod([out_shape[d] for d in group_o]),
                                    prod([in_shape[d] for d in group_i])):
            return [(outs, ins)]  # equal at the points only (a threshold: see same)
        groups.append((group_o, group_i))
    return groups


def points(dim: Dim) -> tuple[int, int, int]:
    """``dim`` at three fixed pseudo-random points: every symbol from 2 to 2**20 at two,
    from 8 to 63 at the third, so that sizes equal only past a threshold are told apart
    (``64 - Max(0, 64 - s)``, a slice of the last ``s`` of 64 positions, is ``s`` only up
    to 64: at large points alone it looked like 64)."""
    if isinstance(dim, int):
        return (dim, dim, dim)
    if dim is None:
        raise Unsupported("a dim of unknown size")
    values = []
    for point in sample_points(symbols_of(dim), 3, small_last=True):
        try:
            values.append(evaluate(dim, point))
        except SymbolicDimError as exc:
            raise Unsupported(f"size {dim!r}: {exc}") from None
        except ZeroDivisionError:  # (its symbols are related in ways the IR does not say)
            raise Unsupported(f"size {dim!r} divides by zero at sample sizes of its "
                              f"symbols taken one by one: its value cannot be compared "
                              f"with other sizes") from None
    return tuple(values)


def sample_value(dim: Dim) -> int:
    """``dim`` at a representative size (every symbol a large pseudo-random value), for
    choices that only cost speed, such as which dim is innermost in memory."""
    return points(dim)[0]


def same(a: Dim, b: Dim) -> bool:
    """Whether dims ``a`` and ``b`` are equal at every runtime size (``2*s0``, ``s0*2``):
    at the sample points, and where either has a threshold, at small sizes too
    (``Max(1, Min(8, s))``, a chunk's rows, is 8 only from ``s = 8``:
    :func:`symbols.agree_at_small_sizes`)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return a == b or (points(a) == points(b) and agree_at_small_sizes(a, b))


def same_shape(a: Sequence, b: Sequence) -> bool:
    """Whether shapes ``a`` and ``b`` are equal at every runtime size."""
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


__all__ = ["Unsupported", "points", "prod", "same", "same_shape", "sample_value",
           "view_groups"]


def prod(dims: Sequence[Dim]) -> Dim:
    """The product of ``dims``: an int when all are ints, else a size expression."""
    const, factors = 1, []
    for d in dims:
        if isinstance(d, int):
            const *= d
        elif d is None:
            raise Unsupported("a dim of unknown size")
        else:
            factors.append(d if parse_dim(d).body.__class__ in (ast.Name, ast.Call)
                           else f"({d})")
    if not factors or const == 0:
        return const
    return "*".join(([str(const)] if const != 1 else []) + factors)
