"""``canonicalize``: remove views, casts and copies that do nothing."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.ir.aliasing import returned_storage, written_storage
from torchloom.ir.graph import Graph
from torchloom.ir.types import TensorType
from torchloom.passes.base import Pass, PassContext, PassResult

#: ops that are the identity when their result's type equals their input's type
_IDENTITY_WHEN_SAME_TYPE = frozenset({
    "aten.view.default", "aten.reshape.default", "aten._unsafe_view.default",
    "aten.expand.default", "aten._to_copy.default", "aten.clone.default",
    # the copy aot_autograd makes of a tensor constant (torch.tensor(...) in a model) on
    # every call, so that a write to it never reaches the constant: private and unwritten,
    # the constant itself serves
    "aten.lift_fresh_copy.default",
})


@attrs.frozen
class Canonicalize(Pass):
    """Fold identity views and casts into their input.

    before::

        %v = aten.view.default(%x) {size = [4, 8]} : f32[4, 8]
        %e = aten.exp.default(%v) : f32[4, 8]

    after::

        %e = aten.exp.default(%x) : f32[4, 8]

    A result that is returned (itself or through views), or a value written in place, is
    kept: replacing it would change which tensors alias (a folded clone under a returned
    view would hand the caller a view of the input). So is one whose type has a dim or a
    stride of unknown size (``?``: a size Dynamo computed with ``math.ceil``): two such
    types print alike without being alike (a clone of a transposed tensor, both
    ``f32[?, ?] strided[?, 1]``, makes it contiguous; a view may regroup its dims).
    """

    name: ClassVar[str] = "canonicalize"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        written = written_storage(graph, ctx.registry)
        returned = returned_storage(graph, ctx.registry)
        folded = 0
        for node in list(graph.nodes):
            if node.op not in _IDENTITY_WHEN_SAME_TYPE or len(node.inputs) != 1:
                continue
            src, dst = node.inputs[0], node.output
            if not isinstance(src.type, TensorType) or src.type != dst.type or \
                    not _known(src.type):
                continue
            if dst in returned or src in written or dst in written:
                continue
            if node.op == "aten._to_copy.default" and set(node.attrs) - {"dtype"}:
                continue
            graph.replace_all_uses(dst, src)
            graph.erase(node)
            folded += 1
        return PassResult(folded > 0, {"folded": folded})


def _known(t: TensorType) -> bool:
    """Whether every dim and stride of ``t`` is an int or a size expression (not ``?``)."""
    return None not in t.shape and (t.strides is None or None not in t.strides)
