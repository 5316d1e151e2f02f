"""The kernel schedule's pointwise walk: the order a pointwise nest visits its elements.

A pointwise nest stores each of its outputs at every element of the first output's shape
(or of a shape of as many elements, reshaped). It walks that shape in the first output's
memory order, its innermost dim fastest: *rows* (every dim but the innermost, one index
``x`` over all of them) and, in each row, the innermost dim (an index ``j``), so that a
row's stores are contiguous and the values that do not change along a row are computed
once per row. Where every tensor the nest touches is dense, of the walk's shape or a
single element, with static sizes and no view between them, each element sits at the
walk's index in every tensor: the walk is *flat*, one run over every element (rows no
longer bound a SIMD loop, and no coordinate is needed)::

    Walk.of([out], type_of)   # out = x.t() + y: f32[64, 128] strided[1, 64]
        -> Walk(shape=(64, 128), order=(1, 0), flat=False)   # sizes [128, 64]: 128 rows
    Walk.of([out], type_of)   # out = exp(a) * b, all f32[8, 16] row-major
        -> Walk(shape=(8, 16), order=(0, 1), flat=True)      # sizes [128]: one row

A target may turn a walk (:meth:`Walk.turned`: another dim innermost, where rows are too
short for a vector and an input is laid out along that dim); each element is computed as
before, in another order. The ``cpu`` codegen renders a walk as a parallel loop over rows
(long rows cut into chunks) around a SIMD loop, the core's lowering
(:mod:`torchloom.codegen.lower`) as a loop over rows around a loop over a row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from torchloom.codegen.indexing import memory_order, prod
from torchloom.codegen.writer import VIEWS, upstream_nodes
from torchloom.ir import TensorType, Value

TypeOf = Callable[[Value], TensorType]


@attrs.frozen
class Walk:
    """A pointwise nest's walk over ``shape`` (its first output's): dims in ``order``,
    outermost first; ``flat``, every element in one run (see the module docstring)."""

    shape: tuple[Any, ...]
    order: tuple[int, ...]
    flat: bool

    @classmethod
    def of(cls, outputs: Sequence[Value], type_of: TypeOf) -> Walk:
        """The walk of a pointwise nest storing ``outputs`` (the first sets the shape)."""
        first = type_of(outputs[0])
        return cls(tuple(first.shape), memory_order(first) if first.shape else (),
                   walked_flat(outputs, type_of))

    @property
    def sizes(self) -> list[Any]:
        """The walk's dims in its order (one of all the elements when flat; ``[1]`` for a
        tensor of no dims): the last is a row, the others count the rows."""
        sizes = [self.shape[d] for d in self.order] or [1]
        return [prod(sizes)] if self.flat else sizes

    @property
    def rows(self) -> Any:
        return prod(self.sizes[:-1])

    @property
    def inner(self) -> Any:
        """A row's length."""
        return self.sizes[-1]

    def turned(self, d1: int) -> Walk:
        """The walk with dim ``d1`` innermost, the others in their order (not flat)."""
        return Walk(self.shape, (*(d for d in self.order if d != d1), d1), False)


def walked_flat(outputs: Sequence[Value], type_of: TypeOf) -> bool:
    """Whether a pointwise nest storing ``outputs`` can walk every element at once: static
    sizes, every output of the first's shape, every tensor it touches dense (row-major)
    and of that shape or a single element, no views (each element then sits at the walk's
    index in every tensor)."""
    outs = [type_of(v) for v in outputs]
    shape = outs[0].shape
    upstream = upstream_nodes(list(outputs))
    if len(shape) < 2 or not all(isinstance(d, int) for d in shape) or any(
            n.op in VIEWS for n in upstream):
        return False
    read = {u for n in upstream for u in n.inputs if u.producer is None}
    read.update(v for v in outputs if v.producer is None)
    tensors = [type_of(v) for v in read if isinstance(v.type, TensorType)]
    return all(t.shape == shape and t.is_dense for t in outs) and all(
        t.is_dense and (t.shape == shape or t.numel() == 1) for t in tensors)
