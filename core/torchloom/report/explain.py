"""``torchloom explain``: compile a workload, run it once, compare with eager, report.

A workload file defines ``workload()`` (optionally taking ``device``) returning
``(callable, example_inputs)``. When an input requires grad, the backward pass runs too
(the sum of the outputs is differentiated) and gradients are compared.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import attrs
import torch

from torchloom.errors import WorkloadError
from torchloom.report.diagnose import check_output_dir, compiled_failure
from torchloom.workloads import (flatten, load_workload, max_abs_error, max_scaled_error,
                                 needs_backward, run_eagerly)


@attrs.define
class ExplainResult:
    data: dict[str, Any]
    compiler: Any


def _run(fn, inputs, backward: bool):
    """``fn``'s outputs, and with ``backward`` the gradients of their sum."""
    args = [t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor)
            else t for t in inputs]
    out = fn(*args)
    results = [t.detach() for t in flatten(out)]
    if backward:
        total = sum(t.float().sum() for t in flatten(out) if t.requires_grad)
        if isinstance(total, torch.Tensor):
            total.backward()
        results += [a.grad for a in args if isinstance(a, torch.Tensor) and a.grad is not None]
        if isinstance(fn, torch.nn.Module):
            results += [p.grad.clone() for p in fn.parameters() if p.grad is not None]
            fn.zero_grad(set_to_none=True)
    return results


def explain(workload: str | Path, *, pipeline: str = "default", device: str = "cpu",
            dump_dir: str | Path | None = None, keep_ir: bool = False,
            target: str | None = None, cached: bool = False,
            instruments: list | tuple = (), dynamic: bool = False) -> ExplainResult:
    """Every pass runs: the compile cache is neither read nor written, unless ``cached``
    (what a warm start does: graphs compiled before are loaded and run no pass).

    With ``target`` (``sm_<arch>``, a CUDA GPU that need not be here), the workload is
    built on the ``meta`` device (shapes, no data), traced, and every group's kernel is
    generated for CUDA and compiled ahead of time for the target; nothing runs, so
    ``max_abs_error`` is null.

    ``dynamic``: compile as ``torch.compile(..., dynamic=True)`` does, every size symbolic
    (the graphs a model whose batch or sequence length varies gets)."""
    from torchloom.compiler import Compiler
    from torchloom.backend import torchloom_backend
    from torchloom.report import compile_cache_summary, kernel_summary, summarize
    if target is not None:
        if not re.fullmatch(r"sm_\d+", target):
            raise WorkloadError(f"--target {target!r}: expected a CUDA architecture such as "
                                f"sm_90")
        device = "meta"
    if dump_dir is not None:
        check_output_dir(dump_dir, "--dump")
    # strict: a failing pass is an error of explain (exit code 1, with its reproducer),
    # not a silent fallback to eager
    compiler = Compiler(pipeline, dump_dir=dump_dir, device="cuda" if target else device,
                        keep_ir=keep_ir, strict=True, target=target, compile_cache=cached,
                        instruments=instruments)
    model, inputs = load_workload(workload, device)
    backward = needs_backward(model, inputs)
    torch.manual_seed(0)
    expected = None if target else run_eagerly(workload, lambda: _run(model, inputs, backward))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}), dynamic=True if dynamic else None)
    torch.manual_seed(0)
    try:
        actual = _run(compiled, inputs, backward)
        breaks = graph_breaks()  # before reset() forgets them
    except Exception as exc:
        error = compiled_failure(workload, compiler, exc)
        raise error from (exc if error.__cause__ is exc else None)
    finally:
        torch._dynamo.reset()
    data = summarize(compiler.compilations, compiler.registry, compiler.kernel_cache)
    data["compile_cache"] = compile_cache_summary(compiler.graph_cache)
    error = math.inf if expected is None else max_abs_error(expected, actual)
    data["max_abs_error"] = error if math.isfinite(error) else None
    scaled = math.inf if expected is None else max_scaled_error(expected, actual)
    data["max_scaled_error"] = scaled if math.isfinite(scaled) else None
    data["target"] = target
    data.update(kernel_summary(compiler))
    data["graph_breaks"] = breaks
    data["backward"] = backward
    data["workload"] = str(workload)
    data["pipeline"] = compiler.pipeline.name
    data["compile_seconds"] = round(sum(c.compile_seconds for c in compiler.compilations), 4)
    return ExplainResult(data, compiler)


def graph_breaks() -> list[dict[str, Any]]:
    """Where Dynamo split the program since its last reset, and why, each once in the
    order found: ``{"reason": str, "where": "file:line in function" or null, "count": int}``
    (``where`` is the innermost frame of the user's code)."""
    from torch._dynamo.utils import graph_break_reasons
    found: dict[tuple[str, str | None], dict[str, Any]] = {}
    for r in graph_break_reasons:
        frame = r.user_stack[-1] if r.user_stack else None
        where = f"{frame.filename}:{frame.lineno} in {frame.name}" if frame else None
        reason = " ".join(str(r.reason).split())  # one line
        entry = found.setdefault((reason, where), {"reason": reason, "where": where,
                                                   "count": 0})
        entry["count"] += 1
    return list(found.values())


def _node_count_parts(graph) -> str:
    """Why fusing can add nodes: ``" (2 ops outside groups, 1 group node, 1 op inside
    it)"``: a group is a node of its own around the ops it holds, and views stay outside
    groups (they move no data). Empty for a graph without groups."""
    holders = [n for n in graph.nodes if n.region is not None]
    if not holders:
        return ""
    outside = sum(1 for _ in graph.nodes) - len(holders)
    inside = sum(n.region.num_nodes() for n in holders)

    def count(n: int, what: str) -> str:
        return f"{n} {what}{'' if n == 1 else 's'}"
    return (f" ({count(outside, 'op')} outside groups, {count(len(holders), 'group node')}, "
            f"{count(inside, 'op')} inside {'it' if len(holders) == 1 else 'them'})")


def format_explain(result: ExplainResult, show_ir: bool = False) -> str:
    d = result.data
    lines = [f"workload {d['workload']} with pipeline {d['pipeline']!r}"
             f"{' (forward and backward)' if d['backward'] else ''}"]
    breaks = d.get("graph_breaks") or []
    if breaks:
        lines.append(f"  graph breaks (Dynamo split the program {sum(b['count'] for b in breaks)} "
                     f"times, so it compiled {d['graphs']} graphs):")
        lines.extend(f"    at {b['where'] or '?'}: {b['reason']}" for b in breaks)
    shown: set[str] = set()  # a reason (no C compiler, say) is given once, not per group
    for comp in result.compiler.compilations:
        if comp.fallback_reason:
            lines.append(f"  {comp.name}: ran eagerly: {comp.fallback_reason}")
            continue
        from torchloom.report import count_kernels, fusion_groups
        lines.append(f"  {comp.name}: {comp.nodes_before} nodes -> {comp.graph.num_nodes()}"
                     f"{_node_count_parts(comp.graph)}, "
                     f"{len(fusion_groups(comp.graph))} fusion groups, "
                     f"{count_kernels(comp.graph, result.compiler.registry)} kernels per call, "
                     f"compiled in {comp.compile_seconds * 1e3:.1f} ms")
        for rec in comp.report.records:
            stats = ", ".join(f"{k}={v}" for k, v in rec.stats.items() if v)
            flag = ("SKIPPED after an error" if rec.skipped
                    else "changed" if rec.changed else "no change")
            lines.append(f"      {rec.name:<24} {rec.ms:8.2f} ms  {flag}"
                         f"{'  ' + stats if stats else ''}")
        choices = (comp.compiled or comp.static).choices
        if choices:
            on = {}
            for choice in choices:
                on[choice.codegen] = on.get(choice.codegen, 0) + 1
            lines.append("      groups on codegens: " + ", ".join(
                f"{name} {count}" for name, count in sorted(on.items())))
        for choice in choices:
            for reason in choice.fallback_reasons if choice.codegen == "eager" else ():
                if str(reason) not in shown:
                    shown.add(str(reason))
                    lines.append(f"      group runs on eager: {reason}")
        if show_ir:
            lines.append("    before:")
            lines.extend("      " + ln for ln in (comp.before_ir or "").splitlines())
            lines.append("    after:")
            lines.extend("      " + ln for ln in str(comp.graph).splitlines())
    for note in d["notes"]:
        lines.append(f"  note: {note}")
    cache = d.get("compile_cache")
    if cache:
        errors = cache["remote_errors"]
        lines.append(f"  compile cache: {cache['hits']} hits ({cache['remote_hits']} from the "
                     f"shared cache), {cache['misses']} misses"
                     + (f", {errors} shared-cache errors" if errors else ""))
    # one line per kernel where that is the point (--target); the total line always
    for k in d.get("kernel_details", []) if d.get("target") else ():
        regs = "" if k["registers"] is None else (f", {k['registers']} registers, "
                                                 f"{k['spills']} B spilled")
        lines.append(f"  kernel {k['graph']}/{k['name']} ({k['codegen']}): grid {k['grid']}, "
                     f"moves {(k['bytes_read'] + k['bytes_written']) / 1e6:.1f} MB of "
                     f"{k['bytes_compulsory'] / 1e6:.1f} MB compulsory{regs}")
    if d.get("bytes_compulsory"):
        lines.append(f"traffic: {d['bytes_moved'] / 1e6:.1f} MB moved, "
                     f"{d['bytes_compulsory'] / 1e6:.1f} MB compulsory "
                     f"({d['bytes_moved'] / d['bytes_compulsory']:.2f}x)")
    error = d["max_abs_error"]
    if d.get("target"):
        status = f"compiled for {d['target']}, nothing ran"
    elif error is None:
        status = "outputs DIFFER from eager in count, shape or NaN positions"
    else:
        scaled = d.get("max_scaled_error", error)
        status = (f"max abs error {error:.3g}, {scaled:.2g} of the values' scale ("
                  f"{'matches eager' if scaled <= 1e-4 else 'DIFFERS from eager'})")
    dedup = d.get("dedup", {})
    if dedup.get("regions") or dedup.get("fusion_groups", 0) > dedup.get("unique_kernels", 0):
        lines.append(f"dedup: {dedup['fusion_groups']} fusion groups share "
                     f"{dedup['unique_kernels']} kernels; {dedup['regions']} shared regions "
                     f"replace {dedup['occurrences_replaced']} occurrences; about "
                     f"{dedup['compile_ms_saved_estimate']:.0f} ms of compile time saved")
    lines.append(f"total: {d['fusion_groups']} fusion groups, {d['kernels']} kernels per call, "
                 f"{d['unique_kernels']} unique kernels; {status}")
    return "\n".join(lines)
