"""``torch._foreach_*`` ops as one op per tensor: what a compiled optimizer step is made of.

An optimizer's ``foreach`` step (AdamW, Adam, SGD, ...; ``torch.compile(optimizer.step)``)
reaches aot_autograd as ops over lists of tensors, which no pass fuses::

    _foreach_mul = aten._foreach_mul.Scalar([p0, p1], 0.999)
    _foreach_addcmul = aten._foreach_addcmul.Scalar(_foreach_mul, [g0, g1], [g0, g1], 0.001)

Decomposed while aot_autograd traces, each becomes the same op once per tensor::

    mul = aten.mul.Tensor(p0, 0.999);  addcmul = aten.addcmul.default(mul, g0, g0, value=0.001)
    mul_1 = aten.mul.Tensor(p1, 0.999);  addcmul_1 = aten.addcmul.default(mul_1, g1, g1, ...)

so that fusion makes one group per parameter of the whole update. The CPU's ``foreach``
kernels loop over the tensors calling exactly these ops (``foreach_tensor_*_slow``), so the
values are eager's. Only on the CPU: elsewhere (CUDA) an op stays whole (the decomposition
returns ``NotImplemented``, which the tracer reads as "trace the op"), since a GPU's
foreach kernel updates every tensor in one launch where per-tensor groups would take one
each. Overloads with a ``Tensor`` of per-tensor scalars (``_foreach_addcmul.Tensor``)
and the ones with no per-tensor op are left whole: they run as eager runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: foreach names whose per-tensor op has another name
_RENAMED = {"zero": "zeros_like"}
#: argument types that hold one entry per tensor of the lists
_PER_TENSOR_TYPES = ("List[Tensor]", "Tensor[]", "List[number]", "Scalar[]", "float[]",
                     "List[float]")


def foreach_decompositions() -> dict[Any, Callable]:
    """Every functional ``aten._foreach_*`` overload that can be run as one op per tensor,
    mapped to a function doing so (for aot_autograd's ``decompositions``)."""
    import torch
    table: dict[Any, Callable] = {}
    names = {s.name[len("aten::"):] for s in torch._C._jit_get_all_schemas()
             if s.name.startswith("aten::_foreach_")}
    for name in sorted(names):
        if name.endswith("_"):
            continue  # the in-place overloads are functionalized before decomposition
        base = name[len("_foreach_"):]
        per_tensor = _per_tensor_op(base)
        if per_tensor is None:
            continue
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            spread = _spread_arguments(op._schema)
            if spread is not None:
                table[op] = _per_tensor(per_tensor, spread, base)
    return table


def _per_tensor_op(base: str) -> Callable | None:
    """The op eager's CPU ``_foreach_<base>`` calls per tensor, taking the foreach op's
    positional arguments (one entry of each list)."""
    import torch
    aten = torch.ops.aten
    if base in ("addcmul", "addcdiv"):  # the value is a keyword of the per-tensor op
        op = getattr(aten, base).default
        return lambda t, t1, t2, value=1: op(t, t1, t2, value=value)
    if base == "norm":  # its dtype is positional, the norm's a keyword
        return lambda t, ord=2, dtype=None: aten.linalg_vector_norm.default(t, ord, dtype=dtype)
    if base in ("maximum", "minimum"):  # with a scalar, eager clamps (foreach_tensor_clamp_*)
        pair, clamp = getattr(aten, base), aten.clamp_min if base == "maximum" else aten.clamp_max
        return lambda t, other: (pair(t, other) if isinstance(other, torch.Tensor)
                                 else clamp(t, other))
    return getattr(aten, _RENAMED.get(base, base), None)


def _spread_arguments(schema) -> tuple[bool, ...] | None:
    """Per positional argument of a foreach overload, whether it holds one entry per
    tensor; None when the overload has no per-tensor form (a ``Tensor`` of scalars, an
    output that is not a list, a keyword-only list)."""
    returns = [str(r.type) for r in schema.returns]
    if returns != ["List[Tensor]"]:
        return None
    spread = []
    for argument in schema.arguments:
        text = str(argument.type)
        if argument.kwarg_only:
            if text in _PER_TENSOR_TYPES:
                return None
            continue
        spread.append(text in _PER_TENSOR_TYPES)
    if not any(spread):
        return None
    if schema.overload_name == "Tensor" and schema.name.startswith("aten::_foreach_addc"):
        return None  # scalars as a 1-D tensor: one value each, read on the host by eager
    return tuple(spread)


def _per_tensor(op, spread: tuple[bool, ...], base: str) -> Callable:
    def decomposed(*args, **kwargs):
        if not _on_cpu(args):
            return NotImplemented  # traced whole: a GPU's foreach kernel is one launch
        lists = [a for a, s in zip(args, spread) if s]
        count = len(lists[0])
        if any(len(entries) != count for entries in lists):
            raise RuntimeError(f"_foreach_{base}: the lists differ in length "
                               f"({', '.join(str(len(entries)) for entries in lists)})")
        return [op(*[a[i] if s else a for a, s in zip(args, spread)], **kwargs)
                for i in range(count)]
    decomposed.__name__ = f"_foreach_{base}_per_tensor"
    return decomposed


def _on_cpu(args) -> bool:
    """Whether every tensor among ``args`` (and in their lists) is on the CPU."""
    import torch
    tensors = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a])
               if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.device.type == "cpu" for t in tensors)


__all__ = ["foreach_decompositions"]
