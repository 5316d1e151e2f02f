"""Kernels described without running them.

``describe_kernels`` lists what one call of a compiled graph launches, in order: one entry
per fusion group (its codegen's plan: grid, bytes read and written) and per op outside a
group that launches a kernel (reads its inputs, writes its outputs). ``StaticPlan`` is
the compile of a graph for a device that is not on this machine (``explain --target
sm_90``): each group goes to the first codegen that takes it for the target, its kernel
is generated and compiled ahead of time (registers and spills read from the binary), and
nothing runs.

Bytes are counted per tensor: the distinct elements its strides reach times the element
size (an expanded input counts what is stored, not what is broadcast).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from torchloom.codegen.base import KernelSource, Reason
from torchloom.codegen.gathers import input_read_bytes
from torchloom.ir.graph import CALL_SUBGRAPH, CONSTANT, FUSION_GROUP, Graph, Node, Value
from torchloom.ir.types import DTYPES, TensorType
from torchloom.ops.registry import OpRegistry
from torchloom.runtime.executor import GroupChoice
from torchloom.runtime.group_failure import codegen_failed


@attrs.frozen
class KernelDetail:
    """One kernel launch of a compiled graph (``explain --json``'s ``kernel_details``)."""

    graph: str
    name: str
    codegen: str
    grid: list[int]
    bytes_read: int
    bytes_written: int
    bytes_compulsory: int
    registers: int | None = None
    spills: int | None = None

    def as_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def tensor_bytes(v: Value) -> int:
    """Bytes of the distinct elements ``v`` holds (0 for scalars and symbolic shapes)."""
    t = v.type
    if not isinstance(t, TensorType) or not t.is_static:
        return 0
    elements = 1
    for size, stride in zip(t.shape, t.actual_strides()):
        if stride != 0:
            elements *= size
        elif size == 0:
            elements = 0
    return elements * DTYPES[t.dtype].itemsize


def _free(node: Node, registry: OpRegistry) -> bool:
    """Launches nothing: a constant, Python plumbing or a view (as ``count_kernels``)."""
    if node.op == CONSTANT or node.op.startswith("python."):
        return True
    return registry.get(node.op).category == "view"


def _io_bytes(values: Sequence[Value]) -> int:
    return sum(tensor_bytes(v) for v in dict.fromkeys(values))


def _op_by_op(region: Graph, registry: OpRegistry) -> tuple[int, int]:
    """(read, written) of a region run op by op: each op reads its inputs and writes its
    outputs, views and plumbing are free."""
    read = written = 0
    for node in region.nodes:
        if node.region is not None:
            r, w = _op_by_op(node.region, registry)
            read, written = read + r, written + w
        elif not _free(node, registry):
            read += _io_bytes(node.inputs)
            written += _io_bytes(node.outputs)
    return read, written


def describe_kernels(graph: Graph, registry: OpRegistry,
                     sources: Mapping[Node, KernelSource],
                     resources: Mapping[Node, dict] | None = None,
                     name: str | None = None) -> list[KernelDetail]:
    """The kernels one call of ``graph`` launches. ``sources``: each fusion group's
    generated kernel; ``resources``: registers and spills of groups compiled for a
    target. Shared subgraphs are described once per call."""
    resources = resources or {}
    name = name or graph.name
    out: list[KernelDetail] = []
    for node in graph.nodes:
        if node.op == FUSION_GROUP:
            # a group no codegen generated for (never compiled): described op by op
            kernel = sources.get(node) or KernelSource("eager", "")
            meta = kernel.metadata
            compulsory = _group_input_bytes(node) + _io_bytes(node.outputs)
            if all(k in meta for k in ("grid", "bytes_read", "bytes_written")):
                grid = [int(g) for g in meta["grid"]]
                read, written = int(meta["bytes_read"]), int(meta["bytes_written"])
            else:
                grid, (read, written) = [], _op_by_op(node.region, registry)
            res = resources.get(node, {})
            out.append(KernelDetail(name, meta.get("kernel", node.region.name), kernel.codegen,
                                    grid, read, written, compulsory, res.get("registers"),
                                    res.get("spills")))
        elif node.op == CALL_SUBGRAPH:
            callee = graph.root.subgraphs[node.attrs["callee"]]
            out.extend(describe_kernels(callee, registry, sources, resources, name))
        elif node.region is not None:
            out.extend(describe_kernels(node.region, registry, sources, resources, name))
        elif not _free(node, registry):
            read, written = _io_bytes(node.inputs), _io_bytes(node.outputs)
            out.append(KernelDetail(name, node.op, "aten", [], read, written, read + written))
    return out


def graph_compulsory(graph: Graph, registry: OpRegistry) -> int:
    """Bytes a graph must move however it is fused: each tensor input and output once. An
    output that is an input, or a view of one, moves nothing; outputs viewing the same
    data count it once."""
    inputs = set(graph.inputs)
    total = sum(_input_bytes(v) for v in dict.fromkeys(graph.inputs))
    stored: set[Value] = set()
    for v in graph.outputs:
        source = v  # the value whose data ``v`` views
        while source.producer is not None and not _free_view_barrier(source.producer,
                                                                        registry):
            source = source.producer.inputs[0]
        if source not in inputs and source not in stored:
            stored.add(source)
            total += tensor_bytes(source)
    return total


def _input_bytes(v: Value) -> int:
    """The bytes of graph input ``v`` the graph must read (``input_read_bytes``: a table
    only gathers read moves their rows; in groups, through the group's own inputs)."""
    tables, readers = {v}, []
    for u in v.users():
        if u.region is None:
            readers.append(u)
        else:
            inner = {w for k, w in zip(u.inputs, u.region.inputs) if k is v}
            tables |= inner
            readers += [g for w in inner for g in w.users()]
    return input_read_bytes(v, tables, readers, tensor_bytes)


def _group_input_bytes(group: Node) -> int:
    """The bytes of its inputs a fusion group must read (``input_read_bytes``)."""
    total = 0
    for v in dict.fromkeys(group.inputs):
        inner = {w for k, w in zip(group.inputs, group.region.inputs) if k is v}
        total += input_read_bytes(v, inner, [g for w in inner for g in w.users()], tensor_bytes)
    return total


def _free_view_barrier(node: Node, registry: OpRegistry) -> bool:
    """Whether ``node`` produces new data (anything but a view of its first input)."""
    return node.region is not None or not node.inputs or \
        registry.get(node.op).category != "view"


def retarget(graph: Graph, device: str) -> None:
    """Every tensor value of ``graph`` (regions and shared subgraphs too) on ``device``:
    a graph traced on one device, compiled for another."""
    def walk(g: Graph) -> None:
        for v in [*g.inputs, *(v for n in g.nodes for v in n.outputs)]:
            if isinstance(v.type, TensorType) and v.type.device != device:
                g.set_type(v, attrs.evolve(v.type, device=device))
        for n in g.nodes:
            if n.region is not None:
                walk(n.region)
    walk(graph)
    for sub in graph.subgraphs.values():
        walk(sub)


class StaticPlan:
    """A graph compiled for ``target`` without running anything: a codegen per group
    (``choices``, as :class:`~torchloom.runtime.executor.CompiledGraph` has), its
    generated kernel (``sources``) and, where the codegen compiles for the target, the
    kernel's registers and spills (``resources``). ``memo`` (source text -> resources)
    is shared across graphs so that equal kernels compile once."""

    def __init__(self, graph: Graph, registry: OpRegistry, codegens: Sequence[Any],
                 target: str, memo: dict[str, dict] | None = None,
                 repro_dir: Path | None = None, warned: set[str] | None = None):
        self.graph = graph
        self.target = target
        self.choices: list[GroupChoice] = []
        self.sources: dict[Node, KernelSource] = {}
        self.resources: dict[Node, dict] = {}
        memo = memo if memo is not None else {}
        warned = warned if warned is not None else set()
        for node in _groups(graph):
            choice = GroupChoice(node, "eager")
            self.choices.append(choice)
            for cg in codegens:
                stage, compile_ahead = "judging", getattr(cg, "compile_for_target", None)
                try:  # a codegen's bug costs only this group (see runtime.group_failure)
                    reason = cg.supports(node, registry)
                    if reason is None:
                        stage = "compiling"
                        kernel = cg.generate(node, registry)
                        if compile_ahead is not None and kernel.source not in memo:
                            memo[kernel.source] = compile_ahead(kernel)
                except Exception as exc:
                    reason = codegen_failed(cg, stage, node, exc, repro_dir, warned)
                if reason is not None:
                    choice.fallback_reasons.append(reason)
                    continue
                if compile_ahead is not None:
                    self.resources[node] = memo[kernel.source]
                choice.codegen = cg.name
                self.sources[node] = kernel
                break
            else:
                raise TypeError(f"no codegen generated the group: "
                                f"{'; '.join(map(str, choice.fallback_reasons))}")

    def kernels(self, registry: OpRegistry, name: str | None = None) -> list[KernelDetail]:
        return describe_kernels(self.graph, registry, self.sources, self.resources, name)


def _groups(graph: Graph) -> list[Node]:
    """Every fusion group of ``graph``, its regions and shared subgraphs, each once."""
    found: list[Node] = []

    def walk(g: Graph) -> None:
        for n in g.nodes:
            if n.op == FUSION_GROUP:
                found.append(n)
            elif n.region is not None:
                walk(n.region)
    walk(graph)
    for sub in graph.subgraphs.values():
        walk(sub)
    return found


def target_codegens(codegens: Sequence[Any], target: str) -> tuple[list[Any], list[Reason]]:
    """The codegen chain for ``target``: each codegen's ``for_target(target)`` copy; a
    codegen without one (``eager``, which runs anywhere) as it is; one that declines the
    target is left out, with the reason."""
    chain, declined = [], []
    for cg in codegens:
        for_target = getattr(cg, "for_target", None)
        if for_target is None:
            chain.append(cg)
            continue
        copy = for_target(target)
        if copy is None:
            declined.append(Reason(cg.name, f"does not generate for target {target!r}"))
        else:
            chain.append(copy)
    return chain, declined
