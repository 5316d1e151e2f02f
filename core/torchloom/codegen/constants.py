"""Tensors a plan makes the same way on every call, made once when it is built.

A graph's factories without inputs (``arange(32)`` for a mask along a dim, the
``scalar_tensor(-inf)`` of an attention mask, ``full``/``zeros``/``ones`` of a literal
shape) make the same tensor on every call; so do the views of them (``arange(32).view(1,
1, 1, 32)``). Where only fusion groups' kernels read the result (not a shared subgraph's
call, whose ops may return or write it), directly or through such views, nothing
can change it between calls, and it cannot reach the caller: :func:`fold_constants` turns
each into a ``torchloom.constant`` node of the plan's own (lowered) copy of the graph,
computed once. Constants are never buffers the plan reuses (``buffers._fresh_outputs``).
Not folded: ``empty`` (no values), random factories, results a graph output or an op
other than a kernel or a view reads (it might write it, or hand it out).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torchloom.ir.graph import CONSTANT, FUSION_GROUP, Graph, InputRef, Node, Value

#: factories whose result depends on their attributes alone
FACTORIES = frozenset(("aten.arange.default", "aten.arange.start", "aten.arange.start_step",
                       "aten.scalar_tensor.default", "aten.full.default",
                       "aten.zeros.default", "aten.ones.default"))


def fold_constants(graph: Graph, registry: Any, kernels: Mapping[Node, Callable]) -> int:
    """Replace the factories (and views of them) that only kernels read by constants;
    how many nodes were folded. ``graph`` is the plan's own flat copy (``lowering.lower``)."""
    outputs = set(graph.outputs)
    folded = 0
    for node in list(graph.nodes):
        if not _foldable(node, registry, kernels, outputs):
            continue
        opdef = registry.get(node.op)
        args, kwargs = opdef.call_template(node)
        values = [v.producer.attrs["value"] for v in node.inputs]
        args = [values[a] if isinstance(a, InputRef) else a for a in args]
        try:
            value = _real(opdef.fn, args, kwargs)
        except Exception:  # noqa: BLE001 (the call raises at run time as it would have)
            continue
        constant = graph.create(CONSTANT, [], [node.output.type], {"value": value},
                                names=[node.output.name], before=node)
        graph.replace_all_uses(node.output, constant.output)
        graph.erase(node)
        folded += 1
    return folded


def _real(fn: Callable, args: list, kwargs: dict):
    """``fn(*args, **kwargs)`` as a call of the plan would run it: a real tensor, not one of
    the fake or functional modes active while torch compiles the graph."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes(), torch.no_grad():
        return fn(*args, **kwargs)


def _foldable(node: Node, registry: Any, kernels: Mapping[Node, Callable],
              outputs: set[Value]) -> bool:
    if len(node.outputs) != 1 or node in kernels:
        return False
    opdef = registry.lookup(node.op)
    if opdef is None or opdef.fn is None or opdef.mutates:
        return False
    if node.op in FACTORIES:
        if node.inputs:
            return False
    elif not (opdef.is_view and node.inputs and opdef.aliased_input(node, 0) is not None and
              all(v.producer is not None and v.producer.op == CONSTANT for v in node.inputs)):
        return False
    return _read_only_by_kernels(node.output, registry, kernels, outputs)


def _read_only_by_kernels(value: Value, registry: Any, kernels: Mapping[Node, Callable],
                          outputs: set[Value]) -> bool:
    """Every reader of ``value`` is a fusion group's kernel, or a view whose readers are
    (recursively); it reaches no graph output."""
    if value in outputs:
        return False
    for user in value.users():
        if user in kernels and user.op == FUSION_GROUP:
            continue  # (a shared subgraph's call runs ops: it may return or write it)
        opdef = registry.lookup(user.op)
        if opdef is None or not opdef.is_view or opdef.mutates or len(user.outputs) != 1 or \
                not _read_only_by_kernels(user.output, registry, kernels, outputs):
            return False
    return True


__all__ = ["FACTORIES", "fold_constants"]
