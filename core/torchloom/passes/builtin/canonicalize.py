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


#: readers whose results do not depend on the layout of the inputs at these positions, as
#: long as their last dim is contiguous: attention's key and value on the CPU (its outputs
#: are laid out like the query; the kernel reads through strides, the same bits either
#: way), and the composite that picks a kernel and lays its inputs out for it. A key/value
#: cache's first concatenation (transformers' DynamicCache ``cat([empty, k], -2)``) only
#: these read is its nonempty piece, uncopied. (Not CUDA's kernels: not measured.)
_LAYOUT_FREE_INPUTS: dict[str, tuple[int, ...]] = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (1, 2),
    "aten.scaled_dot_product_attention.default": (1, 2),
}


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

    A ``cat`` whose pieces are all empty but one (of the result's shape and dtype) is that
    piece: folded where their types are equal, or where only attention reads it as its
    key or value (``_LAYOUT_FREE_INPUTS``: a key/value cache's first update, a copy of
    each layer's keys and values per call).
    """

    name: ClassVar[str] = "canonicalize"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        written = written_storage(graph, ctx.registry)
        returned = returned_storage(graph, ctx.registry)
        folded = 0
        for node in list(graph.nodes):
            if node.op == "aten.cat.default":
                src = _only_piece(node)
                if src is None or not (src.type == node.output.type or
                                       (_last_dim_contiguous(src.type) and
                                        _layout_free(node))):
                    continue
            elif node.op not in _IDENTITY_WHEN_SAME_TYPE or len(node.inputs) != 1:
                continue
            else:
                src = node.inputs[0]
            dst = node.output
            if not isinstance(src.type, TensorType) or not _known(src.type) or \
                    (node.op != "aten.cat.default" and src.type != dst.type):
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


def _only_piece(node):
    """The one piece of a ``cat`` that is not empty, when the result is exactly it (its
    shape and dtype; every other piece of static sizes and no element), else None."""
    out = node.output.type
    if not isinstance(out, TensorType) or not node.inputs:
        return None
    pieces = [v for v in node.inputs
              if not (isinstance(v.type, TensorType) and v.type.numel() == 0)]
    if len(pieces) != 1 or not all(isinstance(v.type, TensorType) for v in node.inputs):
        return None
    src = pieces[0].type
    if src.shape != out.shape or src.dtype != out.dtype or src.device != out.device:
        return None
    return pieces[0]


def _last_dim_contiguous(t: TensorType) -> bool:
    """(Eager's CPU attention with a strided last dim gives values that vary call to
    call.)"""
    return t.strides is None or not t.shape or t.strides[-1] == 1 or t.shape[-1] == 1


def _layout_free(node) -> bool:
    """Every reader of ``node``'s result reads it where its layout does not matter."""
    out = node.output
    return bool(out.uses) and all(
        user.op in _LAYOUT_FREE_INPUTS and
        all(i in _LAYOUT_FREE_INPUTS[user.op] for i, v in enumerate(user.inputs) if v is out)
        for user in out.users())
