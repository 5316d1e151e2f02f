"""The codegen protocol: how a region node (fusion group) becomes a callable kernel.

Compiling is split in two so kernels can be cached on disk as text (never pickle):
``generate`` turns a group into :class:`KernelSource` (source text + JSON metadata), and
``load`` turns a KernelSource into a callable. ``compile_group`` does both; the runtime's
kernel cache stores what ``generate`` returned and calls only ``load`` on a hit.

The kernel's plan, for ``explain``: ``generate`` may put these keys in the metadata
(:data:`PLAN_KEYS`): ``grid`` (list of ints: programs launched per dim), ``bytes_read`` and
``bytes_written`` (what the kernel's own plan moves: a tensor read in two passes counts
twice, a small broadcast operand re-read by every program counts once). A codegen that
leaves them out is described op by op (each op outside views reads its inputs and writes
its outputs).

Judging once, writing once: ``supports`` may have to write the kernel to know whether it
can (an index the target cannot express shows only then). A codegen keeps what it wrote
for ``generate`` of the same group with :class:`Written` (so a kernel is written once per
compile), and may have ``available(group) -> Reason | None``: a cheap check of what this
machine lacks for the group (a C compiler, CUDA), writing nothing. With it, the kernel
cache loads a group's stored kernel (an earlier process's, on disk or in the shared cache,
made by the same codegen code) without asking ``supports`` or writing anything: a warm
start judges no group.

Targets that are not on this machine (``explain --target sm_90``): a codegen may have
``for_target(target) -> Codegen | None``, a copy of itself that generates for ``target``
(its ``supports`` judges a group as on that device; it is never loaded), whose
``compile_for_target(kernel) -> dict`` compiles a generated kernel ahead of time and
returns ``{"registers": int, "spills": int}``.

Building a graph's kernels together: a codegen may have ``prepare(groups, registry)``. Before
any group of a graph compiles, the runtime calls it with every fusion group of the graph
that this codegen is the first of the chain to support (the ``cpu`` codegen builds them into
one library with one compiler call); ``load`` is still called per group afterwards. A
``prepare`` that raises only costs the batching: each group then compiles on its own.

Building in the background: a codegen's ``prepare`` may start its build and return, and
``load`` hand back a kernel that says ``ready()`` (never waits: whether the build has ended)
and ``resolve()`` (waits, gives the final kernel, raises what the build raised); calling it
resolves it. Its ``exact_layouts``, ``inplace``, ``into`` and ``trusting`` are known before
the build ends. The runtime makes the plan meanwhile and, by the pipeline's ``[runtime]
first_calls``, waits at the first call or runs the group op by op until ``ready()``
(:mod:`torchloom.runtime.tiered`); a ``library_call`` function may have ``ready()`` too (the
op itself runs until then under ``"eager"``).

Starting early: a codegen may have ``anticipate(graph, registry)``, called with each graph
as the frontend imported it, before any pass runs (its op nodes, not yet grouped). It may
start work that needs only the ops the graph holds and must not edit the graph: the
``cpu`` codegen probes its compiler and starts building, on threads, the libraries its
``library_call`` will offer for the graph's attention and dropout nodes (and, for a
training forward, the backward's attention), so they build while the passes and the plan
run. What it starts is a guess: a node the passes remove leaves a library built for
nothing, one they add is started when the plan asks for it, as without ``anticipate``.
One that raises is logged and skipped.

Writing into given buffers: a kernel (the callable ``load`` returns) may have ``into(outs,
*inputs)``, running the kernel with output j written into the tensor ``outs[j]`` (None:
allocated as usual; a tensor not laid out as the output is not used), and ``inplace``, the
(input index, output index) pairs for which ``outs[j]`` may be input i itself (the kernel
reads each element of the input before it writes that element of the output). The plan
gives it buffers that died before the group, or that die at it for those pairs
(:mod:`torchloom.codegen.buffers`), so a step does not fault in fresh memory per output.

Skipping checks the caller made: a kernel may have ``trusting(inputs, outputs) -> kernel``,
``inputs`` and ``outputs`` mapping positions to static tensor types: the caller
promises that the tensor at input position i (the buffer given for output j) has that
type's dtype, shape and strides (strides of dims of size 1 aside) on every call. The
kernel returned (with ``__call__`` and ``into``) leaves out the layout checks it would make
there where the type is the layout it was written for. With ``whole=True`` the caller also
promises tensors with storage there (no functorch wrapper, fake or functional tensor),
which the kernel may read without asking Python. The plan asks it for the graph's inputs,
which its guards have checked, when they reach a kernel unchanged (``whole`` on the path
its C check passed: ``guards.FastGuard`` learns only from such tensors).

Outputs laid out as their types: a kernel may have ``exact_layouts = True``: every output
it returns has its type's strides (dims of size 1 aside), whatever buffers it was given.
The plan then makes each view of such an output from the output's type alone, in one call
(:mod:`torchloom.codegen.restride`), instead of calling the view ops one by one.

Autotuning shared by a fleet (the remote cache, :mod:`torchloom.runtime.remote_cache`): a
kernel that tunes itself may have ``apply_tuning(record: dict)`` (use a result tuned
elsewhere; raise ``ValueError`` for one that is not valid for this kernel) and
``share_tuning(callback)`` (the kernel calls ``callback`` with its JSON-able result once it
has tuned). The kernel cache calls ``share_tuning`` when the shared cache has no result.

Plain nodes: a codegen may have ``library_call(node, registry) -> Callable | None``: for an
op node outside every group, a function the plan calls in place of the op (same
arguments, outputs and layouts, the same effects, random streams included; the same values,
or values within the rounding of another summation order where the op's own values are
not fixed by it, as a fused kernel's are: the ``cpu`` codegen's eager ``native_dropout`` in
SIMD loops, bit for bit, and its causal attention by blocks, within rounding), or None.
The first codegen of the chain that gives one wins (``runtime.executor.library_calls``);
one that raises is logged and skipped.

Built artifacts shared by a fleet: a codegen that builds something costly beside its source
(the ``cpu`` codegen's shared libraries) may have ``with_artifacts(store) -> Codegen``, a
copy of itself that looks in ``store`` (an :class:`ArtifactStore`) for what it would build,
and puts there what it builds. With a shared cache the compiler makes that copy once and
compiles with it. What ``store.get`` returns is authentic (written by a holder of the
fleet's key) but the codegen still checks it is what it asked for before using it, and
calls ``store.reject(name, why)`` (then builds it itself) when it is not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import attrs

from torchloom.ir.graph import Graph, Node
from torchloom.ops.registry import eager_rejects

#: a compiled group: called with the group's inputs, returns a tuple of its outputs
Kernel = Callable[..., tuple]


class RegionKernel:
    """A kernel that runs ``graph`` op by op with torch (what the ``eager`` codegen makes).

    The runtime's plan builder inlines ``graph`` into the plan that would call the kernel,
    so a group on it costs what its ops cost, without a call per group, and decomposed
    composites in it can run whole again; called directly, it runs ``build()``'s callable
    (built on the first call)."""

    __slots__ = ("graph", "_build", "_fn")

    def __init__(self, graph: Graph, build: Callable[[], Callable[..., tuple]]):
        self.graph = graph
        self._build = build
        self._fn: Callable[..., tuple] | None = None

    def __call__(self, *args) -> tuple:
        if self._fn is None:
            self._fn = self._build()
        return self._fn(*args)


#: metadata keys describing a kernel's plan (see the module docstring)
PLAN_KEYS = ("grid", "bytes_read", "bytes_written")


@attrs.frozen
class Reason:
    """Why a codegen will not take a group; shown by ``explain``."""

    codegen: str
    message: str

    def __str__(self) -> str:
        return f"{self.codegen}: {self.message}"


@attrs.frozen
class KernelSource:
    """What a codegen generated for one group: readable source and JSON-able metadata."""

    codegen: str
    source: str
    metadata: dict[str, Any] = attrs.field(factory=dict)


class ArtifactStore(Protocol):
    """Binary artifacts shared by a fleet, by name (see the module): a codegen's namespace
    of the shared cache, its entries authenticated and size-limited by the store."""

    def get(self, name: str) -> bytes | None:
        """The authentic bytes stored under ``name``, or None (absent, rejected, no server)."""

    def put(self, name: str, data: bytes) -> None:
        """Share ``data`` under ``name`` (not shared when over the store's size limit)."""

    def reject(self, name: str, why: str) -> None:
        """Report an entry ``get`` returned that is unusable (said once); the codegen builds
        it itself and its ``put`` replaces the entry."""


@runtime_checkable
class Codegen(Protocol):
    """A code generator for region nodes. Registered through ``torchloom_codegens``."""

    name: str
    version: str

    def supports(self, group: Node, registry: Any) -> Reason | None:
        """None if this codegen can compile ``group``; otherwise the reason it cannot."""

    def generate(self, group: Node, registry: Any) -> KernelSource:
        """Source text and metadata for the group's kernel (no compilation needed to read)."""

    def load(self, kernel: KernelSource, registry: Any) -> Kernel:
        """A callable running the kernel: ``kernel(*inputs) -> tuple(outputs)``."""


class Written:
    """What a codegen's ``supports`` wrote for a group, kept for its ``generate`` (and a
    ``prepare``) of that very group, so each kernel is written once per compile. Keyed by
    the group and registry objects (not equal ones: a group edited since is another
    object), at most ``size`` groups, the oldest dropped."""

    def __init__(self, size: int = 256):
        self.size = size
        self._items: dict[tuple[int, int], tuple[Node, Any, Any]] = {}

    def get(self, group: Node, registry: Any, write: Callable[[], Any]) -> Any:
        """What was written for ``group`` under ``registry``, else ``write()`` (kept)."""
        key = (id(group), id(registry))
        item = self._items.get(key)
        if item is not None and item[0] is group and item[1] is registry:
            return item[2]
        value = write()
        if len(self._items) >= self.size:
            del self._items[next(iter(self._items))]
        self._items[key] = (group, registry, value)
        return value


def compile_group(codegen: Codegen, group: Node, registry: Any) -> Kernel:
    return codegen.load(codegen.generate(group, registry), registry)


def same_strides(shape, strides, expected) -> bool:
    """Whether ``strides`` are ``expected`` but at dims of size 1 (which torch gives any
    stride, and which address no other element): a tensor so laid out is read right by a
    kernel addressing it with ``expected``."""
    return all(n == 1 or s == e for n, s, e in zip(shape, strides, expected))


def laid_out_as(a: Any, expected: tuple[int, ...]) -> Any:
    """Tensor ``a`` itself where its strides are ``expected`` (:func:`same_strides`), else
    a copy with those strides: what a kernel reading fixed strides is handed. Strides
    under which elements share memory (an input the graph expanded, ``strided[0, 1]``,
    handed laid out otherwise) take a storage holding each element where the kernel reads
    it (the elements sharing a place are equal in such a value: any one of them)."""
    if same_strides(a.shape, a.stride(), expected):
        return a
    import torch
    out = torch.empty_strided(a.shape, expected, dtype=a.dtype, device=a.device)
    if torch._debug_has_internal_overlap(out) == 0:  # (0: no two elements share memory)
        return out.copy_(a)
    place = torch.zeros(a.shape, dtype=torch.int64, device=a.device)
    for d, (n, s) in enumerate(zip(a.shape, expected)):
        place += (torch.arange(n, device=a.device) * s).view([n if k == d else 1
                                                             for k in range(a.dim())])
    storage = torch.empty(int(place.max()) + 1 if a.numel() else 0, dtype=a.dtype,
                          device=a.device)
    storage[place.reshape(-1)] = a.reshape(-1)
    return storage.as_strided(a.shape, expected)


def rejected_by_eager(name: str, group: Node, registry: Any) -> Reason | None:
    """Codegen ``name``'s reason to decline ``group`` where eager's kernel raises for one
    of its pointwise ops or reductions at these dtypes (``eager_rejects``: a negative
    integer power of an integer, ``abs`` of a bool): eager runs the group and raises it,
    where a kernel would compute something. None where eager takes every op."""
    for node in group.region.nodes:
        if registry.category(node.op) in ("pointwise", "reduction"):
            why = eager_rejects(registry.get(node.op), node)
            if why is not None:
                return Reason(name, f"{node.op}: eager's kernel rejects these dtypes "
                                    f"({why}); eager runs the group and raises it")
    return None
