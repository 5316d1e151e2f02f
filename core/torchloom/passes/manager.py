"""The pass manager: runs a pipeline, verifies, times, instruments, dumps, rolls back.

When a pass raises, or leaves a graph the verifier rejects, the graph from before that
pass is restored, the error names the pass and its distribution, and a reproducer
directory is written (IR before the pass, the pipeline file, the pass and its options,
versions) that ``torchloom reproduce DIR`` replays to the same error: one per distinct
failure, reused when the same failure happens again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import attrs

from torchloom.errors import NumericError, PassError, PipelineError, PluginError, VerifyError
from torchloom.ir.aliasing import AliasFacts, alias_facts, check_aliasing
from torchloom.ir.graph import Graph
from torchloom.ir.snapshot import GraphSnapshot
from torchloom.ir.textdiff import ir_diff
from torchloom.ir.verify import check_order, verify
from torchloom.passes.base import PassContext, PassResult
from torchloom.passes.pipeline import FixpointStep, PassStep, Pipeline
from torchloom.runtime.records import PassRecord, RunReport


class PassManager:
    """Runs one pipeline over graphs.

    ``dump_dir`` receives ``NN-<pass>.ir`` after each pass; ``repro_dir`` receives a
    reproducer directory per failing pass; ``instruments`` are added to the plugins'.
    ``warned`` is the set of "skipped" messages already logged: a compiler shares one
    across its graphs so that ``on_error = "skip"`` says so once, not once per graph.
    """

    def __init__(self, pipeline: Pipeline, plugins, *, dump_dir: str | Path | None = None,
                 repro_dir: str | Path | None = None, instruments: list[Any] | None = None,
                 warned: set[str] | None = None, numeric_inputs: list[Any] | None = None,
                 typed: dict | None = None):
        self.pipeline = pipeline
        self.plugins = plugins
        self.dump_dir = Path(dump_dir) if dump_dir else None
        self.repro_dir = Path(repro_dir) if repro_dir else None
        #: (instrument, who registered it) for error messages
        self.instruments = ([(r.obj, f"plugin {r.plugin!r} ({r.distribution})")
                             for r in plugins.instruments]
                            + [(ins, "the caller") for ins in instruments or []])
        self.warned = warned if warned is not None else set()
        #: ``verify = "numeric"``: the inputs to compare on (a reproducer's), else seeded
        self.numeric_inputs = numeric_inputs
        #: the nodes of the graph to run on whose types are their ops' own inference
        #: (``ir.verify.agreed_types``: the FX importer's, torch's fake tensors): the checks
        #: after each pass do not infer them again while a pass leaves them as they are;
        #: ``verify = "numeric"`` infers every node anyway
        self.typed = typed or {}
        self._dumped = 0
        #: (file stem, text) of the last IR dumped, the "before" of the next diff
        self._last_dump: tuple[str, str] | None = None

    def run(self, graph: Graph, ctx: PassContext) -> RunReport:
        report = RunReport()
        for name in self.pipeline.missing_optional:
            report.notes.append(f"optional pass {name!r} is not installed; skipped")
        self._dump(graph, "input")
        numeric = None
        if self.pipeline.verify == "numeric":  # nothing of it runs under other policies
            from torchloom.passes.numeric import NumericCheck
            numeric = NumericCheck(graph, ctx.registry, self.numeric_inputs)
            if numeric.skipped:
                report.notes.append(numeric.skipped)
        state = _State(GraphSnapshot(graph), aliases=alias_facts(graph, ctx.registry),
                       each=self.pipeline.verify in ("each", "numeric"), numeric=numeric,
                       typed=dict(self.typed) if numeric is None else {})
        # verify = "end" rolls the whole pipeline back: only then is the first one kept
        start = state.snapshot if self.pipeline.verify == "end" else None
        for step in self.pipeline.steps:
            if isinstance(step, PassStep):
                self._run_step(step, graph, ctx, report, state)
            else:
                self._run_fixpoint(step, graph, ctx, report, state)
        if not state.each:  # "off" too: never a silent new alias
            self._verify_end(graph, ctx, start, state.aliases)
        report.notes.extend(ctx.notes)
        return report

    def _verify_end(self, graph: Graph, ctx: PassContext, start: GraphSnapshot | None,
                    aliases: AliasFacts) -> None:
        """``verify = "end"``: one check after the last pass. It cannot tell which pass
        broke the graph, so the whole pipeline is rolled back and the reproducer replays
        the whole pipeline. ``verify = "off"`` (no ``start`` to restore) still checks the
        aliasing rule, which costs one walk: the compiler then runs the graph eagerly."""
        try:
            if start is not None:
                verify(graph, ctx.registry)
            check_aliasing(graph, ctx.registry, aliases)
        except VerifyError as exc:
            if start is None:
                raise PassError(f"{self.pipeline.source}: the graph after pipeline "
                                f"{self.pipeline.name!r} breaks the aliasing rule: {exc}\n"
                                f"set verify = \"each\" to name the pass", "<pipeline>",
                                None) from exc
            start.restore()
            repro, remark = self._write_reproducer(None, graph, exc, ctx)
            message = (f"{self.pipeline.source}: the graph after pipeline "
                       f"{self.pipeline.name!r} fails verification: {exc}\nverify = \"end\" "
                       f"checks only after the last pass; set verify = \"each\" to name the "
                       f"pass. The graph from before the pipeline was restored.")
            if repro:
                message += _reproducer_line(repro, remark)
            raise PassError(message, "<pipeline>", None, repro) from exc

    def _run_fixpoint(self, step: FixpointStep, graph: Graph, ctx: PassContext,
                      report: RunReport, state: "_State") -> None:
        changes = 0
        clean_at: dict[int, int] = {}  # pass index -> ``changes`` when it last ran
        for _ in range(step.max_iterations):
            changed = []
            for i, s in enumerate(step.passes):
                if s.pass_.idempotent and clean_at.get(i) == changes:
                    continue  # the graph is as its own last run left it
                if self._run_step(s, graph, ctx, report, state):
                    changed.append(s.name)
                    changes += 1
                clean_at[i] = changes
            if not changed:
                return
        message = (f"{step.source or self.pipeline.source}:{step.line}: fixpoint group "
                   f"[{', '.join(s.name for s in step.passes)}] did not converge in "
                   f"{step.max_iterations} iterations (still changing: {', '.join(changed)}); "
                   f"raise max_iterations or fix the pass that keeps changing the graph")
        if self.pipeline.on_error == "raise":
            raise PipelineError(message)
        report.notes.append(message)
        ctx.log.warning("torchloom: %s", message)

    def _run_step(self, step: PassStep, graph: Graph, ctx: PassContext,
                  report: RunReport, state: "_State") -> bool:
        pass_ = step.pass_
        snapshot = state.snapshot  # the graph as the previous pass left it
        self._notify("before_pass", step, state, pass_, graph, ctx)
        t0, cpu0 = time.perf_counter(), time.process_time()
        try:
            subgraphs = list(graph.subgraphs.values())  # those a pass creates are new, not input
            result = _checked(pass_.run(graph, ctx))
            for sub in subgraphs:  # a shared subgraph is transformed once, for all its calls
                result = _merge(result, _run_on_subgraph(step, sub, ctx))
            if state.each:  # the whole graph after the first pass,
                after = GraphSnapshot(graph)  # then only what each pass changed
                if state.verified:
                    changed = after.changed_since(snapshot)
                    verify(graph, ctx.registry, only=changed, unchanged=after.unchanged_regions(
                        snapshot) if changed else None, typed=state.typed)
                else:
                    changed = True
                    verify(graph, ctx.registry, typed=state.typed)
                if changed:  # no new alias of an input or between outputs, no new write
                    check_aliasing(graph, ctx.registry, state.aliases)
                state.mark_verified()
                if state.numeric is not None and changed:  # the pass kept the values?
                    note = state.numeric.check(graph)
                    if note:
                        report.notes.append(note)
            else:  # nothing to compare: one snapshot alive at a time (memory, collector)
                check_order(graph)  # a cycle would hang later passes or the runtime build
                state.forget()
                snapshot = None
                after = GraphSnapshot(graph)
            state.keep(after)
        except Exception as exc:  # the pass's fault: roll back and name it
            seconds = time.perf_counter() - t0
            if snapshot is None:  # the pass had finished: only taking its snapshot failed
                raise
            snapshot.restore()
            if _is_verify(exc) and not state.verified:
                _check_input(graph, ctx, self.pipeline)
            return self._failed(step, graph, exc, seconds, ctx, report)
        except BaseException:  # Ctrl-C mid-pass: leave a whole graph, not half an edit
            if snapshot is not None:  # None: the pass had finished; its graph is whole
                snapshot.restore()
            raise
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        for key, value in result.stats.items():
            ctx.count(f"{step.name}.{key}", value)
        report.records.append(PassRecord(step.name, seconds * 1e3, result.changed,
                                         dict(result.stats), step.distribution,
                                         deduplication=_as_data(result.deduplication),
                                         cpu_ms=cpu * 1e3))
        self._notify("after_pass", step, state, pass_, graph, ctx, result, seconds)
        self._dump(graph, step.name)
        return result.changed

    def _notify(self, method: str, step: PassStep, state: "_State", *args) -> None:
        """Call one method of every instrument; an instrument that raises is named, and
        so is one that changes the graph: instruments observe. The graph is compared with
        the manager's snapshot (taken anyway, it is the graph as the last pass left it)
        after each call, so the check costs nothing without instruments."""
        graph = args[1]
        for ins, origin in self.instruments:
            hook = getattr(ins, method, None)
            if hook is None:
                continue
            try:
                hook(*args)
            except Exception as exc:
                raise PluginError(f"instrument {type(ins).__name__} from {origin} raised in "
                                  f"{method} of pass {step.name!r}: {type(exc).__name__}: "
                                  f"{exc}") from exc
            changed = GraphSnapshot(graph).changed_since(state.snapshot)
            if changed:
                state.snapshot.restore()
                units = ", ".join(sorted(f"@{g.name}" for g in changed))
                raise PluginError(f"instrument {type(ins).__name__} from {origin} changed the "
                                  f"graph ({units}) in {method} of pass {step.name!r}; "
                                  f"instruments observe and must not edit the graph. The "
                                  f"graph from before the call was restored.")

    def _failed(self, step: PassStep, before: Graph, exc: Exception, seconds: float,
                ctx: PassContext, report: RunReport) -> bool:
        kind = ("changed the values the graph computes" if isinstance(exc, NumericError)
                else "left a graph the verifier rejects" if _is_verify(exc) else "raised")
        detail = f"{type(exc).__name__}: {exc}"
        repro, remark = self._write_reproducer(step, before, exc, ctx)
        message = (f"pass {step.name!r} (distribution {step.distribution} {step.version}) "
                   f"{kind}: {detail}\nThe graph from before the pass was restored.")
        if repro:
            message += _reproducer_line(repro, remark)
        if self.pipeline.on_error == "skip":
            note = f"pass {step.name!r} skipped after it failed: {detail.splitlines()[0]}"
            if note not in report.notes:
                report.notes.append(note)
            if note not in self.warned:
                self.warned.add(note)
                ctx.log.warning("torchloom: %s", note)
            report.records.append(PassRecord(step.name, seconds * 1e3, False, {},
                                             step.distribution, skipped=detail))
            return False
        raise PassError(message, step.name, step.distribution, repro) from exc

    def _write_reproducer(self, step: PassStep | None, before: Graph, exc: Exception,
                          ctx: PassContext) -> tuple[str | None, str]:
        """The reproducer's directory (None when none was written) and a remark for the
        message. When ``repro_dir`` cannot be written (a read-only cache, a file in its
        place), the reproducer goes to the system's temporary directory, and the remark
        says so: the pass's error is reported either way."""
        if self.repro_dir is None:
            return None, ""
        try:
            return self._write_reproducer_in(self.repro_dir, step, before, exc, ctx)
        except OSError as problem:
            why = f"{self.repro_dir} cannot be written ({problem.strerror or problem}), so "
        elsewhere = Path(tempfile.gettempdir()) / "torchloom-reproducers"
        try:
            repro, remark = self._write_reproducer_in(elsewhere, step, before, exc, ctx)
        except OSError:
            return None, ""
        return repro, f"{why}it went to the temporary directory; {remark}"

    def _write_reproducer_in(self, root: Path, step: PassStep | None, before: Graph,
                             exc: Exception, ctx: PassContext) -> tuple[str, str]:
        """IR before the pass (or the pipeline, when ``step`` is None), the pipeline
        file, the pass with its options, and versions, under ``root``; and a remark when
        an earlier identical failure had written it already.

        One directory per failure, named by the failure's hash (the IR before the pass,
        the pipeline, the pass with its options and version, the device, the error's type
        and message): the same failure in every process start reuses it. It is written
        under a temporary name and renamed, so it is never seen half written."""
        label = step.name if step is not None else "pipeline"
        before_ir = str(before)
        d = root / f"{label}-{self._failure_hash(step, before_ir, exc, ctx)}"
        if (d / "pass.json").exists():
            return str(d), _EARLIER
        root.mkdir(parents=True, exist_ok=True)
        # written as ``d`` (a fresh temporary directory), then renamed to ``final``
        final, d = d, Path(tempfile.mkdtemp(prefix=f".{label}-", dir=root))
        (d / "before.ir").write_text(before_ir)
        (d / "pipeline.toml").write_text(self.pipeline.text)
        (d / "pass.json").write_text(json.dumps({
            "pass": step.name if step is not None else None,
            "options": _jsonable(step.pass_.options()) if step is not None else {},
            "distribution": step.distribution if step is not None else None,
            "version": step.version if step is not None else None,
            "pipeline": self.pipeline.source,
            "verify": self.pipeline.verify, "device": ctx.device,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(exc)),
        }, indent=2))
        (d / "versions.json").write_text(json.dumps(self.plugins.versions(), indent=2))
        if isinstance(exc, NumericError) and exc.inputs:  # the inputs that showed it
            from torchloom.passes.numeric import write_inputs
            write_inputs(d, exc.inputs)
        try:
            os.rename(d, final)
        except OSError:  # another process wrote the same failure first
            shutil.rmtree(d, ignore_errors=True)
            if not (final / "pass.json").exists():
                raise
            return str(final), _EARLIER
        return str(final), ""

    def _failure_hash(self, step: PassStep | None, before_ir: str, exc: Exception,
                      ctx: PassContext) -> str:
        what = ([step.name, step.distribution, step.version, _jsonable(step.pass_.options())]
                if step is not None else None)
        blob = json.dumps([before_ir, self.pipeline.text, what, ctx.device,
                           type(exc).__name__, str(exc)], sort_keys=True, default=repr)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _dump(self, graph: Graph, label: str) -> None:
        if self.dump_dir is None:
            return
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        stem, text = f"{self._dumped:02d}-{label}", str(graph)
        (self.dump_dir / f"{stem}.ir").write_text(text)
        if self._last_dump is not None:  # what the pass changed (empty: nothing)
            before_stem, before = self._last_dump
            (self.dump_dir / f"{stem}.diff").write_text(
                ir_diff(before, text, f"{before_stem}.ir", f"{stem}.ir"))
        self._last_dump = (stem, text)
        self._dumped += 1


@attrs.define
class _State:
    """The pass manager's rolling snapshot: the graph after the last pass that kept its
    changes, taken once per pass (it is also how the next pass is rolled back)."""

    snapshot: GraphSnapshot | None
    #: whether the whole graph has been verified (once, after the first pass)
    verified: bool = False
    #: what the graph the pipeline received aliases and writes (passes may not add to it)
    aliases: AliasFacts = attrs.field(factory=AliasFacts)
    #: node -> op, attributes and types when type inference last agreed with them
    #: (``verify(typed=...)``: an unchanged node is not inferred again)
    typed: dict = attrs.field(factory=dict)
    #: verify = "each" or "numeric": the verifier runs after every pass
    each: bool = True
    #: verify = "numeric": what the graph computes as the last pass left it
    numeric: Any = None

    def mark_verified(self) -> None:
        self.verified = True

    def forget(self) -> None:
        """Drop the snapshot (one alive at a time: memory, the collector)."""
        self.snapshot = None

    def keep(self, after: GraphSnapshot) -> None:
        """The graph as the last pass left it: the next pass's rollback."""
        self.snapshot = after


_EARLIER = "written by an earlier identical failure; "


def _reproducer_line(repro: str, remark: str) -> str:
    return f"\nReproducer: {repro} ({remark}replay with: torchloom reproduce {repro})"


def _check_input(graph: Graph, ctx: PassContext, pipeline: Pipeline) -> None:
    """After the first check failed and the pass was rolled back: blame the input, not
    the pass, when the graph was already invalid before it."""
    try:
        verify(graph, ctx.registry)
    except VerifyError as exc:
        raise VerifyError(f"the graph given to pipeline {pipeline.name!r} ({pipeline.source}) "
                          f"fails verification before any pass ran: {exc}") from exc


def _run_on_subgraph(step: PassStep, sub: Graph, ctx: PassContext) -> PassResult:
    """Run a pass on one shared subgraph. Its calls must still match it afterwards, so a
    pass that changes its signature fails (and the manager rolls the pass back)."""
    before = _signature(sub)
    result = _checked(step.pass_.run(sub, ctx))
    if _signature(sub) != before:
        raise VerifyError(f"pass {step.name!r} changed the signature (input or output types) "
                          f"of shared subgraph @{sub.name}; its calls no longer match it")
    return result


def _checked(result: Any) -> PassResult:
    if not isinstance(result, PassResult):
        raise TypeError(f"run() returned {type(result).__name__}, not PassResult")
    return result


def _as_data(deduplication) -> dict[str, int] | None:
    return attrs.asdict(deduplication) if deduplication is not None else None


def _merge(a: PassResult, b: PassResult) -> PassResult:
    stats = dict(a.stats)
    for k, v in b.stats.items():
        stats[k] = stats.get(k, 0) + v
    dedup = [d for d in (a.deduplication, b.deduplication) if d is not None]
    return PassResult(a.changed or b.changed, stats, sum(dedup[1:], dedup[0]) if dedup else None)


def _signature(graph: Graph) -> tuple:
    """Input and output types (shape, dtype, device) of a subgraph, as its calls see them."""
    def key(t):
        return (getattr(t, "shape", None), getattr(t, "dtype", None), getattr(t, "device", t))
    return (tuple(key(v.type) for v in graph.inputs), tuple(key(v.type) for v in graph.outputs))


def _is_verify(exc: Exception) -> bool:
    return isinstance(exc, VerifyError)


def _jsonable(options: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in options.items():
        try:
            json.dumps(v)
            out[k] = v
        except TypeError:
            out[k] = repr(v)
    return out

