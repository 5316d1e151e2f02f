"""``torchloom explain WORKLOAD --html OUT.html``: one self-contained page per run.

Per graph: the graph drawn with every op coloured by its fusion group (shared subgraphs
boxed; see :mod:`torchloom.report.html_graph`), each group's kernel (codegen, source, measured
time per call, bytes read, written and compulsory) and the codegens that declined it, the
graph's fallback reason, the pass timeline (ms, changed, stats) and the IR diff of every
pass. The page inlines its data (JSON), style and script (``report/assets/``): it loads
nothing from the network. The script lays the graph out itself (longest-path layers,
barycentre ordering), draws groups collapsed when a graph is large, and finds nodes by
name.
"""

from __future__ import annotations

import html
import json
import re
import time
from importlib import resources
from pathlib import Path
from typing import Any

from torchloom.report.html_graph import GraphView
from torchloom.ir.textdiff import ir_diff
from torchloom.ir.types import TensorType
from torchloom.report import kernel_summary

#: graphs with more drawn nodes than this start with their groups collapsed
COLLAPSE_ABOVE = 400
#: seconds spent timing kernels, over all graphs; kernels past it are not timed
TIMING_BUDGET = 10.0


class PassIRRecorder:
    """An instrument (see ``torchloom_instruments``) that keeps, per graph, the unified
    diff of the IR each pass made, in the order the passes ran."""

    def __init__(self):
        self.diffs: dict[str, list[tuple[str, str]]] = {}
        self._last: dict[str, str] = {}

    def before_pass(self, pass_, graph, ctx) -> None:
        if graph.name not in self._last:
            self._last[graph.name] = str(graph)

    def after_pass(self, pass_, graph, ctx, result, seconds) -> None:
        before = self._last.get(graph.name, "")
        after = str(graph) if result.changed else before
        self.diffs.setdefault(graph.name, []).append(
            (pass_.name, ir_diff(before, after, f"before {pass_.name}", f"after {pass_.name}")))
        self._last[graph.name] = after


def write_html(result, path: str | Path, recorder: PassIRRecorder | None = None,
               graph_breaks: list[dict[str, Any]] | None = None) -> Path:
    """Write the report of an :class:`~torchloom.report.explain.ExplainResult` to ``path``."""
    path = Path(path)
    path.write_text(render_html(report_data(result, recorder, graph_breaks)), encoding="utf-8")
    return path


def report_data(result, recorder: PassIRRecorder | None = None,
                graph_breaks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    compiler, data = result.compiler, result.data
    details = kernel_summary(compiler)["kernel_details"]
    deadline = time.perf_counter() + TIMING_BUDGET
    graphs = []
    for comp in compiler.compilations:
        entry: dict[str, Any] = {"name": comp.name, "nodes_before": comp.nodes_before,
                                 "fallback": comp.fallback_reason,
                                 "compile_ms": round(comp.compile_seconds * 1e3, 3),
                                 "cached": comp.cached, "notes": list(comp.notes)}
        if comp.report is not None:
            diffs = list((recorder.diffs if recorder else {}).get(comp.name, []))
            entry["passes"] = [_pass_entry(rec, diffs) for rec in comp.report.records]
        if comp.graph is not None and comp.fallback_reason is None:
            view = GraphView(comp.graph)
            mine = [k for k in details if k["graph"] == comp.name]
            entry.update(view.as_json())
            entry["kernels"] = _kernels(compiler, comp, view, mine, deadline)
            entry["collapsed"] = len(view.nodes) > COLLAPSE_ABOVE
        graphs.append(entry)
    summary = {k: data.get(k) for k in ("workload", "pipeline", "graphs", "fusion_groups",
                                        "kernels", "unique_kernels", "max_abs_error",
                                        "max_scaled_error",
                                        "backward", "compile_seconds", "bytes_moved",
                                        "bytes_compulsory", "target")}
    return {"summary": summary, "fallbacks": data.get("fallbacks", []),
            "notes": data.get("notes", []), "graph_breaks": graph_breaks or [],
            "graphs": graphs}


def _pass_entry(rec, diffs: list[tuple[str, str]]) -> dict[str, Any]:
    entry = {"name": rec.name, "ms": round(rec.ms, 3), "changed": rec.changed,
             "stats": rec.stats, "skipped": rec.skipped, "diff": None}
    if not rec.skipped and diffs and diffs[0][0] == rec.name:
        entry["diff"] = diffs.pop(0)[1]
    return entry


def _kernels(compiler, comp, view: GraphView, details: list[dict],
             deadline: float) -> list[dict[str, Any]]:
    """One entry per distinct fusion-group node (a shared subgraph's once): codegen, the
    kernel's source, declined codegens with their reasons, bytes and time per call; each
    group of the view names its entry (``kernel``)."""
    choices = {id(c.node): c for c in (comp.compiled or comp.static).choices}
    group_details = [d for d in details if d["codegen"] != "aten"]
    if len(group_details) != len(view.group_nodes):  # not the walk describe_kernels made
        group_details = [{}] * len(view.group_nodes)
    kernels: list[dict[str, Any]] = []
    index: dict[int, int] = {}
    for group, node, detail in zip(view.groups, view.group_nodes, group_details):
        if id(node) not in index:
            index[id(node)] = len(kernels)
            kernels.append(_kernel_entry(compiler, comp, node, choices.get(id(node)), detail,
                                         deadline))
        group["kernel"] = index[id(node)]
        group["codegen"] = kernels[index[id(node)]]["codegen"]
    return kernels


def _kernel_entry(compiler, comp, node, choice, detail: dict, deadline: float) -> dict:
    codegen = choice.codegen if choice is not None else "eager"
    entry = {"name": detail.get("name", node.region.name), "codegen": codegen,
             "declined": [str(r) for r in (choice.fallback_reasons if choice else [])],
             "source": "", "ms": None, "grid": detail.get("grid"),
             "bytes_read": detail.get("bytes_read"),
             "bytes_written": detail.get("bytes_written"),
             "bytes_compulsory": detail.get("bytes_compulsory")}
    if comp.static is not None and node in comp.static.sources:
        entry["source"] = comp.static.sources[node].source
        return entry
    try:
        cg = compiler.plugins.codegen(codegen)
        entry["source"] = (compiler.kernel_source(choice) if choice is not None
                           else cg.generate(node, compiler.registry)).source
        if time.perf_counter() < deadline:
            entry["ms"] = _time_kernel(compiler.kernel_cache.get_or_compile(
                cg, node, compiler.registry), node)
    except Exception as exc:  # the page still shows the group, with what went wrong
        entry["source"] = entry["source"] or f"<source unavailable: {type(exc).__name__}: {exc}>"
    return entry


def _time_kernel(kernel, node) -> float | None:
    """Median milliseconds of one call of ``kernel`` on made-up inputs of the group's
    types (floats random, integers and booleans zero: indices stay in range); None when
    an input is not a tensor of static shape on this machine's CPU or GPU."""
    import torch
    args = []
    for v in node.region.inputs:
        t = v.type
        if not isinstance(t, TensorType) or not t.is_static or t.device == "meta":
            return None
        # filled through its storage: a broadcast input (stride 0) shares elements
        shape, strides = tuple(t.shape), tuple(t.actual_strides())
        size = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, strides))
        base = torch.empty(size, dtype=t.torch_dtype, device=t.device)
        base = base.normal_() if base.is_floating_point() else base.zero_()
        args.append(base.as_strided(shape, strides))
    sync = torch.cuda.synchronize if any(a.is_cuda for a in args) else (lambda: None)
    kernel(*args)  # warm-up (first-call builds)
    times = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        kernel(*args)
        sync()
        times.append(time.perf_counter() - t0)
    return round(sorted(times)[len(times) // 2] * 1e3, 4)


def render_html(data: dict[str, Any]) -> str:
    """The page: template with the style, the data (JSON) and the script inlined."""
    assets = resources.files("torchloom").joinpath("report", "assets")
    # "</" cannot end the script element early, whatever the IR or a kernel holds
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/").replace(
        "<!--", "<\\!--")
    title = f"torchloom report: {data['summary'].get('workload') or ''}"
    parts = {"TITLE": html.escape(title), "DATA": payload,
             "STYLE": assets.joinpath("report.css").read_text(encoding="utf-8"),
             "SCRIPT": assets.joinpath("report.js").read_text(encoding="utf-8")}
    # one pass over the template: a placeholder inside the data is left alone
    return re.sub(r"/\*@([A-Z]+)@\*/", lambda m: parts[m.group(1)],
                  assets.joinpath("report.html").read_text(encoding="utf-8"))
