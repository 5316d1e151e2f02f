"""The plan's buffer reuse: a kernel writes an output into the buffer of a value that died
before it (as Inductor reuses dead buffers), instead of allocating fresh memory.

A fresh multi-megabyte output is fresh pages to the allocator: on a CPU every 4 KB page
faults on its first write (the MLP training step's fresh 8 MB outputs cost 2,048 faults
each, ~1.8 us apiece here). Writing into a buffer the step already owns costs none.

Which buffers may be written (``plan_reuse``):

- a *storage* is a value that owns memory plus every view of it (``OpDef.aliased_input``);
  it dies after the last node reading any of its values (strictly before the node that
  reuses it: a kernel never writes a buffer it reads);
- it must be *owned* by the plan: the output of a kernel that allocates its outputs
  (``into``, below), the output of an ``aten`` op with no alias or mutation in its schema
  (aten's contract: a fresh tensor), or a graph input the caller donated (aot_autograd's
  saved activations, ``bw_donated_idxs``: nothing reads them after the backward);
- the writers: kernels (``into``, below) and aten ops with an ``out=`` overload taking the
  same arguments (``torch.mm(a, b, out=buffer)``), the latter only into buffers dead before
  them (an op may read its input after writing its output);
- never a graph output (nor a view of one), a constant, or a storage that reaches a node
  whose aliasing is unknown (a shared subgraph's call, a kernel without ``into``, an op
  the registry does not know): that node may return it;
- in place (the storage's last reader is the writing kernel itself) only where the kernel
  allows it: its ``inplace`` attribute lists the (input, output) pairs whose elements it
  reads before writing (Inductor's ``can_inplace``: the buffer read at the index written),
  and reads the storage or a view of all of it with every element in its place (dense,
  as many elements: a language model head's ``f32[128, 8192]`` product read as ``f32[1,
  128, 8192]`` by the kernel adding the logits' bias);
- the output and the dead buffer have the same dtype and device, static sizes, at least
  :data:`MIN_BYTES` (small tensors come from the allocator's free lists without faults),
  and the same shape and strides, or both dense (row-major) with the same element count:
  the writer is then given a view of the buffer in the output's shape (``view_of``; a
  cross entropy's ``f32[1, 512, 8192]`` gradient takes the saved ``f32[512, 8192]``
  log-probabilities' buffer). The layout is checked again where the call runs: a kernel
  that does not promise exact layouts (``exact_layouts`` unset) may have left a buffer
  laid out otherwise than its type, which an op then does not write (it allocates) and a
  kernel is not given viewed in another shape (``given``: None).

A graph input written by ``copy_`` (a mutated input kept in the graph: aot_autograd's
``keep_inference_input_mutations``, an optimizer step's parameters and states) is written by
the kernel computing the copied value instead, and the ``copy_`` goes (``written_inputs``):
the value is a kernel output nothing else reads, of the input's dtype, shape and dense
layout; nothing reads the input after that kernel; the kernel reads it only where its
``inplace`` pairs allow writing that output over it. Any size: a copy saved is a pass over
the tensor and a call. Such copies are listed in ``Reuse.elided``; the plan checks that the
kernel wrote the input (it may allocate where a buffer is laid out otherwise) and copies
if not.

A kernel that can write into given buffers has an attribute ``into``: ``into(outs, *inputs)``
with ``outs`` a tuple holding, per output, a tensor to write (or None: allocate); it
returns the outputs as the kernel does, and allocates where a given tensor is not laid
out as the output. ``inplace`` (optional): its (input index, output index) pairs.

Example: the MLP step's backward ``%gelu_backward`` (f32[1024, 2048]) is written into the
donated ``%gelu`` saved by the forward, whose last reader (the weight-gradient ``mm``) ran
before it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import attrs

from torchloom.codegen.restride import RESTRIDE
from torchloom.ir.graph import CONSTANT, Graph, Node, Value
from torchloom.ir.types import TensorType

#: buffers smaller than this are not reused (the allocator serves them without faults)
MIN_BYTES = 1 << 18


@attrs.frozen
class Reuse:
    """Where kernel outputs are written into dead buffers."""

    #: node index -> per output, the dead storage's value it is written into (or None)
    into: Mapping[int, tuple[Value | None, ...]] = attrs.field(factory=dict)
    #: the values written into: the plan keeps them past their last use, until then
    held: frozenset[Value] = frozenset()
    #: node index -> the ``out=`` overload that op node calls instead (see ``out_variant``)
    ops: Mapping[int, Callable] = attrs.field(factory=dict)
    #: ``copy_`` nodes (index) whose destination, a graph input, the kernel computing the
    #: copied value writes instead (see ``written_inputs``)
    elided: frozenset[int] = frozenset()
    #: kernel node -> its outputs (indices) written into graph inputs for ``elided`` copies
    inputs_written: Mapping[Node, tuple[int, ...]] = attrs.field(factory=dict)

    def elided_by(self, node: Node) -> tuple[int, ...]:
        return self.inputs_written.get(node, ())

    @property
    def count(self) -> int:
        return sum(v is not None for donors in self.into.values() for v in donors)


def plan_reuse(graph: Graph, registry, kernels: Mapping[Node, Callable],
               donated: Collection[int] = (),
               calls: Mapping[Node, Callable] | None = None) -> Reuse:
    """The reuse plan of a flat graph (the plan builder's, after lowering): ``kernels``
    maps region-call nodes to their callables, ``donated`` are the input indices whose
    buffers the caller gave up, ``calls`` op nodes that call another function than their
    op's, taking the same arguments and ``out=`` (a blocked ``mm``)."""
    root, owned, escaped = _storages(graph, registry, kernels, donated)
    written, elided = written_inputs(graph, kernels, root, escaped)
    dies: dict[Value, int] = {}
    for idx, node in enumerate(graph.nodes):
        for v in node.inputs:
            dies[root[v]] = idx
        for v in node.outputs:
            dies.setdefault(root[v], idx)
    escaped |= {root[v] for v in graph.outputs}
    free_at: dict[int, list[Value]] = {}
    # in program order: the same graph gets the same plan in every process (a set's order
    # follows the values' ids)
    order = {v: k for k, v in enumerate([*graph.inputs,
                                         *(v for n in graph.nodes for v in n.outputs)])}
    for r in sorted(owned - escaped, key=lambda v: order.get(v, -1)):
        if _key(r) is not None:
            free_at.setdefault(dies.get(r, -1), []).append(r)
    free: dict[tuple, list[Value]] = {}
    for r in free_at.get(-1, ()):  # donated inputs nothing reads
        free.setdefault(_key(r), []).append(r)
    into: dict[int, tuple[Value | None, ...]] = {}
    ops: dict[int, Callable] = {}
    variants: dict[str, Callable | None] = {}  # op name -> its out= overload, looked up once
    taken: set[Value] = set()  # written in place: its buffer lives on as the output
    for idx, node in enumerate(graph.nodes):
        kernel = kernels.get(node)
        if kernel is None and len(node.outputs) == 1 and free.get(_key(node.outputs[0])):
            if node.op not in variants:
                variants[node.op] = out_variant(node, registry)
            if variants[node.op] is not None:  # an op: a buffer dead before it, never in place
                donor = _take(free, node.outputs[0])
                fn = calls.get(node) if calls else None
                ops[idx] = variants[node.op](node.outputs[0], donor) if fn is None else \
                    _writing(fn, fn, _torch(), node.outputs[0], donor)
                into[idx] = (donor,)
        elif getattr(kernel, "into", None) is not None:
            donors = []
            for j, v in enumerate(node.outputs):
                donor = written.get((idx, j)) or _in_place(
                    node, j, getattr(kernel, "inplace", ()), root, owned - escaped - taken,
                    dies, idx)
                if donor is not None:
                    taken.add(donor)
                donors.append(donor if donor is not None else _take(free, v))
            if any(d is not None for d in donors):
                into[idx] = tuple(donors)
        for r in free_at.get(idx, ()):  # dead after this node: for the nodes after it
            if r not in taken:
                free.setdefault(_key(r), []).append(r)
    held = frozenset(d for donors in into.values() for d in donors if d is not None)
    nodes = list(graph.nodes)
    by_node: dict[Node, tuple[int, ...]] = {}
    for k, j in sorted(written):
        by_node[nodes[k]] = by_node.get(nodes[k], ()) + (j,)
    return Reuse(into, held, ops, frozenset(elided), by_node)


def written_inputs(graph: Graph, kernels: Mapping[Node, Callable],
                   root: Mapping[Value, Value], escaped: Collection[Value] = ()
                   ) -> tuple[dict[tuple[int, int], Value], set[int]]:
    """The graph inputs that kernels write in place of a later ``copy_``: ((kernel node
    index, output index) -> the input, the ``copy_`` nodes' indices). See the module
    docstring for the conditions; ``escaped``: storages that reach a node of unknown
    aliasing (it may return a view whose later reads ``root`` cannot see)."""
    position = {node: idx for idx, node in enumerate(graph.nodes)}
    readers: dict[Value, list[int]] = {}
    for idx, node in enumerate(graph.nodes):
        for v in node.inputs:
            readers.setdefault(root.get(v, v), []).append(idx)
    outputs = set(graph.outputs)
    written: dict[tuple[int, int], Value] = {}
    elided: set[int] = set()
    for idx, node in enumerate(graph.nodes):
        if node.op != "aten.copy_.default" or len(node.inputs) != 2 or node.attrs.get(
                "non_blocking"):
            continue
        dst, src = node.inputs
        producer = src.producer
        kernel = kernels.get(producer) if producer is not None else None
        if dst.producer is not None or root.get(dst) is not dst or dst in outputs or \
                dst in escaped or \
                getattr(kernel, "into", None) is None or src in outputs or \
                list(src.uses) != [node] or any(node.outputs[0].uses) or \
                node.outputs[0] in outputs or not _same_dense(dst, src):
            continue
        k = position[producer]
        if any(r > k and r != idx for r in readers[dst]):
            continue  # read after the kernel: it must still see the old values
        j = src.index
        reads = [i for i, v in enumerate(producer.inputs) if root.get(v, v) is dst]
        if reads and (len(reads) > 1 or producer.inputs[reads[0]] is not dst or
                      (reads[0], j) not in set(map(tuple, getattr(kernel, "inplace", ())))):
            continue
        written[(k, j)] = dst
        elided.add(idx)
    return written, elided


def _same_dense(a: Value, b: Value) -> bool:
    """Static, dense, row-major tensors of one dtype, device and shape."""
    ta, tb = a.type, b.type
    return (isinstance(ta, TensorType) and isinstance(tb, TensorType) and ta.dtype == tb.dtype
            and ta.device == tb.device and ta.shape == tb.shape and ta.is_dense and tb.is_dense
            and all(type(d) is int for d in ta.shape))


def _torch():
    import torch
    return torch


def out_variant(node: Node, registry) -> Callable | None:
    """For a one-output aten op whose ``out`` overload (``torch.ops.aten.<op>.out``) takes
    exactly the node's overload's arguments and then ``out`` (``mm``, ``add.Tensor``,
    ``gelu``): ``variant(output, donor)``, the call writing ``output`` into the dead
    buffer of ``donor`` (:func:`_writing`), called with the same arguments and ``out=``
    that buffer; else None."""
    opdef = registry.lookup(node.op)
    parts = node.op.split(".")
    if opdef is None or opdef.schema is None or opdef.aliases or opdef.mutates or \
            len(parts) != 3 or parts[0] != "aten" or opdef.returns_sequence or \
            opdef.category == "random":  # its random stream stays exactly eager's
        return None
    import torch
    packet = getattr(torch.ops.aten, parts[1], None)
    if packet is None or "out" not in packet.overloads():
        return None
    schema = packet.out._schema

    def described(arguments):
        return [(a.name, str(a.type), a.kwarg_only) for a in arguments]
    if described(schema.arguments) != described(opdef.schema.arguments) + [
            ("out", "Tensor", True)] or len(schema.returns) != 1:
        return None
    return lambda output, donor: _writing(packet.out, opdef.fn, torch, output, donor)


def _writing(out_op: Callable, op: Callable, torch, output: Value, donor: Value) -> Callable:
    """``out_op`` called with ``out=`` the dead buffer (viewed in ``output``'s shape where
    :func:`view_of` says), where that buffer is laid out as ``output``'s type; else ``op``
    allocates: when autograd would record the call (grad mode on and an input requiring
    grad: out= overloads refuse that), and when the buffer holds another layout than its
    type's (a kernel that does not promise exact layouts, ``exact_layouts`` unset, wrote
    it so). Written into such a buffer, the op's result would take its layout, where the
    plan's view fold (``restride``) trusts an ``mm``'s result to be dense."""
    grad_enabled, tensor = torch.is_grad_enabled, torch.Tensor
    shape, strides = view_of(donor, output), tuple(output.type.actual_strides())
    dense = output.type.is_dense  # (then any strides of size-1 dims will do, as torch says)

    def call(*args, out, **kwargs):
        if grad_enabled() and any(isinstance(a, tensor) and a.requires_grad for a in args):
            return op(*args, **kwargs)
        if not (out.is_contiguous() if dense else out.stride() == strides):
            return op(*args, **kwargs)
        return out_op(*args, out=out if shape is None else out.view(shape), **kwargs)
    return call


def given(buffer, shape: tuple[int, ...]):
    """A dead dense ``buffer`` viewed in a kernel output's ``shape`` (``view_of``), or None
    (the kernel allocates) where it is not dense: a kernel that does not promise exact
    layouts wrote it in another layout than its type's."""
    return buffer.view(shape) if buffer.is_contiguous() else None


def _in_place(node: Node, j: int, pairs: Collection[tuple[int, int]],
              root: dict[Value, Value], candidates: set[Value], dies: dict[Value, int],
              idx: int) -> Value | None:
    """The storage whose buffer output ``j`` of ``node`` may be written into: the kernel
    allows the pair, its input is the storage or a view of all of it holding each element
    where it is (:func:`_whole`: a matmul's ``f32[128, 8192]`` read as ``f32[1, 128,
    8192]``), no other input shares it, and this node is its last reader."""
    for i, k in pairs:
        v = node.inputs[i] if k == j and i < len(node.inputs) else None
        if v is None:
            continue
        r = root[v]
        if (r is v or _whole(v, r)) and r in candidates and dies.get(r) == idx and \
                (key := _key(r)) is not None and key == _key(node.outputs[j]) and \
                sum(root[u] is r for u in node.inputs) == 1:
            return r
    return None


def _whole(view: Value, base: Value) -> bool:
    """Whether ``view`` of ``base`` is all of it, element ``k`` of each (row-major) at the
    same place: both dense with one element count (a dense view of as many elements
    starts where its base does)."""
    a, b = view.type, base.type
    return isinstance(a, TensorType) and isinstance(b, TensorType) and a.is_dense and \
        b.is_dense and a.numel() is not None and a.numel() == b.numel()


def _take(free: dict[tuple, list[Value]], v: Value) -> Value | None:
    key = _key(v)
    pool = free.get(key) if key is not None else None
    return pool.pop() if pool else None


def _key(v: Value) -> tuple | None:
    """What a buffer must match to be written as ``v``: dense buffers of one element count
    are interchangeable (viewed in the writer's shape), others by shape and strides."""
    t = v.type
    if not isinstance(t, TensorType):
        return None
    size = t.nbytes()
    strides = t.actual_strides()
    if size is None or size < MIN_BYTES or not all(type(d) is int for d in strides):
        return None
    if t.is_dense:
        return (t.dtype, t.device, "dense", t.numel())
    return (t.dtype, t.device, t.shape, strides)


def view_of(buffer: Value, output: Value) -> tuple[int, ...] | None:
    """The shape to view the dead ``buffer`` in before ``output`` is written into it, or
    None where it already has the output's shape (a dense buffer of another shape: see
    :func:`_key`)."""
    shape = output.type.shape
    return None if buffer.type.shape == shape else tuple(shape)


def _storages(graph: Graph, registry, kernels: Mapping[Node, Callable],
              donated: Collection[int]) -> tuple[dict[Value, Value], set[Value], set[Value]]:
    """Each value's storage (the value owning it), the storages the plan owns, and those
    that may escape through a node of unknown aliasing."""
    root: dict[Value, Value] = {v: v for v in graph.inputs}
    owned = {graph.inputs[i] for i in donated if i < len(graph.inputs)}
    escaped: set[Value] = set()
    for node in graph.nodes:
        fresh, views = _fresh_outputs(node, registry, kernels)
        if fresh is None:  # unknown: its outputs may be (views of) any of its inputs
            escaped.update(root[v] for v in node.inputs)
        for j, v in enumerate(node.outputs):
            source = views.get(j)
            root[v] = root[node.inputs[source]] if source is not None else v
            if fresh and source is None:
                owned.add(v)
    return root, owned, escaped


def _fresh_outputs(node: Node, registry, kernels) -> tuple[bool | None, dict[int, int]]:
    """(whether the node's non-view outputs are fresh tensors, None when its aliasing is
    unknown; output index -> the input it views)."""
    if node in kernels:
        return (True if getattr(kernels[node], "into", None) is not None else None), {}
    if node.op == CONSTANT:
        return False, {}  # one tensor shared by every call
    if node.op == RESTRIDE:
        return False, {0: 0}  # a view of its base (restride.py)
    opdef = registry.lookup(node.op)
    if opdef is None or opdef.fn is None:
        return None, {}
    views = {j: i for j in range(len(node.outputs))
             if (i := opdef.aliased_input(node, j)) is not None}
    if opdef.aliases and not views:
        return None, {}  # aliases something the node's inputs do not name
    return node.op.startswith("aten.") and not opdef.mutates, views


__all__ = ["MIN_BYTES", "Reuse", "plan_reuse", "view_of", "written_inputs"]
