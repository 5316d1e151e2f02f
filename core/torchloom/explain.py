"""``torchloom explain``: compile a workload, run it once, compare with eager, report.

A workload file defines ``workload()`` (optionally taking ``device``) returning
``(callable, example_inputs)``. When an input requires grad, the backward pass runs too
(the sum of the outputs is differentiated) and gradients are compared.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import re
import sys
from pathlib import Path
from typing import Any

import attrs
import torch

from torchloom.diagnose import check_output_dir, compiled_failure, torchloom_cause
from torchloom.errors import WorkloadError


@attrs.define
class ExplainResult:
    data: dict[str, Any]
    compiler: Any


def import_workload(path: str | Path):
    """Import a workload file as a module. As for a script run with ``python file.py``,
    its own folder is searched first while it is imported, so it can import the modules
    beside it (``from lstm_cell import lstm_cell``)."""
    path = Path(path)
    if not path.exists():
        raise WorkloadError(f"{path}: workload file does not exist")
    if path.is_dir():
        raise WorkloadError(f"{path} is a directory; give a Python file defining workload() "
                            f"(such as examples/gelu_bookend.py)")
    spec = importlib.util.spec_from_file_location(f"torchloom_workload_{path.stem}", path)
    if spec is None:
        raise WorkloadError(f"{path}: a workload must be a Python file ending in .py")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    # registered as any imported module is: Dynamo finds a traced function's globals
    # through sys.modules[fn.__module__] (a workload's helper called from a model failed
    # with ModuleNotFoundError)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(spec.name, None)
        raise WorkloadError(f"{path}: importing the workload failed: "
                            f"{type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(folder)
    return module


def load_workload(path: str | Path, device: str = "cpu"):
    """Import a workload file and call its ``workload()``."""
    path = Path(path)
    module = import_workload(path)
    fn = getattr(module, "workload", None)
    if fn is None:
        raise WorkloadError(f"{path} defines no workload() function; it must return "
                            f"(callable, example_inputs)")
    try:
        params = inspect.signature(fn).parameters
        result = fn(device=device) if "device" in params else fn()
    except Exception as exc:
        raise WorkloadError(f"{path}: workload() failed: {type(exc).__name__}: {exc}") from exc
    problem = _not_a_workload(result)
    if problem:
        raise WorkloadError(f"{path}: workload() must return a pair (callable, "
                            f"example_inputs), such as `return model, [torch.randn(8, 16)]`, "
                            f"but {problem}")
    model, inputs = result
    return model, list(inputs)


def _not_a_workload(result) -> str | None:
    """What is wrong with what ``workload()`` returned, or None for a good pair."""
    if not isinstance(result, (tuple, list)):
        return f"it returned {_describe(result)}"
    if len(result) != 2:
        return f"it returned a {type(result).__name__} of {len(result)} items"
    model, inputs = result
    if not callable(model):
        return f"its first item is {_describe(model)}, which is not callable"
    if isinstance(inputs, (str, bytes, dict, torch.Tensor)) or not hasattr(inputs, "__iter__"):
        return (f"its second item is {_describe(inputs)}, not a list or tuple of inputs "
                f"(one tensor: [x])")
    return None


def _describe(value) -> str:
    """``None``, ``a function gelu``, ``a Tensor of shape [4, 8]``, ``an int``..."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a Tensor of shape {list(value.shape)}"
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    label = getattr(value, "__name__", None)
    return f"{article} {name}" + (f" {label}" if isinstance(label, str) else "")


def run_eagerly(workload, thunk):
    """Run the workload's callable eagerly; its failure is the workload's (a user error)."""
    try:
        return thunk()
    except Exception as exc:
        raise WorkloadError(f"{workload}: running the workload eagerly failed: "
                            f"{type(exc).__name__}: {exc}") from exc


def _flatten(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _flatten(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _flatten(item)]
    return []


def _run(fn, inputs, backward: bool):
    """``fn``'s outputs, and with ``backward`` the gradients of their sum."""
    args = [t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor)
            else t for t in inputs]
    out = fn(*args)
    results = [t.detach() for t in _flatten(out)]
    if backward:
        total = sum(t.float().sum() for t in _flatten(out) if t.requires_grad)
        if isinstance(total, torch.Tensor):
            total.backward()
        results += [a.grad for a in args if isinstance(a, torch.Tensor) and a.grad is not None]
        if isinstance(fn, torch.nn.Module):
            results += [p.grad.clone() for p in fn.parameters() if p.grad is not None]
            fn.zero_grad(set_to_none=True)
    return results


def needs_backward(model, inputs) -> bool:
    """Whether running ``model`` builds a backward graph: an input or parameter needs a
    gradient, also where ``model`` is a function closing over a model's parameters (it is
    run once, eagerly, and its outputs asked whether they need gradients)."""
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
        return True
    if isinstance(model, torch.nn.Module):
        return any(p.requires_grad for p in model.parameters())
    if not torch.is_grad_enabled():
        return False
    args = [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    return any(t.requires_grad for t in _flatten(model(*args)))


def max_abs_error(expected: list[torch.Tensor], actual: list[torch.Tensor]) -> float:
    if len(expected) != len(actual):
        return math.inf
    err = 0.0
    for e, a in zip(expected, actual):
        if e.shape != a.shape:
            return math.inf
        if e.numel() == 0:
            continue
        diff = (e.double() - a.double()).abs()
        both_nan = torch.isnan(e.double()) & torch.isnan(a.double())
        same_inf = (e.double() == a.double())
        diff = torch.where(both_nan | same_inf, torch.zeros_like(diff), diff)
        if torch.isnan(diff).any():  # NaN on one side only: not comparable
            return math.inf
        err = max(err, float(diff.max()))
    return err


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
        status = (f"max abs error {error:.3g} ("
                  f"{'matches eager' if error <= 1e-4 else 'DIFFERS from eager'})")
    dedup = d.get("dedup", {})
    if dedup.get("regions") or dedup.get("fusion_groups", 0) > dedup.get("unique_kernels", 0):
        lines.append(f"dedup: {dedup['fusion_groups']} fusion groups share "
                     f"{dedup['unique_kernels']} kernels; {dedup['regions']} shared regions "
                     f"replace {dedup['occurrences_replaced']} occurrences; about "
                     f"{dedup['compile_ms_saved_estimate']:.0f} ms of compile time saved")
    lines.append(f"total: {d['fusion_groups']} fusion groups, {d['kernels']} kernels per call, "
                 f"{d['unique_kernels']} unique kernels; {status}")
    return "\n".join(lines)
