"""What the views plugin knows about view ops: which ones are zero-copy, and when a
reshape would need a copy."""

from __future__ import annotations

import torch

from torchloom.api import Graph, Node, TensorType

#: ops that only change metadata (shape/strides/offset) of their first input
VIEW_OPS = frozenset({
    "aten.view.default", "aten.reshape.default", "aten._unsafe_view.default",
    "aten.permute.default", "aten.transpose.int", "aten.t.default", "aten.expand.default",
    "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.unsqueeze.default",
    "aten.slice.Tensor", "aten.select.int", "aten.alias.default",
})

#: reshapes: a view when the input's strides allow it, otherwise a copy
RESHAPES = frozenset({"aten.view.default", "aten.reshape.default",
                      "aten._unsafe_view.default"})


def is_view(node: Node) -> bool:
    return (node.op in VIEW_OPS and node.region is None and len(node.outputs) == 1
            and len(node.inputs) == 1 and isinstance(node.inputs[0].type, TensorType))


#: views that may only add or remove dims of size 1 (``unit_dims_only`` checks the sizes)
_UNIT_DIM_VIEWS = RESHAPES | {"aten.unsqueeze.default", "aten.squeeze.dim",
                              "aten.squeeze.dims", "aten.squeeze.default"}


def unit_dims_only(node: Node) -> bool:
    """A view (``is_view``) that only adds or removes dims of size 1: every element at
    the same place, read with the same strides (``weight.unsqueeze(-1).unsqueeze(-1)``)."""
    if node.op not in _UNIT_DIM_VIEWS or not is_view(node) or \
            not isinstance(node.output.type, TensorType):
        return False
    return node.inputs[0].type.squeezed_shape() == node.output.type.squeezed_shape()


def is_zero_copy(node: Node, input_type: TensorType) -> bool:
    """True when ``node`` applied to a tensor of ``input_type`` is a pure alias."""
    if node.op not in RESHAPES:
        return True
    if not input_type.is_static:
        # symbolic sizes: a reshape of a contiguous tensor always aliases it
        return input_type.strides is None and None not in input_type.shape
    target = node.output.type
    if not isinstance(target, TensorType) or not target.is_static:
        return False
    base = torch.empty_strided(input_type.shape, input_type.actual_strides(),
                               dtype=input_type.torch_dtype, device="meta")
    try:
        base.view(target.shape)
    except RuntimeError:
        return False
    return True


def copy_bytes(t: TensorType) -> int:
    """Bytes a materialised copy of ``t`` reads and writes."""
    n = t.nbytes()
    return 2 * n if n is not None else 0

#: the non-aliasing twin of each view op (same arguments, returns a fresh tensor)
COPY_OF = {
    "aten.view.default": "aten.view_copy.default",
    "aten._unsafe_view.default": "aten.view_copy.default",
    "aten.permute.default": "aten.permute_copy.default",
    "aten.transpose.int": "aten.transpose_copy.int",
    "aten.t.default": "aten.t_copy.default",
    "aten.expand.default": "aten.expand_copy.default",
    "aten.squeeze.dim": "aten.squeeze_copy.dim",
    "aten.squeeze.dims": "aten.squeeze_copy.dims",
    "aten.unsqueeze.default": "aten.unsqueeze_copy.default",
    "aten.slice.Tensor": "aten.slice_copy.Tensor",
    "aten.select.int": "aten.select_copy.int",
    "aten.alias.default": "aten.alias_copy.default",
}

#: node.meta key marking a copy that views.alias-to-copy made from a view
FROM_VIEW = "views.from_view"


def swap_op(graph: Graph, node: Node, op: str, meta: dict) -> Node:
    """Replace ``node`` by an identical node with another op name (attrs and types kept)."""
    twin = graph.create(op, list(node.inputs), [v.type for v in node.outputs], dict(node.attrs),
                        names=[v.name + "_c" for v in node.outputs], before=node)
    twin.meta.update(node.meta)
    twin.meta.update(meta)
    for old, new in zip(node.outputs, twin.outputs):
        graph.replace_all_uses(old, new)
    graph.erase(node)
    return twin
