"""Result types where torch's fake kernels disagree with its CPU kernels.

Type inference runs ops on fake tensors of the node's device (:func:`meta_infer`), and the
FX graphs that torch.compile hands over are typed by the same fake kernels. For the batch
norm family they do not say what the CPU kernels return, and a codegen that trusts a
wrong dtype reads memory as the wrong type. The rules below give the CPU kernels' types
(checked against the real kernels by ``tests/core/test_registry.py``):

- *mixed precision*: an f16/bf16 input with f32 parameters (weight, bias or running
  statistics) saves its mean and inverse std in f32 on CPU; fake kernels say the input's
  dtype.
- *functional updates*: the new running mean and variance come back in the running
  statistics' own dtype on CPU; fake kernels say f32.
"""

from __future__ import annotations

import functools

import attrs

from torchloom.ir.graph import Node, Value
from torchloom.ir.types import TensorType, Type
from torchloom.ops.registry import OpDef, device_of, meta_infer

_LOW = ("bf16", "f16")


@attrs.frozen
class BatchNormCpu:
    """Where a batch-norm op's saved statistics and running-statistics updates are."""

    #: schema positions of the parameters (weight, bias[, running_mean, running_var])
    params: tuple[int, ...] = (1, 2, 3, 4)
    #: outputs holding the saved mean and inverse std
    saved: tuple[int, ...] = (1, 2)
    #: output -> schema position of the running statistic it updates
    updates: tuple[tuple[int, int], ...] = ()


#: op -> where its statistics are (CPU kernels differ from fake kernels, see above)
CPU_RULES: dict[str, BatchNormCpu] = {
    "aten.native_batch_norm.default": BatchNormCpu(),
    "aten._native_batch_norm_legit.default": BatchNormCpu(),
    "aten._native_batch_norm_legit.no_stats": BatchNormCpu(params=(1, 2)),
    "aten._native_batch_norm_legit_no_training.default": BatchNormCpu(),
    "aten._native_batch_norm_legit_functional.default": BatchNormCpu(updates=((3, 3), (4, 4))),
    "aten._batch_norm_with_update.default": BatchNormCpu(),
    "aten._batch_norm_with_update_functional.default": BatchNormCpu(updates=((4, 3), (5, 4))),
    "aten._batch_norm_no_update.default": BatchNormCpu(),
}


def with_device_rules(opdef: OpDef) -> OpDef:
    """``opdef`` with the CPU rule of its op as its inference, if it has one."""
    rule = CPU_RULES.get(opdef.name)
    if rule is None:
        return opdef
    return attrs.evolve(opdef, infer=functools.partial(_infer_batch_norm, opdef, rule))


def _infer_batch_norm(opdef: OpDef, rule: BatchNormCpu, node: Node) -> list[Type] | None:
    types = meta_infer(opdef, node)
    if types is None or device_of(node) != "cpu":
        return types
    args, _ = opdef.bind(list(node.inputs), node.attrs)
    tensor = [a.type if isinstance(a, Value) and isinstance(a.type, TensorType) else None
              for a in args]
    x = tensor[0]
    if x is None:
        return types
    mixed = x.dtype in _LOW and any(t is not None and t.dtype == "f32"
                                    for t in (tensor[i] for i in rule.params if i < len(tensor)))
    types = list(types)
    for i in rule.saved:
        types[i] = _retyped(types[i], "f32" if mixed else x.dtype)
    for out, arg in rule.updates:
        if tensor[arg] is not None:
            types[out] = _retyped(types[out], tensor[arg].dtype)
    return types


def _retyped(t: Type, dtype: str) -> Type:
    return t.with_(dtype=dtype) if isinstance(t, TensorType) else t
