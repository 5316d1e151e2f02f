"""The compiler: pipeline + plugins + pass manager + codegens + runtime, in one object.

``Compiler(pipeline).compile_fx(gm, example_inputs)`` is what the torch.compile backend
and ``torchloom explain`` call for every aten graph.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import attrs

from torchloom.compiler.ahead import backward_policy
from torchloom.compiler.log import cache_counters, log_compilation, log_fallback
from torchloom.codegen.base import KernelSource
from torchloom.codegen.gemm import GemmBlocks
from torchloom.compiler.mode import apply_mode, check_mode, mode_codegens
from torchloom.environment import default_cache_dir, env_flag
from torchloom.errors import PassError, PipelineError, PluginError, UnsupportedError
from torchloom.frontend.fx import ImportedGraph, import_fx
from torchloom.ir.graph import Graph
from torchloom.passes.base import PassContext
from torchloom.passes.manager import PassManager, RunReport
from torchloom.passes.pipeline import VERIFY_POLICIES
from torchloom.plugins.pipelines import load_pipeline
from torchloom.runtime.cache import KernelCache, directory_problem
from torchloom.runtime.executor import CompiledGraph, anticipate_codegens
from torchloom.runtime.graph_cache import GraphCache
from torchloom.runtime.remote_cache import (ENV_URL, RemoteCache, RemoteConfigError,
                                            offer_artifacts, remote_cache_from)
from torchloom.runtime.static import StaticPlan, retarget, target_codegens
from torchloom.runtime.tiered import first_calls_policy

log = logging.getLogger("torchloom")


@attrs.define
class Compilation:
    """One compiled graph and everything ``explain`` reports about it."""

    name: str
    nodes_before: int
    graph: Graph | None = None  # after the pipeline (None when it fell back to eager)
    compiled: CompiledGraph | None = None
    fn: Callable | None = None
    report: RunReport | None = None
    fallback_reason: str | None = None
    compile_seconds: float = 0.0
    before_ir: str | None = None  # IR text before the pipeline, when the compiler keeps it
    notes: list[str] = attrs.field(factory=list)
    #: the graph after the pipeline came from the compile cache: no pass ran
    cached: bool = False
    #: with a ``target``: the kernels generated (and compiled ahead) for it; nothing runs
    static: StaticPlan | None = None
    #: compiled with ``boxed``: aot_autograd's boxed callable (``fn(args: list)``)
    boxed_fn: Callable | None = None


class Compiler:
    """Compiles aten FX graphs (or IR graphs) with one pipeline and one plugin set."""

    def __init__(self, pipeline: str | Path | dict = "default", *, plugins=None,
                 dump_dir: str | Path | None = None, cache_dir: str | Path | None = None,
                 device: str = "cpu", keep_ir: bool = False, strict: bool = False,
                 compile_cache: bool | None = None, target: str | None = None,
                 instruments: Sequence[Any] = (), mode: str | None = None,
                 remote_cache: str | bool | None = None, verify: str | None = None):
        """``compile_cache``: keep graphs after the pipeline on disk under ``cache_dir``
        and reuse them (see :mod:`torchloom.runtime.graph_cache`). Default: on, unless
        ``TORCHLOOM_COMPILE_CACHE=0`` or the compiler dumps or keeps IR (``explain``
        shows the passes running). ``target`` (such as ``"sm_90"``): compile for a device
        that is not on this machine: graphs are moved to ``device``, every group's kernel
        is generated and compiled ahead of time for the target, and the callable handed
        back runs the original graph (no kernel runs). ``instruments`` observe every pass
        of every graph, besides the plugins' (``explain --html`` keeps IR diffs so).
        ``mode``: torch.compile's (see :mod:`torchloom.compiler.mode`). ``pipeline`` may be
        a built-in name, a file, or a dict of a pipeline file's tables.
        ``remote_cache``: the shared cache's URL (``redis://HOST:PORT/DB``; default
        ``TORCHLOOM_REMOTE_CACHE``, then the pipeline's ``[runtime] remote_cache``;
        False: none), see :mod:`torchloom.runtime.remote_cache`. ``verify`` overrides the
        pipeline's policy (``"numeric"``: every pass is also checked by values; then the
        compile cache is off by default, so the passes run)."""
        self.mode = check_mode(mode)
        loaded = load_pipeline(pipeline, plugins)
        self.plugins = loaded.plugins
        for problem in [*self.plugins.errors, *self.plugins.warnings]:
            log.warning("torchloom: %s", problem)
        self.pipeline, mode_notes = apply_mode(_with_verify(loaded.pipeline, verify),
                                               self.plugins, self.mode)
        #: the runtime wrappers the mode turned on (not the pipeline): see :meth:`_wrappers`
        self.mode_wrappers = frozenset(self.pipeline.runtime) - frozenset(loaded.pipeline.runtime)
        self.dump_dir = Path(dump_dir) if dump_dir else None
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.device = device
        self.keep_ir = keep_ir
        self.target = target
        self.instruments = list(instruments)
        #: target mode: kernel source -> registers and spills (equal kernels compile once)
        self.target_memo: dict[str, dict] = {}
        #: strict: a failing pass or pipeline raises instead of running the graph eagerly
        self.strict = strict
        #: "pass skipped" messages already logged, so on_error = "skip" says so once
        self.warned: set[str] = set()
        fingerprint = self.pipeline.fingerprint()  # hashes every pass's source: once
        disk = _usable_cache_dir(self.cache_dir)
        self.remote_cache, remote_note = _remote_cache(remote_cache, self.pipeline)
        #: codegen name -> its copy sharing built artifacts through the remote cache
        self.sharing_codegens: dict[str, Any] = {}
        self.kernel_cache = KernelCache(disk and disk / "kernels", fingerprint,
                                        remote=self.remote_cache)
        if compile_cache is None:
            compile_cache = (env_flag("TORCHLOOM_COMPILE_CACHE", True)
                             and dump_dir is None and not keep_ir and target is None
                             and self.pipeline.verify != "numeric")
        self.graph_cache = GraphCache(disk and disk / "graphs", {
            "pipeline": fingerprint, "device": device, "codegen": self.device_codegen,
            "versions": self.plugins.versions()},
            remote=self.remote_cache) if compile_cache else None
        #: which matrix products run in blocks (tried in their first calls once per shape
        #: on this machine, kept in the cache directory; ``TORCHLOOM_GEMM_BLOCKS=0``: none)
        self.gemms = GemmBlocks(enabled=env_flag("TORCHLOOM_GEMM_BLOCKS", True),
                                path=disk and disk / "gemm-blocks.json")
        #: what groups whose kernels still build run meanwhile (runtime/tiered.py)
        self.first_calls = first_calls_policy(self.pipeline.first_calls)
        #: when a training graph's backward compiles ("ahead" or "lazy": compiler/ahead.py)
        self.backward = backward_policy(self.pipeline.backward)
        self.compilations: list[Compilation] = []
        self.notes: list[str] = list(mode_notes) + ([remote_note] if remote_note else [])
        for name in self.pipeline.codegens or (self.pipeline.codegen,):
            if name not in self.plugins.codegens:
                self.notes.append(f"codegen {name!r} {self.plugins.why_missing(name)}; the "
                                  f"groups it would compile run on the next codegen or 'eager'")

    @property
    def registry(self):
        return self.plugins.registry

    @functools.cached_property
    def foreach_decompositions(self) -> dict:
        """The ``_foreach_*`` ops as one op per tensor
        (:func:`torchloom.frontend.foreach.foreach_decompositions`, a walk over every torch
        schema, ~10 ms), made once per compiler: each frame ``torch.compile`` hands the
        backend passes it to aot_autograd."""
        from torchloom.frontend.foreach import foreach_decompositions
        return foreach_decompositions()

    def kernel_source(self, choice) -> KernelSource:
        """The source of the kernel a group compiled to (a ``GroupChoice``): what the
        kernel cache stored when it generated or read the kernel, never generated again."""
        cg = self.plugins.codegen(choice.codegen)
        stored = self.kernel_cache.source(cg, choice.node)
        return stored if stored is not None else cg.generate(choice.node, self.registry)

    def context(self) -> PassContext:
        return PassContext(registry=self.registry, device=self.device, cache_dir=self.cache_dir,
                           codegen=self.device_codegen)

    @functools.cached_property
    def device_codegen(self) -> str | None:
        """The codegen that compiles groups on ``device`` first: the first of the
        pipeline's codegens (those loaded) whose ``takes_device(device)`` is true; None
        where one before it cannot say (no ``takes_device``)."""
        for codegen in self.plugins.codegen_chain(self.pipeline.codegens or
                                                  self.pipeline.codegen):
            takes = getattr(codegen, "takes_device", None)
            if takes is None:
                return None
            if takes(self.device):
                return codegen.name
        return None

    def compile_graph(self, graph: Graph, fallback: Callable | None = None,
                      constants: list[Any] | tuple = (), *, boxed: bool = False,
                      donated: Sequence[int] = (), typed: dict | None = None) -> Compilation:
        """Run the pipeline on ``graph`` (edited in place) and build its callable
        (``boxed``, ``donated``: see :meth:`compile_fx`; ``typed``: the nodes whose types
        are their ops' own inference, see :class:`PassManager`)."""
        t0 = time.perf_counter()
        counters = cache_counters(self.kernel_cache)  # what this graph adds is logged
        index = len(self.compilations)
        comp = Compilation(graph.name, graph.num_nodes(), graph,
                           before_ir=str(graph) if self.keep_ir else None)
        ctx = self.context()
        dump = self.dump_dir / f"graph{index}" if self.dump_dir else None
        chain = mode_codegens(self.plugins.codegen_chain(
            self.pipeline.codegens or self.pipeline.codegen), self.mode)
        if self.target is None:  # the codegens start what the imported ops need
            chain = offer_artifacts(chain, self.remote_cache, self.sharing_codegens)
            anticipate_codegens(graph, self.registry, chain)
        key = self.graph_cache.key(graph) if self.graph_cache is not None else None
        cached = self.graph_cache.load(key, self.registry) if key is not None else None
        if cached is not None:
            loaded = cached.graph
            loaded.name = comp.name  # messages name this compilation's graph
            graph = comp.graph = loaded
            comp.cached = True
            comp.report = RunReport(cached.report.records, [
                f"loaded from the compile cache ({cached.path}): no pass ran; the pass "
                f"records are those of the compilation that wrote it", *cached.report.notes])
        else:
            manager = PassManager(self.pipeline, self.plugins, dump_dir=dump,
                                  repro_dir=self.cache_dir / "reproducers", warned=self.warned,
                                  instruments=self.instruments, typed=typed)
            comp.report = manager.run(graph, ctx)
            if key is not None:
                self.graph_cache.store(key, graph, comp.report)
        if self.target is not None:
            chain, declined = target_codegens(chain, self.target)
            comp.static = StaticPlan(graph, self.registry, chain, self.target,
                                     self.target_memo, repro_dir=self.cache_dir / "reproducers",
                                     warned=self.warned)
            comp.fn = fallback
            if dump is not None:  # the kernels generated for the target
                dump.mkdir(parents=True, exist_ok=True)
                for i, choice in enumerate(comp.static.choices):
                    source = comp.static.sources[choice.node].source
                    (dump / f"group{i}-{choice.codegen}.txt").write_text(source)
            comp.notes = [f"{r}: its groups are described op by op" for r in declined] + list(
                self.notes) + comp.report.notes + [n for n in ctx.notes
                                                   if n not in comp.report.notes]
            comp.compile_seconds = time.perf_counter() - t0
            comp.boxed_fn = boxed_call(fallback) if boxed else None
            log_compilation(self, comp, counters)
            self.compilations.append(comp)
            return comp
        wrappers = self._wrappers(graph, ctx)
        comp.compiled = CompiledGraph(graph, self.registry, chain, self.kernel_cache, fallback,
                                      user_inputs=len(graph.inputs) - len(constants),
                                      repro_dir=self.cache_dir / "reproducers",
                                      warned=self.warned, boxed=boxed,
                                      # a wrapper (CUDA graphs) may keep inputs as its own
                                      donated=() if wrappers else donated,
                                      gemms=self.gemms, first_calls=self.first_calls)
        fn = comp.compiled.plan.fn
        if constants:
            fn = _bind_constants(fn, tuple(constants))
        for wrapper, options in wrappers:
            fn = wrapper.wrap(fn, options, ctx, comp.compiled)
        comp.fn = fn
        if boxed:  # the plan's own boxed entry frees inputs; wrappers take *args
            comp.boxed_fn = boxed_call(fn) if wrappers else _owning(
                comp.compiled.plan.boxed, tuple(constants))
        comp.notes = list(self.notes) + comp.report.notes + [n for n in ctx.notes
                                                             if n not in comp.report.notes]
        if dump is not None:
            _dump_sources(comp, dump, self)
        comp.compile_seconds = time.perf_counter() - t0
        log_compilation(self, comp, counters)
        self.compilations.append(comp)
        return comp

    def _wrappers(self, graph: Graph, ctx) -> list[tuple[Any, Any]]:
        """The runtime wrappers (and their options) that wrap ``graph``: each of the
        pipeline's, but one whose optional ``declines(graph, options, ctx)`` says why it
        would not (noted, as every note logged at INFO; also a warning where the pipeline
        turned the wrapper on, not where the mode did: ``mode="reduce-overhead"`` on a CPU
        is not the user's error)."""
        out = []
        for name, options in self.pipeline.runtime.items():
            wrapper = self.plugins.wrappers[name].obj
            declines = getattr(wrapper, "declines", None)
            why = declines(graph, options, ctx) if callable(declines) else None
            if why is None:
                out.append((wrapper, options))
                continue
            ctx.note(why)
            if name not in self.mode_wrappers:
                log.warning("torchloom: %s", why)
        return out

    def compile_fx(self, gm, example_inputs, *, boxed: bool = False,
                   donated: Sequence[int] = ()) -> Callable:
        """Compile one aten FX graph; on anything the frontend or a pass cannot handle,
        log a one-line reason and return the graph to run eagerly.

        ``boxed``: return aot_autograd's boxed callable, ``run(args: list)``, which empties
        the list, so the plan frees each input after its last use. ``donated``: input
        indices whose buffers the caller gives up (aot_autograd's ``bw_donated_idxs``):
        kernels may write their outputs into them once they are dead."""
        name = f"graph{len(self.compilations)}"
        try:
            imported: ImportedGraph = import_fx(gm, example_inputs, name,
                                                 registry=self.registry)
        except UnsupportedError as exc:
            return self._eager(gm, name, f"frontend: {exc}", boxed)
        if self.target is not None:  # traced here, compiled for the target's device
            retarget(imported.graph, self.device)
        try:
            comp = self.compile_graph(imported.graph, fallback=gm, constants=imported.constants,
                                      boxed=boxed, donated=donated, typed=imported.typed)
        except (PassError, PipelineError, PluginError) as exc:  # PluginError: an instrument
            if self.strict:
                raise
            return self._eager(gm, name, str(exc), boxed)
        except Exception as exc:  # a bug past the passes (codegen, runtime build): never crash
            if self.strict:
                raise
            return self._eager(gm, name, f"internal error while compiling: "
                                         f"{type(exc).__name__}: {exc}", boxed)
        return comp.boxed_fn if boxed else comp.fn

    def _eager(self, gm, name: str, reason: str, boxed: bool = False) -> Callable:
        # one line: the reason's first, and where its reproducer is (a PassError's line)
        lines = reason.splitlines() or [""]
        summary = " ".join([lines[0], *(ln for ln in lines[1:] if ln.startswith("Reproducer: "))])
        log.warning("torchloom: running %s eagerly: %s", name, summary)
        nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
        log_fallback(name, reason, nodes)
        self.compilations.append(Compilation(name, nodes, fallback_reason=reason, fn=gm))
        return boxed_call(gm) if boxed else gm


def _with_verify(pipeline, verify: str | None):
    """The pipeline with the ``verify`` option's policy, checked."""
    if verify is None or verify == pipeline.verify:
        return pipeline
    if verify not in VERIFY_POLICIES:
        raise PipelineError(f"torch.compile(backend='torchloom'): verify {verify!r} must be "
                            f"one of {', '.join(VERIFY_POLICIES)}")
    return attrs.evolve(pipeline, verify=verify)


def _remote_cache(option: str | bool | None, pipeline) -> tuple[RemoteCache | None, str | None]:
    """The shared cache the option, ``TORCHLOOM_REMOTE_CACHE`` or the pipeline names (in
    that order), and why it is off when it is named but cannot be used."""
    if option is False:
        return None, None
    url = option or os.environ.get(ENV_URL) or pipeline.remote_cache
    try:
        return remote_cache_from(url or None)
    except RemoteConfigError as exc:
        raise PipelineError(str(exc)) from None


def _usable_cache_dir(cache_dir: Path) -> Path | None:
    """``cache_dir``, or None (with one warning) when it cannot hold the caches: they are
    then kept in memory, and compiling goes on as usual."""
    problem = directory_problem(cache_dir)
    if problem is None:
        return cache_dir
    log.warning("torchloom: cache directory %s is unusable (%s); the compile and kernel "
                "caches are kept in memory for this process (set TORCHLOOM_CACHE_DIR to a "
                "writable directory to keep them)", cache_dir, problem)
    return None


def boxed_call(fn: Callable) -> Callable:
    """``fn`` in aot_autograd's boxed calling convention: torch's ``make_boxed_func``
    (imported here: only a boxed compile, under aot_autograd, needs it)."""
    from functorch.compile import make_boxed_func
    return make_boxed_func(fn)


def _owning(boxed: Callable, constants: tuple) -> Callable:
    """The plan's boxed entry (it empties the list, dropping each input after its last
    use), with the compiler's constants appended to the caller's inputs."""
    def run(args: list):
        args.extend(constants)
        return boxed(args)
    run._boxed_call = True
    return run if constants else boxed  # (the plan's boxed entry says it is boxed)


def _bind_constants(fn: Callable, constants: tuple) -> Callable:
    def run(*args):
        return fn(*args, *constants)
    return run


def _dump_sources(comp: Compilation, dump: Path, compiler: Compiler) -> None:
    dump.mkdir(parents=True, exist_ok=True)
    (dump / "runtime.py").write_text(comp.compiled.source)
    for i, choice in enumerate(comp.compiled.choices):
        generated = compiler.kernel_source(choice)
        (dump / f"group{i}-{choice.codegen}.txt").write_text(generated.source)


__all__ = ["Compiler", "Compilation", "PipelineError"]
