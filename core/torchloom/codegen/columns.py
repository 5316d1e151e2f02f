"""The column form of a reduction nest, planned once: which nests take it, which reductions
each walk over the reduced elements computes, and where the outputs are stored. The
``cpu`` codegen renders the plan as blocks of columns under SIMD loops (its
``columns.py``), the core's lowering as scalar loops (``lower_columns.py``), both through
:func:`torchloom.codegen.column_nest.walks`; a nest without a plan keeps the row form.

A nest takes the column form when its rows would be read with a stride: reductions whose
kept dims are innermost (a bias gradient ``sum(g, dim=0)``, layer_norm's weight gradient),
or whose one kept dim is innermost in memory (a channels-last batch norm's gradients, sums
over N, H and W). Each walk runs over the reduced elements in order and, for each, over
the columns (the kept elements), accumulating into one array per reduction; each column
still combines its rows in order, as the row form does::

    for r in [0, R):                 # the reduced elements, in memory order
      for x in [0, K):               # the columns: contiguous loads and stores
        acc[x] += value(r, x)

Reductions that combine element by element (:data:`KINDS`: sum, prod, max, min; mean is a
sum) with one output take this form. A reduction computed from another's result comes in
a later walk (softmax over dim 0: the max, then the sum of ``exp(x - max)``: ``walks``);
full-shape outputs go in the first walk, or, when one of them reads a result, in a walk
of their own after the last (``late``); each walk's results are taken after it, and the
outputs of a column's values (:data:`PER_COLUMN`) after the last results (the walks every
target writes: :mod:`torchloom.codegen.column_nest`). Several walks, or a late one, only where
a walk's columns are contiguous (every kept dim after every reduced one) or are one dim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from torchloom.codegen.reductions import reduction_table
from torchloom.codegen.schedule import ReductionNest, levels
from torchloom.codegen.writer import VIEWS, upstream_nodes
from torchloom.ir import Node, TensorType, Value

#: reduction kinds a column walk combines
KINDS = ("sum", "prod", "max", "min")
#: outputs stored per element of a walk: the reduced shape's elements in any view of them
#: (GELU's gradient as ``[2, 256, 1024]`` beside its bias gradient over the ``[512, 1024]``
#: view); places of :meth:`~torchloom.codegen.placement.OutputPlacement.output_place`
PER_ELEMENT = ("full", "full view")
#: outputs of a column's values that are not a reduction's own result, computed from the
#: results (a batch norm's weight gradient ``sum(g * (x - mean)) * invstd``): stored after
#: every result
PER_COLUMN = ("row", "keepdim")

_KIND = {op: spec.kind for op, spec in reduction_table("{x}").items()}


@attrs.frozen
class Columns:
    """A nest's column form: ``walks``, the reductions each walk computes (a walk's
    reductions read only results of the walks before it); ``late``: the full-shape
    outputs, one of which reads a result, are stored by a walk of their own after the
    last; ``trailing``: every kept dim comes after every reduced one (a walk's columns
    are contiguous)."""

    walks: tuple[tuple[Node, ...], ...]
    late: bool
    trailing: bool


def unit_stride_dims(nest: ReductionNest, values: Sequence[Value],
                     tensor_type: Callable[[Value], Any]) -> list[int] | None:
    """The dim of unit stride of each tensor of ``values`` in the nest's shape (a group's
    inputs, and the outputs it stores per element) that has a dim over 1; None where one
    has a symbolic stride, none of unit stride, or is read through a view."""
    found = []
    for v in values:
        if not isinstance(v.type, TensorType):
            continue  # (a scalar: a size at symbolic shapes)
        t = tensor_type(v)
        if tuple(t.shape) != tuple(nest.shape):
            continue
        if any(u.op in VIEWS for u in v.users()):
            return None
        strides = t.actual_strides()
        dims = [d for d, n in enumerate(t.shape) if n != 1]
        if strides is None or not all(isinstance(strides[d], int) for d in dims):
            return None
        if not dims:
            continue
        inner = min(dims, key=lambda d: strides[d])
        if strides[inner] != 1:
            return None
        found.append(inner)
    return found


def rows_lie_in_memory_order(nest: ReductionNest, values: Sequence[Value],
                             tensor_type: Callable[[Value], Any]) -> bool:
    """Whether every tensor of ``values`` in the nest's shape lies with a reduced dim
    innermost in memory, whatever the dims' order (a transposed input summed over its
    first dim: BERT's ``sum(a.t(), 0)`` of ``[512, 256]`` strides ``[1, 512]``), and there
    is one: the row form then reads each row contiguously, where the column form read one
    element per cache line. Static strides only; an input of that shape read through a
    view answers no, and so does one column (every kept dim of size 1)."""
    if all(nest.shape[d] == 1 for d in nest.kept):
        return False
    inner = unit_stride_dims(nest, values, tensor_type)
    return bool(inner) and all(d in nest.rdims for d in inner)


def columns_lie_in_memory_order(nest: ReductionNest, values: Sequence[Value],
                                tensor_type: Callable[[Value], Any]) -> bool:
    """The mirror of :func:`rows_lie_in_memory_order`: every such tensor lies with a kept
    dim innermost in memory, and there is one (channels-last activations summed over N, H
    and W: ``[2, 32, 112, 112]`` strides ``[401408, 1, 3584, 32]``). One row (every
    reduced dim of size 1) answers no."""
    if all(nest.shape[d] == 1 for d in nest.rdims):
        return False
    inner = unit_stride_dims(nest, values, tensor_type)
    return bool(inner) and all(d in nest.kept for d in inner)


def reads_results(reductions: Sequence[Node], full: Sequence[Value]) -> bool:
    """Whether an output of ``full`` (those stored per element) is computed from a result
    of ``reductions``."""
    return bool(upstream_nodes(list(full)) & set(reductions))


def plan(nest: ReductionNest, reductions: Sequence[Node], inputs: Sequence[Value],
         outputs: Sequence[Value], tensor_type: Callable[[Value], Any],
         place: Callable[[Value], str]) -> Columns | None:
    """The column form of the nest of ``reductions`` over ``nest`` storing ``outputs``
    (``inputs``: the group's; ``place``: an output's
    :meth:`~torchloom.codegen.placement.OutputPlacement.output_place`), or None where the
    nest keeps the row form (see the module docstring)."""
    kept, shape = list(nest.kept), nest.shape
    rnumel = nest.rnumel
    values = [*inputs, *outputs]
    if not kept or (isinstance(rnumel, int) and rnumel <= 1) or \
            rows_lie_in_memory_order(nest, values, tensor_type):
        return None  # (rows in memory order: the row form reads them contiguously)
    trailing = kept == list(range(len(shape) - len(kept), len(shape)))
    # kept dims innermost by shape, or one kept dim innermost in memory (channels-last)
    one_in_memory = len(kept) == 1 and columns_lie_in_memory_order(nest, values, tensor_type)
    if kept[-1] != len(shape) - 1 and not one_in_memory:
        return None
    if any(_KIND.get(n.op) not in KINDS or len(n.outputs) != 1 for n in reductions):
        return None
    members = set(reductions)

    def late() -> bool:  # (an output's place asked only where the cpu always asked it)
        return reads_results(reductions, [v for v in outputs if v.producer not in members
                                           and place(v) in PER_ELEMENT])
    walks = tuple(tuple(level) for level in levels(reductions))
    if (len(walks) > 1 or late()) and not trailing and not one_in_memory:
        # several walks: only where a walk's columns are contiguous or one dim; otherwise
        # each walk delinearises its columns per element (softmax over dim 1 of
        # [8, 512, 196]: 7.3 ms on the cpu, eager 0.9)
        return None
    if not all(v.producer in members or place(v) in PER_ELEMENT + PER_COLUMN for v in outputs):
        return None
    return Columns(walks, late(), trailing)
