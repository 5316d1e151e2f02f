"""Run decomposed composites as the composite again where their primitives run op by op.

``fusion.decompose`` splits composites (layer_norm, softmax, GELU backward, addmm, ...)
into primitives so that a native codegen can fuse them, and marks each instance (see
:mod:`torchloom.ir.provenance`). When a graph is about to run op by op with torch (the
plan builder, after inlining the groups on the ``eager`` codegen), every complete
instance is replaced by one call of its composite op: exactly what eager runs, so the
results are eager's and the cost is one kernel instead of many.

before::

    %mean = aten.mean.dim(%x) {decomposed = [...]} : f32[6, 1]
    ... eight more primitives ...
    %y = aten.add.Tensor(%m, %b) {decomposed = [...]} : f32[6, 16]

after::

    %y, %mean, %rstd = aten.native_layer_norm.default(%x, %w, %b) {eps = 1e-05, ...}

An instance whose outputs are read before its last primitive, in a way no single position
satisfies, stays as primitives.
"""

from __future__ import annotations

from typing import Any

import torch

from torchloom.ir.graph import CONSTANT, Graph, Node, Value
from torchloom.ir.provenance import Instance, find_instances
from torchloom.ir.types import ScalarType, TensorType, Type


def recompose(graph: Graph, registry: Any) -> int:
    """Replace every complete decomposition instance among ``graph``'s nodes (regions
    are not entered) by its composite op; returns how many were replaced."""
    instances = find_instances(graph)
    renamed: dict[Value, Value] = {}  # outputs of instances already replaced
    done = 0
    for inst in instances:
        if _replace(graph, inst, registry, renamed):
            done += 1
    return done


def _replace(graph: Graph, inst: Instance, registry: Any, renamed: dict[Value, Value]) -> bool:
    graph.renumber()
    members = set(inst.nodes)
    last = max(inst.nodes, key=lambda n: n.position)
    users = [u for v in inst.outputs if v is not None for u in v.uses if u not in members]
    inputs = [renamed.get(v, v) if isinstance(v, Value) else v for v in inst.inputs]
    anchor = last.next  # None: the end of the graph
    first_user = min(users, key=lambda n: n.position, default=None)
    if first_user is not None and first_user.position < last.position:
        # an output is read between the primitives: the composite goes before that reader
        if any(isinstance(v, Value) and v.producer is not None and
               v.producer.position >= first_user.position for v in inputs):
            return False
        anchor = first_user
    place = {"before": anchor} if anchor is not None else {}
    values: list[Value] = []
    for v in inputs:
        if isinstance(v, TensorType):  # not read by the decomposition: any tensor of the type
            const = graph.create(CONSTANT, [], [v], {"value": _placeholder(v)},
                                 names=["unread"], **place)
            v = const.output
        values.append(v)
    types = _output_types(inst, values, registry)
    if types is None:
        return False
    node = graph.create(inst.op, values, types, inst.attrs,
                        names=[v.name if v is not None else "unused" for v in inst.outputs],
                        **place)
    for old, new in zip(inst.outputs, node.outputs):
        if old is not None:
            graph.replace_all_uses(old, new)
            renamed[old] = new
    graph.erase_many(inst.nodes)
    return True


def _output_types(inst: Instance, inputs: list[Value], registry: Any) -> list[Type] | None:
    if all(v is not None for v in inst.outputs):
        return [v.type for v in inst.outputs]
    inferred = registry.get(inst.op).infer_types(Node(inst.op, inputs, inst.attrs))
    if inferred is not None and len(inferred) != len(inst.outputs):
        return None
    return [v.type if v is not None else
            (inferred[j] if inferred is not None else ScalarType("any"))
            for j, v in enumerate(inst.outputs)]


def _placeholder(t: TensorType) -> torch.Tensor:
    """A real tensor even when called while torch traces with fake tensors (a backward
    compiled inside aot_autograd's trace): it is a constant of the graph."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        return torch.empty_strided(t.shape, t.actual_strides(), dtype=t.torch_dtype,
                                   device=t.device).zero_()


__all__ = ["recompose"]
