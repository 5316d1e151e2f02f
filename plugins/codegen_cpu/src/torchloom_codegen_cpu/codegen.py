"""The ``cpu`` codegen: one C function per fusion group, built by the system compiler.

``supports`` declines (with the reason ``explain`` shows) groups whose tensors are not on
the CPU, groups with an op or dtype it has no template for, and every group when no C
compiler is found (``CC``, default ``cc``). ``generate`` returns the whole translation
unit (prelude + function) as the kernel source, which the kernel cache keeps as text, and
JSON metadata. ``load`` builds (or finds in ``<cache>/cpu``) the shared library for that
source with each kernel's CPython entry (entry.py; see toolchain.py), loads it and returns
``kernel(*inputs) -> tuple(outputs)`` (launcher.py): outputs are allocated as
``torch.empty_strided`` would, the C function gets data pointers, the values of the
group's size symbols and the thread count
(``torch.get_num_threads()`` at call time). Symbolic sizes are arguments, so one kernel
(and one library) serves every size; its source and cache keys carry the symbolic
structure (symbols numbered as the canonical form numbers them), never a concrete size.

One library per graph: before the graph's groups compile one by one, the runtime hands the
codegen all of them (``prepare``), and it builds them into one translation unit with one
compiler call; ``load`` then finds each kernel in that library.

f16 groups compile only with a compiler whose f16 conversions vectorize (clang's
``_Float16``: one F16C instruction each way). gcc 12 never vectorizes them, and the bit
arithmetic the prelude uses instead (~6 vector operations to widen, ~16 to narrow, 9 to
round after each op) made every f16 group measured slower than eager (0.5-0.75x: pointwise
chains, softmax, layer_norm, GELU), so there the group runs on eager (its composites whole)
and ``explain`` says why. ``TORCHLOOM_CPU_F16`` (or ``f16=``) chooses: ``auto`` (that
rule, the default), ``compile`` (always), ``eager`` (never).

Libraries live in ``<cache>/cpu``. Where that cannot be used (a file in its place or in
place of the cache directory, no permission, a read-only disk), they are built in a
temporary directory made once per codegen object and removed at exit, with one warning:
the groups still compile, only a later process builds them again.

A fleet shares the libraries: with a shared cache, the compiler compiles with
``with_artifacts(store)``'s copy, which looks a library up in ``store`` before running the
compiler and puts there what it builds (see toolchain.py), so a process whose fleet built
a graph's library runs no compiler.

Plain nodes outside groups: ``library_call`` gives the plan a function for an op node it
runs with eager's results faster than eager: ``native_dropout`` (f32, f64, bf16), whose mask
eager draws one element at a time from torch's mt19937 stream, computed from the same
stream with SIMD loops, and ``bernoulli.p`` of f32/f64 (the same draws; random_stream.py;
also wrapped by activation checkpointing's ``run_and_save_rng_state``/
``run_with_rng_state``); causal f32 flash attention and its backward,
by blocks that skip what the mask hides (attention.py); the backward of f32 depthwise
convolutions, by loops over the channels (depthwise.py); f32/f64 max
pooling of large NCHW tensors through eager's channels-last kernel (pooling.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchloom.api import (FORMS, GATHER_OPS, ArtifactStore, Capabilities, Graph, Kernel,
                           KernelSource, Node, Reason, TensorType, Written, default_cache_dir,
                           indexing, rejected_by_eager, symbols)

from torchloom_codegen_cpu import attention, depthwise, memory, ops, pooling, random_stream
from torchloom_codegen_cpu.deferred import Building, Deferred, Offered
from torchloom_codegen_cpu.entry import ENTRY_HEAD, entry_source
from torchloom_codegen_cpu.function import write_function
from torchloom_codegen_cpu.launcher import launcher, size_sources
from torchloom_codegen_cpu.ops import POINTWISE, REDUCTIONS, STORAGE
from torchloom_codegen_cpu.prelude import prelude
from torchloom_codegen_cpu.toolchain import (BuildError, DamageReport, Toolchain, build,
                                             cached_library, compiler_name,
                                             directory_problem, fetch_library,
                                             find_compiler, library_path, probe)

log = logging.getLogger("torchloom.codegen_cpu")

#: TORCHLOOM_CPU_F16's values
F16_CHOICES = ("auto", "compile", "eager")

#: what the writer renders, declared through the codegen contract: every kernel form of the
#: core's schedule (several nests as consecutive loop nests, function.py), symbolic sizes,
#: gathers (an embedding's rows read at their indices, each index checked)
CAPABILITIES = Capabilities(forms=frozenset(FORMS), dtypes=frozenset(STORAGE),
                            ops=frozenset(POINTWISE) | frozenset(REDUCTIONS) | GATHER_OPS,
                            kinds=frozenset(spec.kind for spec in REDUCTIONS.values()),
                            devices=frozenset({"cpu"}), symbolic=True)

#: a library's cache key (``toolchain.library_path``)
_KEY = re.compile(r"[0-9a-f]{32}")


class CpuCodegen:
    """Compiles CPU fusion groups to C (OpenMP threads, SIMD loops) with ``$CC``."""

    name = "cpu"

    @property
    def version(self) -> str:
        """"4" (session 65: rows over several reduced dims read in blocks, their trailing
        dims as one index: kernels cached by "3" are right but scalar there; "3", session
        36: a kernel's metadata says which symbolic rows a max may not find empty; "2",
        session 34: kernels built without contraction, whose sources spell their fused
        multiply-adds: sources cached by "1" assumed gcc's) and the forms of eager's
        GELU this machine's kernels reproduce (``ops.eager_gelu_form``, which differ by
        CPU): a kernel's C source depends on them, so kernels cached on disk or in a shared
        cache are kept apart per form, never loaded on a machine whose eager computes
        another."""
        return "4:" + ",".join(ops.eager_gelu_form(d) for d in ("f32", "bf16", "f16"))

    def __init__(self, *, cache_dir: str | Path | None = None, timeout: float | None = None,
                 artifacts: ArtifactStore | None = None, f16: str | None = None):
        base = cache_dir if cache_dir is not None else default_cache_dir()
        #: when f16 groups compile: "auto", "compile" or "eager" (see the module's doc)
        self.f16 = f16 if f16 is not None else (
            os.environ.get("TORCHLOOM_CPU_F16", "").strip() or "auto")
        if self.f16 not in F16_CHOICES:
            raise ValueError(f"f16 (TORCHLOOM_CPU_F16) is {self.f16!r}; choose one of "
                             f"{', '.join(F16_CHOICES)}")
        memory.setting()  # TORCHLOOM_CPU_MALLOC checked before any kernel (memory.py)
        #: where libraries are kept across processes (see ``directory`` for where they are)
        self.cache_dir = Path(base) / "cpu"
        self._directory: Path | None = None  # cache_dir, or a temporary one (``directory``)
        self._damaged = DamageReport()  # damaged libraries, each reported once
        self.timeout = timeout if timeout is not None else float(
            os.environ.get("TORCHLOOM_CC_TIMEOUT", "120"))
        #: the fleet's libraries (None: every library is built or found here)
        self.artifacts = artifacts
        self._toolchain: Toolchain | None = None
        #: kernel name -> the library ``prepare`` builds it into
        self._prepared: dict[str, Building] = {}
        #: keys of the graph libraries whose build failed (each logged once)
        self._failed: set[str] = set()
        #: the C function ``supports`` wrote for a group, for its ``generate``
        self._written = Written()
        #: eager's dropout from the same random stream (``library_call``)
        self._dropout = random_stream.Dropout(lambda: self._build(random_stream.source()))
        #: causal attention by blocks (``library_call``)
        self._attention = attention.Attention(
            lambda direction: self._build(attention.source(direction)))
        #: depthwise convolutions by loops over the channels (``library_call``)
        self._depthwise = depthwise.Depthwise(lambda: self._build(depthwise.source()))

    # ---- protocol --------------------------------------------------------------------------
    def with_artifacts(self, store: ArtifactStore) -> CpuCodegen:
        """A copy that reads the libraries (and the toolchain probe) it needs from
        ``store`` before running the compiler, and shares what it builds there."""
        return CpuCodegen(cache_dir=self.cache_dir.parent, timeout=self.timeout,
                          artifacts=store, f16=self.f16)

    def takes_device(self, device: str) -> bool:
        """Whether groups on ``device`` come here: the CPU's (its capabilities' devices)."""
        return CAPABILITIES.takes_device(device)

    def available(self, group: Node) -> Reason | None:
        """What this machine lacks for the group: a C compiler, and for f16 values one
        whose f16 conversions vectorize (see the module's doc; writes nothing)."""
        cc = find_compiler()
        if cc is None:
            return Reason(self.name, f"no C compiler: {compiler_name()!r} is not on PATH (set "
                                     f"CC to gcc or clang)")
        if self.f16 != "compile" and _has_f16(group) and (
                self.f16 == "eager" or not native_f16(cc)):
            why = ("TORCHLOOM_CPU_F16=eager" if self.f16 == "eager" else
                   f"{os.path.basename(os.path.realpath(cc))} does not vectorize f16 "
                   f"conversions, and its kernels would be slower than eager (CC=clang "
                   f"compiles them; TORCHLOOM_CPU_F16=compile does anyway)")
            return Reason(self.name, f"f16 values run on eager: {why}")
        return None

    def supports(self, group: Node, registry: Any) -> Reason | None:
        declined = rejected_by_eager(self.name, group, registry) or CAPABILITIES.reason(
            self.name, group)  # (eager raises there: so must the compiled graph)
        if declined is not None:
            return declined
        try:
            size_sources(self._write(group, registry)[1])
        except (indexing.Unsupported, symbols.SymbolicDimError) as exc:
            return Reason(self.name, str(exc))
        return self.available(group)

    def library_call(self, node: Node, registry: Any) -> Callable | None:
        """The function the plan calls for ``node`` (an op outside any group) in place of
        its op: eager's ``native_dropout`` on f32/f64/bf16 CPU values from the same random
        stream (random_stream.py; also as activation checkpointing runs it, saving and
        replaying the generator's state), causal f32 flash attention and its backward by blocks
        (attention.py, the direction's library built on a thread from this offer on,
        beside the graph's: ``prepare`` offers ahead), the backward of f32 depthwise
        convolutions (depthwise.py, built the same way), large f32/f64
        NCHW max pooling through channels-last (pooling.py); the dropout
        library is built at its first call. None for other nodes."""
        del registry
        dropout = random_stream.form(node)
        if dropout is not None:
            return self._dropout_call(*dropout)
        if pooling.offered(node):
            return pooling.max_pool
        if depthwise.offered(node) and find_compiler() is not None:
            if self._probed():
                self._depthwise.build_ahead()
            return Offered(self._depthwise.backward, self._depthwise.ready)
        if node.op not in (attention.FORWARD, attention.BACKWARD) or \
                not node.inputs or find_compiler() is None:
            return None
        t = node.inputs[0].type
        if not isinstance(t, TensorType) or t.device != "cpu":
            return None
        masked = len(node.inputs) == (4 if node.op == attention.FORWARD else 7)
        if node.op in (attention.FORWARD, attention.BACKWARD) and t.dtype == "f32" and \
                (node.attrs.get("is_causal") is True or masked) and \
                not node.attrs.get("dropout_p"):
            direction = "forward" if node.op == attention.FORWARD else "backward"
            if self._probed():
                self._attention.build_ahead(direction)
            return Offered(getattr(self._attention, direction),
                           lambda: self._attention.ready(direction))
        return None

    def _dropout_call(self, name: str, value, dtypes) -> Callable | None:
        """The dropout library's method ``name`` (random_stream.form) for a draw for
        ``value``: for CPU values of ``dtypes``, where a C compiler is found."""
        t = value.type
        if not isinstance(t, TensorType) or t.device != "cpu" or t.dtype not in dtypes or \
                find_compiler() is None:
            return None
        if self._probed():
            self._dropout.build_ahead()
        if name == "__call__":
            return self._dropout
        return Offered(getattr(self._dropout, name), self._dropout.ready)

    def _probed(self) -> bool:
        """The toolchain probed and the directory chosen (on this thread, once), before a
        library starts building on another: False where a probe fails (the build is then
        left to the first call, which reports it)."""
        try:
            self.toolchain()
            self.directory()
        except (RuntimeError, OSError):
            return False
        return True

    def anticipate(self, graph: Graph, registry: Any) -> None:
        """Before the passes, for a graph holding attention, depthwise convolution or
        dropout nodes: probe the
        compiler (on this thread) and start building the libraries those nodes will be
        offered (``library_call``), and where a causal attention's logsumexp is an output
        of the graph (a training forward saves it for the backward), the backward's
        attention library, after the forward's. Other graphs start nothing here."""
        for node in self._library_nodes(graph.root):
            if self.library_call(node, registry) is not None and \
                    node.op == attention.FORWARD and len(node.outputs) > 1 and \
                    any(v is node.outputs[1] for v in node.graph.outputs):
                self._attention.build_ahead("backward", after="forward")

    def _offer_ahead(self, groups: list[Node], registry: Any) -> None:
        """Offer a call for every attention and dropout node of the graphs holding
        ``groups`` (and of their shared subgraphs), so that their libraries build beside
        the groups' own (``prepare`` runs before the plan asks for those calls)."""
        roots = {id(g.graph.root): g.graph.root for g in groups if g.graph is not None}
        for root in roots.values():
            for node in self._library_nodes(root):
                self.library_call(node, registry)

    @staticmethod
    def _library_nodes(root: Graph) -> list[Node]:
        """The attention, depthwise convolution and dropout nodes of ``root`` and of its
        shared subgraphs."""
        return [node for graph in (root, *root.subgraphs.values()) for node in graph.nodes
                if node.op in (attention.FORWARD, attention.BACKWARD, random_stream.OP,
                               *depthwise.OPS)]

    def _write(self, group: Node, registry: Any) -> tuple[str, dict[str, Any]]:
        return self._written.get(group, registry, lambda: write_function(group, registry))

    def generate(self, group: Node, registry: Any) -> KernelSource:
        function, metadata = self._write(group, registry)
        metadata = dict(metadata)
        built = self._prepared.get(metadata["kernel"])
        if built is not None:  # a warm start loads the kernel from that library
            metadata["library"] = {"key": built.key, "toolchain": self._toolchain_id()}
        source = prelude() + "\n" + function
        return KernelSource(self.name, source, metadata)

    def prepare(self, groups: list[Node], registry: Any) -> None:
        """Start building every group of a graph into one library (one compiler call, on
        a thread) and return; ``load`` then finds each kernel there, handing back a
        :class:`~torchloom_codegen_cpu.deferred.Deferred` while the build runs. If the
        combined build fails, each group builds alone, so a compiler error costs only its
        group."""
        kernels = [self.generate(g, registry) for g in groups]
        names = [k.metadata["kernel"] for k in kernels]
        if not names:
            return
        self._offer_ahead(groups, registry)
        source = self.translation_unit(kernels)
        toolchain, directory = self.toolchain(), self.directory()  # (probed here, once)
        building = Building(library_path(directory, source, toolchain).stem)
        building.start(lambda: self._build(source))
        for name in names:
            self._prepared[name] = building

    def load(self, kernel: KernelSource, registry: Any) -> Kernel:
        memory.keep_freed_memory()  # (its outputs come from the heap: memory.py)
        building = self._prepared.get(kernel.metadata["kernel"])
        if building is not None:
            if not building.done():
                return Deferred(lambda: self._load_prepared(kernel, registry, building),
                                building.done, kernel.metadata)
            return self._load_prepared(kernel, registry, building)
        return self._from_library(self._built(kernel.metadata), kernel, registry)

    def _load_prepared(self, kernel: KernelSource, registry: Any,
                       building: Building) -> Kernel:
        """``kernel`` from the graph's library ``prepare`` started (waiting for it); built
        alone where that build failed (logged once per library) or lacks it."""
        try:
            path = building.wait()
        except Exception as exc:  # (a compiler error, a full disk): each builds alone
            if building.key not in self._failed:
                self._failed.add(building.key)
                log.warning("torchloom: cpu codegen: the graph's library %s did not build "
                            "(%s); each of its groups builds alone", building.key, exc)
            path = None
        return self._from_library(path, kernel, registry)

    def _from_library(self, path: Path | None, kernel: KernelSource, registry: Any) -> Kernel:
        """``kernel`` from the library at ``path`` where it is there, sound and holds it;
        else built alone."""
        if path is not None and cached_library(path, self._damaged):
            lib = ctypes.CDLL(str(path))
            if hasattr(lib, kernel.metadata["kernel"]):
                return launcher(lib, kernel.metadata)
        return self.load_many([kernel], registry)[0]

    def load_many(self, kernels: list[KernelSource], registry: Any) -> list[Kernel]:
        """Build the kernels into one library (one translation unit, one compiler call)."""
        memory.keep_freed_memory()
        lib = ctypes.CDLL(str(self._build(self.translation_unit(kernels))))
        return [launcher(lib, k.metadata) for k in kernels]

    def _built(self, metadata: dict[str, Any]) -> Path | None:
        """The graph's library an earlier process's ``prepare`` built this kernel into (the
        kernel's stored metadata names it), when this cache holds it (or the fleet's store
        gives it) and it was built by this toolchain for this CPU; else None (then the
        kernel is built alone)."""
        library = metadata.get("library")
        if not isinstance(library, dict) or not _KEY.fullmatch(str(library.get("key"))) or \
                library.get("toolchain") != self._toolchain_id():
            return None
        path = self.directory() / f"{library['key']}.so"
        if not cached_library(path, self._damaged) and (
                self.artifacts is None or not fetch_library(self.artifacts, path, self._damaged)):
            return None
        return path

    def _toolchain_id(self) -> str:
        return hashlib.sha256(self.toolchain().identity().encode()).hexdigest()[:16]

    @staticmethod
    def translation_unit(kernels: list[KernelSource]) -> str:
        """The prelude once, then each distinct kernel function (in name order) followed by
        its Python entry (entry.py)."""
        head = prelude()
        functions: dict[str, str] = {}
        for k in kernels:
            if not k.source.startswith(head):
                raise RuntimeError(f"kernel {k.metadata.get('kernel')} was generated with "
                                   f"another prelude")
            functions.setdefault(k.metadata["kernel"],
                                 k.source[len(head):] + entry_source(k.metadata))
        return ENTRY_HEAD + head + "".join(functions[name] for name in sorted(functions))

    def _build(self, source: str) -> Path:
        toolchain = self.toolchain()
        try:
            return self._in_directory(lambda directory: build(
                source, toolchain, directory, self.timeout, self.artifacts, self._damaged))
        except BuildError as exc:
            raise RuntimeError(str(exc)) from None

    # ---- directory -------------------------------------------------------------------------
    def directory(self) -> Path:
        """Where libraries are built and found: ``cache_dir``, or when it cannot be used a
        temporary directory (see the module's doc), decided on first use."""
        if self._directory is None:
            problem = directory_problem(self.cache_dir)
            self._directory = self.cache_dir if problem is None else self._temporary(problem)
        return self._directory

    def _temporary(self, problem: str) -> Path:
        """A directory for this object's libraries, removed when it is collected or at exit."""
        path = Path(tempfile.mkdtemp(prefix="torchloom-cpu-"))
        weakref.finalize(self, shutil.rmtree, path, ignore_errors=True)
        log.warning("torchloom: cpu codegen: library directory %s is unusable (%s); libraries "
                    "are built in %s for this process (set TORCHLOOM_CACHE_DIR to a writable "
                    "directory to keep them)", self.cache_dir, problem, path)
        return path

    def _in_directory(self, work):
        """``work(directory())``; if the cache directory fails it (the disk turned
        read-only or full), again in a temporary directory, which is used from then on."""
        directory = self.directory()
        try:
            return work(directory)
        except TimeoutError:  # another process holds the build lock: not the directory
            raise
        except OSError as exc:
            if directory != self.cache_dir:
                raise
            self._directory = self._temporary(exc.strerror or str(exc))
            return work(self._directory)

    # ---- toolchain -------------------------------------------------------------------------
    def toolchain(self) -> Toolchain:
        """The compiler and flags, probed once per codegen object."""
        if self._toolchain is None:
            cc = find_compiler()
            if cc is None:
                raise RuntimeError(f"no C compiler: {compiler_name()!r} is not on PATH")
            try:
                self._toolchain = self._in_directory(
                    lambda directory: probe(cc, directory, self.timeout, self.artifacts))
            except BuildError as exc:
                raise RuntimeError(str(exc)) from None
        return self._toolchain


def native_f16(cc: str) -> bool:
    """Whether ``cc`` (a resolved path) converts f16 in vector instructions: clang (its
    ``_Float16``, which the prelude uses; clang < 15 has none on x86 and gets the bit
    arithmetic too), judged by the file the path resolves to (no compiler run)."""
    return "clang" in os.path.basename(os.path.realpath(cc))


def _has_f16(group: Node) -> bool:
    values = [*group.region.inputs, *(v for n in group.region.nodes for v in n.outputs)]
    return any(isinstance(v.type, TensorType) and v.type.dtype == "f16" for v in values)
