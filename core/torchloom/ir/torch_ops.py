"""Torch's operators by name, for the IR's text form (an attribute ``#op:aten.add.Tensor``
names an operator an op passes to another, as ``run_with_rng_state`` takes the op it runs)
and for the op registry above (:mod:`torchloom.ops.aten`): a name resolves only to an
operator of torch's tables, never to another attribute reached through ``torch.ops``."""

from __future__ import annotations

import re

import torch

_DUNDER_OP = re.compile(r"__[a-z]+__")


def find_callable(name: str):
    """The torch operator called ``name``: an ``OpOverload`` or a ``HigherOrderOperator``.

    Each step is checked before the next attribute is read, so a name such as
    ``load_library.__self__.import_module`` reaches nothing but torch's op tables;
    ``python.*`` names are not resolved here (see the module docstring)."""
    parts = name.split(".")
    # aten.__lshift__.Scalar is an operator; any other dunder part is not (the op-name part is
    # still only accepted when it reads as an OpOverloadPacket, below)
    if any(not p or (p.startswith("__") and (i != 1 or not _DUNDER_OP.fullmatch(p)))
           for i, p in enumerate(parts)):
        return None
    if parts[0] == "higher_order" and len(parts) == 2:
        op = getattr(torch.ops.higher_order, parts[1], None)
        return op if isinstance(op, torch._ops.HigherOrderOperator) else None
    if len(parts) not in (2, 3) or parts[0] in ("python", "higher_order"):
        return None
    try:
        namespace = getattr(torch.ops, parts[0])
        if not isinstance(namespace, torch._ops._OpNamespace):
            return None
        packet = getattr(namespace, parts[1])
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            return None
        op = getattr(packet, parts[2] if len(parts) == 3 else "default")
    except (AttributeError, RuntimeError):
        return None
    return op if isinstance(op, torch._ops.OpOverload) else None


def operator_name(op) -> str:
    """The name :func:`find_callable` resolves back to ``op`` (an ``OpOverload`` or a
    ``HigherOrderOperator``)."""
    if isinstance(op, torch._ops.HigherOrderOperator):
        return f"higher_order.{op.name()}"
    return str(op)


__all__ = ["find_callable", "operator_name"]
