"""The kernel schedule's row forms for targets that hold a row in blocks of lanes (a GPU's
programs; the ``triton`` codegen renders them, the C codegens loop over every row instead).

A reduction nest's rows (:class:`~torchloom.codegen.schedule.ReductionNest`) are walked

- *persistent*: a whole row in registers at once (its length's next power of two), for rows
  up to the target's limit;
- *looped* (:func:`looped`): in chunks of a block, for longer rows (the variance by
  Welford's update, softmax's exp by an online maximum);
- *split* (:class:`Split`): two stages where the rows make too few blocks to occupy the
  target: program (row block, split) reduces its chunk of each row to a partial, and a
  finishing kernel combines each row's partials and computes the group's outputs from them.

The target gives the numbers (its persistent limit, the rows and chunk of a block, how many
programs it wants); the forms and their conditions are the core's::

    looped(4096, limit=4096) -> False          looped(5000, limit=4096) -> True
    Split.shape(rows=1, rnumel=1 << 20, xblock=1, rblock=2048, programs=264)
        -> Split(chunk=2048, splits=512)
    Split.shape(rows=1024, ...)                  -> None  (1,024 row blocks: enough)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from torchloom.codegen.indexing import prod, same
from torchloom.codegen.schedule import reductions_read
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
