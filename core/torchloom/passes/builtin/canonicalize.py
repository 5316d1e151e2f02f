"""``canonicalize``: remove views, casts and copies that do nothing."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.ir.aliasing import returned_storage, written_storage
from torchloom.ir.graph import Graph
from torchloom.ir.types import ScalarType, TensorType
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


#: attention ops with an additive mask input: its position among the inputs when given
_MASK_INPUT: dict[str, int] = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": 3,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": 6,
    "aten.scaled_dot_product_attention.default": 3,
}

#: factories of zeros, the attribute holding the value where it is not always 0
_ZERO_FACTORIES: dict[str, str | None] = {
    "aten.zeros.default": None, "aten.zeros_like.default": None,
    "aten.new_zeros.default": None, "aten.full.default": "fill_value",
    "aten.full_like.default": "fill_value", "aten.new_full.default": "fill_value",
    "aten.scalar_tensor.default": "s",
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

    Attention given a float mask of zeros (``zeros``, ``full(0.0)``, views of them: T5's
    cross-attention bias) adds nothing to its scores: it runs without the mask (eager's
    kernel then skips reading one, and the zeros are never made).
    """

    name: ClassVar[str] = "canonicalize"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        written = written_storage(graph, ctx.registry)
        returned = returned_storage(graph, ctx.registry)
        folded = 0
        for node in list(graph.nodes):
            if node.op in _MASK_INPUT:
                folded += _drop_zero_mask(graph, node, ctx.registry)
                continue
            src = _fold_source(node)
            if src is None or not isinstance(src.type, TensorType) or not _known(src.type):
                continue
            dst = node.output
            if dst in returned or src in written or dst in written:
                continue
            graph.replace_all_uses(dst, src)
            graph.erase(node)
            folded += 1
        return PassResult(folded > 0, {"folded": folded})


def _fold_source(node):
    """The value ``node``'s result may be replaced by, as far as the node itself tells
    (its op, attributes and types; what else reads or writes them is the caller's): the
    input of an identity view or cast of the same type, the one nonempty piece of a
    ``cat`` (``_only_piece``) of the same type or only attention reads as key or value
    (``_layout_free``); else None."""
    if node.op == "aten.cat.default":
        src = _only_piece(node)
        if src is None or not (src.type == node.output.type or
                               (_last_dim_contiguous(src.type) and _layout_free(node))):
            return None
        return src
    # (a view's or expand's symbolic sizes are int inputs after the tensor: the result's
    # type says what they are)
    if node.op not in _IDENTITY_WHEN_SAME_TYPE or not node.inputs or \
            node.inputs[0].type != node.output.type or len(node.outputs) != 1 or \
            not all(isinstance(v.type, ScalarType) for v in node.inputs[1:]):
        return None
    if node.op == "aten._to_copy.default" and set(node.attrs) - {"dtype"}:
        return None
    return node.inputs[0]


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


def _drop_zero_mask(graph: Graph, node, registry) -> int:
    """Replace an attention node whose additive mask is all zeros by one without the mask
    (the same attributes: the mask is keyword-only or last among the inputs); 1 if so."""
    at = _MASK_INPUT[node.op]
    if len(node.inputs) != at + 1 or not _zeros(node.inputs[at], registry) or \
            node.inputs[at].type.dtype != getattr(node.inputs[0].type, "dtype", None):
        return 0  # (a mask of another dtype than the query's is eager's error: kept)
    new = graph.create(node.op, node.inputs[:at], [v.type for v in node.outputs],
                       dict(node.attrs), names=[v.name for v in node.outputs], before=node)
    graph.replace_uses(dict(zip(node.outputs, new.outputs)))
    graph.erase(node)
    for v, name in zip(new.outputs, [v.name for v in node.outputs]):
        graph.release_name(v.name)
        graph.release_name(name)
    graph.rename({v: old.name for v, old in zip(new.outputs, node.outputs)})
    return 1


def _zeros(value, registry) -> bool:
    """Whether ``value`` is a float tensor of zeros: a zero factory's result, or a view of
    one (whatever the view, every element it shows is zero)."""
    t = value.type
    if not isinstance(t, TensorType) or not t.torch_dtype.is_floating_point:
        return False
    node = value.producer
    while node is not None and node.op not in _ZERO_FACTORIES:
        opdef = registry.lookup(node.op)
        viewed = opdef.aliased_input(node, 0) if opdef is not None and opdef.is_view \
            and len(node.outputs) == 1 else None
        if viewed is None:
            return False
        node = node.inputs[viewed].producer
    if node is None:
        return False
    attr = _ZERO_FACTORIES[node.op]
    fill = 0 if attr is None else node.attrs.get(attr)
    return type(fill) in (int, float) and fill == 0
