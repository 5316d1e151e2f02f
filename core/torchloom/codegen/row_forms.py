"""The kernel schedule's row forms for targets that hold a row in blocks of lanes (a GPU's
programs; the ``triton`` codegen renders them, the C codegens loop over every row instead).

A reduction nest's rows (:class:`~torchloom.codegen.schedule.ReductionNest`) are walked

- *persistent*: a whole row in registers at once (its length's next power of two), for rows
  up to the target's limit;
- *looped* (:func:`looped`): in chunks of a block, for longer rows, one loop over the row
  per :class:`Pass` (:func:`passes`: reductions reading none of each other's results share
  one; the variance by Welford's update, softmax's sum of exp beside its online maximum);
- *split* (:class:`Split`): two stages where the rows make too few blocks to occupy the
  target: program (row block, split) reduces its chunk of each row to a partial, and a
  finishing kernel combines each row's partials and computes the group's outputs from them.

The target gives the numbers (its persistent limit, the rows and chunk of a block, how many
programs it wants); the forms and their conditions are the core's::

    looped(4096, limit=4096) -> False          looped(5000, limit=4096) -> True
    Split.shape(rows=1, rnumel=1 << 20, xblock=1, rblock=2048, programs=264)
        -> Split(chunk=2048, splits=512)
    Split.shape(rows=1024, ...)                  -> None  (1,024 row blocks: enough)
    passes([m, s], kind)  (m = amax(a), s = sum(exp(a - m)))
        -> (Pass(reductions=(), online=((m, s),)),)   (one loop over the row, not two)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from torchloom.codegen.indexing import prod, same
from torchloom.codegen.schedule import max_shift, reductions_read
from torchloom.ir import Node, TensorType, Value


def next_pow2(n: int) -> int:
    """The least power of two >= ``n`` (1 for n <= 1)."""
    p = 1
    while p < n:
        p *= 2
    return p


def looped(rnumel: int, limit: int) -> bool:
    """Whether rows of ``rnumel`` elements (a representative length where symbolic) are
    walked in chunks: their block (the next power of two) exceeds the persistent ``limit``."""
    return next_pow2(rnumel) > limit


@attrs.frozen
class Split:
    """A split reduction: each row cut into ``splits`` chunks of ``chunk`` elements (ints;
    or the names of the kernel arguments holding them, computed per call by
    :meth:`shape`, where sizes are symbolic)."""

    chunk: Any
    splits: Any

    @staticmethod
    def shape(rows: int, rnumel: int, xblock: int, rblock: int, programs: int
              ) -> Split | None:
        """The split of ``rows`` rows of ``rnumel`` in blocks of ``xblock`` rows, chunks a
        multiple of ``rblock``, aiming for ``programs`` programs; None where the row
        blocks alone reach ``programs`` or a row would not make two chunks."""
        row_blocks = -(-rows // xblock)
        if row_blocks >= programs or rnumel <= 0:
            return None
        wanted = -(-programs // row_blocks)
        chunk = max(rblock, (rnumel // wanted) // rblock * rblock)
        splits = -(-rnumel // chunk)
        return Split(chunk, splits) if splits >= 2 else None


def splittable(reductions: Sequence[Node], outputs: Sequence[Value], rows: Any,
               type_of: Callable[[Value], TensorType]) -> bool:
    """Whether a nest's ``reductions`` can be split, whatever the target: none reads
    another's result (a partial of it would not be its value), and every output is one
    element per row (``rows`` of them: the results and pointwise math on them), computable
    from the combined partials alone."""
    if any(reductions_read(n, reductions) for n in reductions):
        return False
    return all(same(prod(type_of(v).shape), rows) for v in outputs)


@attrs.frozen
class Pass:
    """One loop of the looped form over a row: the ``reductions`` it accumulates, in the
    order the nest lists them, and its ``online`` pairs ``(m, s)``: a maximum ``m`` and
    ``s = sum(exp(a - m))`` over the same ``a``, accumulated together (the running sum
    rescaled whenever the running maximum grows), so softmax's statistics take one loop."""

    reductions: tuple[Node, ...]
    online: tuple[tuple[Node, Node], ...] = ()


def passes(reductions: Sequence[Node], kind: Callable[[Node], str],
           online: Callable[[Node, Node], bool] = lambda m, s: True) -> tuple[Pass, ...]:
    """The looped form's loops over a row for a nest's ``reductions``: each pass holds the
    reductions whose inputs read only results of earlier passes, and the sum paired online
    with a maximum of the pass (see :class:`Pass`). ``kind`` is a reduction's kind in the
    target's table (``"max"``, ``"sum"``, ...); ``online(m, s)`` says whether the target
    accumulates that pair online (its dtypes, say): a pair it declines takes two passes."""
    deps = {n: reductions_read(n, reductions) for n in reductions}
    done: set[Node] = set()
    pending, out = list(reductions), []
    while pending:
        level = [n for n in pending if deps[n] <= done]
        pairs = {}
        for m in level:
            s = _online_sum(m, pending, deps, kind, online)
            if s is not None:
                pairs[m] = s
        sums = set(pairs.values())
        out.append(Pass(tuple(n for n in level if n not in pairs and n not in sums),
                        tuple(pairs.items())))
        done.update(level, sums)
        pending = [n for n in pending if n not in done]
    return tuple(out)


def _online_sum(m: Node, pending: Sequence[Node], deps: dict[Node, set[Node]],
                kind: Callable[[Node], str], online: Callable[[Node, Node], bool]
                ) -> Node | None:
    """The first reduction of ``pending`` summing ``exp(a - m)`` for the keepdim maximum
    ``m`` of ``a`` that the target takes online with ``m``, if any."""
    if kind(m) != "max" or not m.attrs.get("keepdim"):
        return None
    for s in pending:
        if s is m or kind(s) != "sum" or deps[s] != {m}:
            continue
        exp = s.inputs[0].producer
        if exp is not None and exp.op == "aten.exp.default" and \
                max_shift(exp.inputs[0]) is m and online(m, s):
            return s
    return None
