"""The kernel schedule, target-independent: what a fusion group's loop nests are, computed
once as frozen data that every codegen renders (see DESIGN.md, "Codegen and runtime").

This module holds the first piece, the shape of a reduction nest: the shape ``P`` that
every reduction of the nest reads, the dims it reduces and keeps, and the counts a
renderer loops over. A row reduction of ``f32[8, 512]`` over dim 1::

    ReductionNest(shape=(8, 512), rdims=(1,))
      kept (0,), kept_shape [8], red_shape [512], rows 8, rnumel 512, numel 4096

A column reduction (``sum(g, dim=0)`` of ``[512, 1024]``) has its kept dims innermost
(:attr:`ReductionNest.columns`). Sizes may be symbols (:mod:`torchloom.ir.symbols`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from torchloom.codegen.indexing import Unsupported, prod
from torchloom.codegen.writer import reduced_dims, same_shape
from torchloom.ir import Node


@attrs.frozen
class ReductionNest:
    """The loop nest every reduction of a nest shares: input shape ``shape`` (P), the dims
    it reduces (``rdims``, sorted) and those it keeps."""

    shape: tuple[Any, ...]
    rdims: tuple[int, ...]

    @classmethod
    def of(cls, reductions: Sequence[Node], tensor_type: Callable[[Any], Any]
           ) -> ReductionNest:
        """The nest of ``reductions`` (their inputs' types read by ``tensor_type``);
        :class:`Unsupported` when they reduce different shapes or dims."""
        first = reductions[0]
        shape = tuple(tensor_type(first.inputs[0]).shape)
        rdims = reduced_dims(first, len(shape))
        for n in reductions[1:]:
            other = tuple(tensor_type(n.inputs[0]).shape)
            if not same_shape(other, shape) or reduced_dims(n, len(other)) != rdims:
                raise Unsupported(f"reductions over different shapes or dims "
                                  f"({first.op} and {n.op})")
        return cls(shape, rdims)

    @property
    def kept(self) -> list[int]:
        return [d for d in range(len(self.shape)) if d not in self.rdims]

    @property
    def kept_shape(self) -> list[Any]:
        return [self.shape[d] for d in self.kept]

    @property
    def red_shape(self) -> list[Any]:
        return [self.shape[d] for d in self.rdims]

    @property
    def rows(self) -> Any:
        """Elements of the kept dims: one row per combination."""
        return prod(self.kept_shape)

    @property
    def rnumel(self) -> Any:
        """Elements of a row (the reduced dims)."""
        return prod(self.red_shape)

    @property
    def numel(self) -> Any:
        return prod([self.rows, self.rnumel])

    @property
    def columns(self) -> bool:
        """Whether the kept dims end innermost: each row is read with a stride (a column
        reduction), where a renderer walks the rows in memory order instead."""
        kept = self.kept
        return bool(kept) and kept[-1] == len(self.shape) - 1
