"""Static checks: can a compiled graph be recorded into a CUDA graph and replayed safely?

Each check looks at the IR after the pipeline (``CompiledGraph.graph``) and returns a
plain-English reason to skip, or None. They are the seed's checks
(``torch/_dynamo/backends/cudagraphs.py``: ``find_input_mutations``, ``check_for_skip``)
restated on torchloom's IR, plus the ones it lacks (scalar inputs, dynamic shapes,
outputs sharing memory). A skipped graph runs the normal compiled path. Outputs that are
inputs or views of inputs are not a reason to skip: :func:`input_aliases` finds them and
the runner hands them back as views of the caller's tensors.

Example: this graph writes its input in place, so replaying it against a static copy of
``%x`` would leave the caller's tensor unchanged::

    graph @g(%x: f32[4] @cuda:0) {
      %y = aten.add_.Tensor(%x, %x) : f32[4] @cuda:0
      return %y
    }

``check_input_mutations`` says ``graph input %x is written in place by
aten.add_.Tensor (%y)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torchloom.api import CALL_SUBGRAPH, Graph, Node, ScalarType, TensorType, Value

#: ops that synchronise with the host or read a device value on the CPU, beyond those
#: torch tags ``data_dependent_output``, ``dynamic_output_shape`` or ``cudagraph_unsafe``
HOST_SYNC_OPS = frozenset({
    "aten._local_scalar_dense.default", "aten.item.default", "aten.is_nonzero.default",
    "aten.equal.default", "aten.allclose.default", "aten.nonzero.default",
    "aten.nonzero_static.default", "aten.masked_select.default", "aten.tolist.default",
})

_UNSAFE_TAGS = ("data_dependent_output", "dynamic_output_shape", "cudagraph_unsafe")


def body(node: Node) -> Graph | None:
    """The graph a node runs: its region, or the shared subgraph a call names."""
    if node.op == CALL_SUBGRAPH:
        return node.graph.root.subgraphs.get(node.attrs.get("callee"))
    return node.region


def walk(graph: Graph) -> Iterator[Node]:
    """Every node ``graph`` runs, inside regions and called shared subgraphs too (each
    subgraph once)."""
    seen: set[int] = set()

    def visit(g: Graph) -> Iterator[Node]:
        for node in g.nodes:
            yield node
            inner = body(node)
            if inner is None:
                continue
            if node.op == CALL_SUBGRAPH:  # a shared body is looked at once
                if id(inner) in seen:
                    continue
                seen.add(id(inner))
            yield from visit(inner)

    return visit(graph)


def _values(graph: Graph) -> Iterator[Value]:
    """Every value ``graph`` runs: inputs first, then node outputs, regions included."""
    yield from graph.inputs
    for node in walk(graph):
        inner = body(node)
        if inner is not None:
            yield from inner.inputs
        yield from node.outputs


def _where(v: Value) -> str:
    if v.producer is None:
        return f"graph input %{v.name}"
    return f"%{v.name} (from {v.producer.op})"


def check_empty(graph: Graph, registry) -> str | None:
    """A graph with no nodes has no GPU work to record."""
    if len(graph) == 0:
        return "the graph has no operations to record"
    return None


def check_scalar_inputs(graph: Graph, registry) -> str | None:
    """Python scalars are baked into the recording; a later call with another value
    would replay the old one."""
    for v in graph.inputs:
        if isinstance(v.type, ScalarType):
            return (f"graph input %{v.name} is a Python {v.type.kind}; a recording would "
                    f"freeze its value")
    return None


def check_dynamic_shapes(graph: Graph, registry) -> str | None:
    """A recording has fixed sizes; symbolic ones would need one recording per value."""
    for v in _values(graph):
        if isinstance(v.type, TensorType) and not v.type.is_static:
            return f"{_where(v)} has a dynamic shape {list(v.type.shape)}"
    return None


def _normal_device(device: str) -> str:
    return "cuda:0" if device == "cuda" else device


def check_devices(graph: Graph, registry) -> str | None:
    """Every tensor must live on one CUDA device: CPU work is not recorded (and a CPU
    tensor read by a kernel is copied at record time only)."""
    seen: dict[str, Value] = {}
    for v in _values(graph):
        if not isinstance(v.type, TensorType):
            continue
        device = _normal_device(v.type.device)
        if not device.startswith("cuda"):
            return f"{_where(v)} is on {device}; CUDA graphs record only CUDA work"
        seen.setdefault(device, v)
    if len(seen) > 1:
        where = ", ".join(f"{d} ({_where(v)})" for d, v in sorted(seen.items()))
        return f"the graph uses several devices: {where}"
    return None


def _op_tags(name: str) -> tuple[str, ...]:
    """Tag names of the torch overload called ``name`` (``aten.nonzero.default``)."""
    parts = name.split(".")
    if len(parts) != 3:
        return ()
    try:
        op = getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        return ()
    return tuple(t.name for t in getattr(op, "tags", ()))


def host_sync_reason(node: Node) -> str | None:
    """Why ``node`` cannot be recorded (it syncs or reads the device on the host), if so."""
    if node.op in HOST_SYNC_OPS:
        return "synchronises with the host"
    for tag in _op_tags(node.op):
        if tag in _UNSAFE_TAGS:
            return f"synchronises with the host (torch tag {tag})"
    return None


def check_host_sync(graph: Graph, registry) -> str | None:
    """Ops that read a device value on the CPU (``item``) or size their output from data
    (``nonzero``) synchronise, which a capture forbids."""
    for node in walk(graph):
        reason = host_sync_reason(node)
        if reason is not None:
            names = ", ".join(f"%{v.name}" for v in node.outputs) or "no result"
            return f"{node.op} ({names}) {reason}"
    return None


def alias_base(v: Value, registry, through: list[str] | None = None) -> Value:
    """The value whose memory ``v`` shares: ``v`` itself unless it is a view, followed
    through views, regions and shared subgraphs. ``through`` collects the view ops."""
    while v.producer is not None:
        node = v.producer
        region = body(node)
        if region is not None:
            inner = alias_base(region.outputs[v.index], registry, through)
            if inner.producer is not None or inner not in region.inputs:
                return v  # made inside the region
            v = node.inputs[region.inputs.index(inner)]
            continue
        i = registry.get(node.op).aliased_input(node, v.index)
        if i is None:
            return v
        if through is not None:
            through.append(node.op)
        v = node.inputs[i]
    return v


def _writes(graph: Graph, registry) -> Iterator[tuple[Node, Value]]:
    """(node, value written) for every in-place write, regions mapped to their inputs."""
    for node in graph.nodes:
        region = body(node)
        if region is not None:
            for inner, written in _writes(region, registry):
                origin = alias_base(written, registry)
                if origin in region.inputs:
                    yield inner, node.inputs[region.inputs.index(origin)]
            continue
        opdef = registry.get(node.op)
        for i in opdef.mutated_inputs(node):
            yield node, node.inputs[i]


def check_input_mutations(graph: Graph, registry) -> str | None:
    """The seed's ``find_input_mutations``: a replay reads a static copy of each input,
    so an in-place write to an input would not reach the caller's tensor."""
    for node, written in _writes(graph, registry):
        origin = alias_base(written, registry)
        if origin in graph.inputs:
            names = ", ".join(f"%{v.name}" for v in node.outputs) or "no result"
            return f"graph input %{origin.name} is written in place by {node.op} ({names})"
    return None


def input_aliases(graph: Graph, registry) -> dict[int, tuple[int, str]]:
    """Outputs that are graph inputs or views of one: ``{output index: (input index, how)}``
    (``how`` names the view ops, empty for the input itself). Not a reason to skip: the
    runner hands these back as views of the caller's tensors, not of its static copies
    (training forwards return the inputs saved for backward this way)."""
    found: dict[int, tuple[int, str]] = {}
    for k, out in enumerate(graph.outputs):
        through: list[str] = []
        base = alias_base(out, registry, through)
        if base in graph.inputs:
            found[k] = (graph.inputs.index(base), " -> ".join(reversed(through)))
    return found


def check_output_aliasing(graph: Graph, registry) -> str | None:
    """Outputs that share memory (training forwards return ``%t`` and ``detach(%t)``) must
    share it after being copied out of the recording. The runner copies the output that
    owns the memory and rebuilds the others as views of the copy, so the owner must itself
    be an output, and a contiguous one (then its copy has the same layout). Outputs
    aliasing inputs are handled apart, see :func:`input_aliases`."""
    groups: dict[Value, list[int]] = {}
    for k, out in enumerate(graph.outputs):
        if isinstance(out.type, TensorType):
            base = alias_base(out, registry)
            if base not in graph.inputs:
                groups.setdefault(base, []).append(k)
    for base, ks in groups.items():
        if len(ks) < 2:
            continue
        owner = [k for k in ks if graph.outputs[k] is base]
        if not owner:
            return (f"outputs {', '.join(map(str, ks))} share the memory of %{base.name}, "
                    f"which is not itself an output")
        if base.type.strides is not None:
            return (f"outputs {', '.join(map(str, ks))} share the memory of output "
                    f"{owner[0]} (%{base.name}), which is not contiguous")
    return None


#: every check, in the order their reasons are reported
CHECKS: tuple[Callable[[Graph, object], str | None], ...] = (
    check_empty, check_scalar_inputs, check_dynamic_shapes, check_devices,
    check_input_mutations, check_host_sync, check_output_aliasing,
)


def skip_reasons(graph: Graph, registry) -> list[str]:
    """Every reason (one per failing check) not to record ``graph``; empty when it is safe."""
    return [r for r in (check(graph, registry) for check in CHECKS) if r is not None]


__all__ = ["CHECKS", "HOST_SYNC_OPS", "skip_reasons", "host_sync_reason", "input_aliases",
           "alias_base",
           *(c.__name__ for c in CHECKS)]
