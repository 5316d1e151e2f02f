"""What the views plugin knows about view ops: which ones are zero-copy, and when a
reshape would need a copy."""

from __future__ import annotations

import torch

from torchloom.api import Node, TensorType

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


def is_zero_copy(node: Node, input_type: TensorType) -> bool:
    """True when ``node`` applied to a tensor of ``input_type`` is a pure alias."""
    if node.op not in RESHAPES:
        return True
    if not input_type.is_static:
        return False
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
