"""What the compiler decided for each graph, told to the ``torchloom.compiler`` logger at
INFO (``TORCH_LOGS=+torchloom`` shows it, as it shows any module's logs) and, for
``tlparse``, as structured trace entries beside Dynamo's (``TORCH_TRACE=DIR``)::

    torchloom: graph0: pipeline 'default' (14 passes, codegens triton, cpu) on 64 nodes
    torchloom: graph0: pass fusion.vertical changed the graph in 0.18 ms (merged=9)
    torchloom: graph0: group k_52511e1e (7 ops) on cpu; declined: triton: CPU group: ...
    torchloom: graph0: 64 -> 40 nodes, 9 fusion groups (cpu 9) in 1754.4 ms; kernel
               cache: 8 compiled, 1 hit, 0 from disk
    torchloom: graph1: runs eagerly: pass 'fusion.vertical' raised ... Reproducer: /...

Trace artifacts: ``torchloom_<graph>_ir`` (the graph after the pipeline, IR text) and
``torchloom_<graph>_compile`` (JSON: pipeline, passes, groups, cache, fallback).
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger("torchloom.compiler")

_COUNTERS = ("compiles", "hits", "disk_hits")


def cache_counters(cache) -> dict[str, int]:
    """The kernel cache's counters now (``log_compilation`` reports what a graph added)."""
    stats = getattr(cache, "stats", None)
    got = stats() if callable(stats) else {}
    return {k: int(got.get(k, 0)) for k in _COUNTERS}


def log_compilation(compiler, comp, counters_before: dict[str, int]) -> None:
    """Log (INFO) and trace one compiled graph: the pipeline, each pass that changed the
    graph (DEBUG for the others), each group's codegen and who declined it, the kernel
    cache's work for this graph, and the notes."""
    pipeline, name = compiler.pipeline, comp.name
    counters = {k: v - counters_before.get(k, 0)
                for k, v in cache_counters(compiler.kernel_cache).items()}
    choices = list((comp.compiled or comp.static).choices) if (comp.compiled or comp.static) \
        else []
    groups = [{"group": c.node.region.name, "ops": c.node.region.num_nodes(),
               "codegen": c.codegen, "declined": [str(r) for r in c.fallback_reasons]}
              for c in choices]
    if log.isEnabledFor(logging.INFO):
        log.info("torchloom: %s: pipeline %r (%d passes, codegens %s) on %d nodes%s", name,
                 pipeline.name, len(pipeline.flat_steps()),
                 ", ".join(pipeline.codegens or (pipeline.codegen,)), comp.nodes_before,
                 "; graph loaded from the compile cache, no pass ran" if comp.cached else "")
        for rec in comp.report.records if not comp.cached else ():
            stats = ", ".join(f"{k}={v}" for k, v in rec.stats.items() if v)
            level = logging.INFO if rec.changed or rec.skipped else logging.DEBUG
            log.log(level, "torchloom: %s: pass %s %s in %.2f ms%s", name, rec.name,
                    f"skipped after an error: {rec.skipped}" if rec.skipped
                    else "changed the graph" if rec.changed else "changed nothing", rec.ms,
                    f" ({stats})" if stats else "")
        for g in groups:
            log.info("torchloom: %s: group %s (%d ops) on %s%s", name, g["group"], g["ops"],
                     g["codegen"], "; declined: " + "; ".join(g["declined"])
                     if g["declined"] else "")
        on: dict[str, int] = {}
        for g in groups:
            on[g["codegen"]] = on.get(g["codegen"], 0) + 1
        log.info("torchloom: %s: %d -> %d nodes, %d fusion groups (%s) in %.1f ms; kernel "
                 "cache: %d compiled, %d hit(s), %d from disk", name, comp.nodes_before,
                 comp.graph.num_nodes(), len(groups),
                 ", ".join(f"{k} {v}" for k, v in sorted(on.items())) or "none",
                 comp.compile_seconds * 1e3, counters["compiles"], counters["hits"],
                 counters["disk_hits"])
        for note in comp.notes:
            log.info("torchloom: %s: note: %s", name, note)
    _trace(name, lambda: str(comp.graph), lambda: {
        "graph": name, "pipeline": pipeline.name, "source": pipeline.source,
        "nodes_before": comp.nodes_before, "nodes_after": comp.graph.num_nodes(),
        "cached": comp.cached, "compile_ms": round(comp.compile_seconds * 1e3, 3),
        "passes": [{"name": r.name, "ms": round(r.ms, 3), "changed": r.changed,
                    "stats": r.stats, "skipped": r.skipped} for r in comp.report.records],
        "groups": groups, "kernel_cache": counters, "notes": list(comp.notes),
        "fallback": None})


def log_fallback(name: str, reason: str, nodes: int) -> None:
    """A graph that runs eagerly: the whole reason (with its reproducer's path) at INFO
    and in the trace (the one-line warning is the compiler's)."""
    log.info("torchloom: %s: runs eagerly (%d ops): %s", name, nodes, reason)
    _trace(name, None, lambda: {"graph": name, "fallback": reason, "nodes_before": nodes})


def _trace(name: str, ir, summary) -> None:
    try:
        from torch._logging import trace_structured
    except ImportError:  # a torch without structured tracing
        return
    if ir is not None:
        trace_structured("artifact", metadata_fn=lambda: {"name": f"torchloom_{name}_ir",
                                                          "encoding": "string"},
                         payload_fn=ir, expect_trace_id=False)
    trace_structured("artifact", metadata_fn=lambda: {"name": f"torchloom_{name}_compile",
                                                      "encoding": "json"},
                     payload_fn=lambda: json.dumps(summary(), default=_jsonable),
                     expect_trace_id=False)


def _jsonable(x: Any) -> str:
    return repr(x)
