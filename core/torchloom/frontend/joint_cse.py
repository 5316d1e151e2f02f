"""Common-subexpression elimination of aot_autograd's joint forward/backward graph, before
the min-cut partitioner splits it.

The backward's formulas recompute what the forward already has (a layer norm's backward
rebuilds ``(x - mean) * rstd``); merged, the partitioner sees one value it may save or
recompute. torch's partitioner runs its own CSE (``fx_graph_cse``) when
``torch._functorch.config.cse`` is set, which imports ``torch._inductor.pattern_matcher``
and with it Inductor's lowerings: 0.57 s of a fresh process's first training step, more
than torchloom's whole compile from a warm cache. The backend runs this pass and turns that
one off.

Two nodes merge when they call the same aten overload on the same arguments (nodes already
merged count as equal; ``1``, ``1.0`` and ``True`` differ, and so do ``0.0`` and ``-0.0``)
and no op that mutates lies between them. A node never merges when its op is random
(tagged ``nondeterministic_seeded``: dropout, rand_like, ...) or allocates without
initialising (``empty*``), when its value shares storage with a graph output (eager
returns separate tensors), or when it is not an aten op (Python callables, higher-order
ops, SymInt arithmetic): those are copied as they are.

    x_hat = mul(sub(x, mean), rstd)          x_hat = mul(sub(x, mean), rstd)
    y = add(mul(x_hat, w), b)          ->    y = add(mul(x_hat, w), b)
    x_hat_1 = mul(sub(x, mean), rstd)        grad_w = sum(mul(grad, x_hat))
    grad_w = sum(mul(grad, x_hat_1))
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from torchloom.ir import float_key

#: a Python call target in one of these modules mutates nothing (getitem, SymInt arithmetic)
_PURE_MODULES = ("_operator", "math")


def joint_cse(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of ``graph`` with repeated pure aten calls merged (module docstring)."""
    kept = _output_storages(graph)
    new = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    seen: dict[Any, torch.fx.Node] = {}
    region = 0  # bumped by each mutating op: nodes merge only within one region
    for node in graph.nodes:
        if _mutates(node):
            region += 1
        key = _key(node, env, region) if _candidate(node, kept) else None
        if key is not None and key in seen:
            env[node] = seen[key]
            continue
        env[node] = new.node_copy(node, lambda n: env[n])
        if key is not None:
            seen[key] = env[node]
    return new


def _mutates(node: torch.fx.Node) -> bool:
    """Whether ``node`` may write memory another node reads (any call but a pure aten
    overload or a Python operator counts: merging fewer nodes is always correct)."""
    if node.op != "call_function":
        return node.op in ("call_method", "call_module")
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable or node.kwargs.get("out") is not None
    module, name = getattr(target, "__module__", None), getattr(target, "__name__", "")
    return module not in _PURE_MODULES and not (module == "torch" and name.startswith("sym_"))


def _candidate(node: torch.fx.Node, kept: set) -> bool:
    """Whether ``node`` may be merged with an equal earlier one."""
    target = node.target
    if node.op != "call_function":
        return False
    if target is operator.getitem:  # an output of a merged multi-output node
        return _storages(node.meta.get("val")).isdisjoint(kept)
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
        return False
    if target._schema.name.split("::")[-1].lstrip("_").startswith(("empty", "new_empty")):
        return False
    val = node.meta.get("val")
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return False  # SymInt-valued calls: nothing to gain, unbacked sizes to get wrong
    return _storages(val).isdisjoint(kept)


def _output_storages(graph: torch.fx.Graph) -> set:
    output = next((n for n in reversed(graph.nodes) if n.op == "output"), None)
    if output is None:
        return set()
    return set().union(*(_storages(n.meta.get("val")) for n in output.all_input_nodes))


def _storages(val) -> set:
    """Hashable references to the storages of the tensors in a node's value (a tensor, or
    the tuple of a multi-output op)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    tensors = [val] if isinstance(val, torch.Tensor) else \
        [v for v in val if isinstance(v, torch.Tensor)] if isinstance(val, (tuple, list)) else []
    refs = set()
    for tensor in tensors:
        try:
            refs.add(StorageWeakRef(tensor.untyped_storage()))
        except (NotImplementedError, RuntimeError):  # sparse, nested: no plain storage
            pass
    return refs


def _key(node: torch.fx.Node, env: dict, region: int):
    """A hashable key equal for calls that compute the same value, or None when an
    argument cannot be compared."""
    try:
        key = (node.target, region, _arg_key(node.args, env), _arg_key(node.kwargs, env))
        hash(key)
    except (TypeError, _Incomparable):
        return None
    return key


class _Incomparable(Exception):
    """An argument whose equality says nothing about the value computed."""


def _arg_key(value, env: dict):
    if isinstance(value, torch.fx.Node):
        return ("node", env[value])
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_arg_key(v, env) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _arg_key(v, env)) for k, v in value.items())))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", id(value.node))
    if isinstance(value, float):  # 0.0 and -0.0 differ, a NaN equals itself
        return float_key(value)
    if value is None or isinstance(value, (bool, int, str, torch.dtype, torch.device,
                                           torch.layout, torch.memory_format)):
        return (type(value).__name__, value)
    raise _Incomparable(type(value))
