"""Counting what a compiled graph launches, and the summary ``explain`` prints."""

from __future__ import annotations

from typing import Any

from torchloom.ir.graph import CALL_SUBGRAPH, CONSTANT, FUSION_GROUP, Graph

#: ops that launch nothing on a device: metadata, tuple plumbing, Python scalar math
_FREE_PREFIXES = ("python.",)


def count_kernels(graph: Graph, registry) -> int:
    """Device kernels one call launches: fusion groups + every op outside a group that is
    not a free view, a constant or Python plumbing. Shared subgraphs count their body."""
    total = 0
    for node in graph.nodes:
        if node.op == FUSION_GROUP:
            total += 1
        elif node.op == CALL_SUBGRAPH:  # each call launches its shared subgraph's kernels
            total += count_kernels(_callee(node), registry)
        elif node.region is not None:
            total += count_kernels(node.region, registry)
        elif node.op == CONSTANT or node.op.startswith(_FREE_PREFIXES):
            continue
        elif registry.get(node.op).category == "view":
            continue
        else:
            total += 1
    return total


def fusion_groups(graph: Graph) -> list:
    """Fusion group nodes one call runs; a shared subgraph's appear once per call."""
    out = []
    for node in graph.nodes:
        if node.op == FUSION_GROUP:
            out.append(node)
        elif node.op == CALL_SUBGRAPH:
            out.extend(fusion_groups(_callee(node)))
        elif node.region is not None:
            out.extend(fusion_groups(node.region))
    return out


def _callee(node) -> Graph:
    return node.graph.root.subgraphs[node.attrs["callee"]]


def summarize(compilations: list, registry, kernel_cache) -> dict[str, Any]:
    """The stable ``explain --json`` fields computed from a compiler's compilations;
    ``unique_kernels`` is the number of distinct kernels in the compiler's cache."""
    nodes_before = nodes_after = groups = kernels = 0
    fallbacks: list[dict[str, str]] = []
    passes: list[dict[str, Any]] = []
    notes: list[str] = []
    for comp in compilations:
        nodes_before += comp.nodes_before
        if comp.fallback_reason is not None:
            fallbacks.append({"graph": comp.name, "reason": comp.fallback_reason})
            nodes_after += comp.nodes_before
            kernels += comp.nodes_before
            continue
        nodes_after += comp.graph.num_nodes() + sum(sub.num_nodes()
                                                    for sub in comp.graph.subgraphs.values())
        groups += len(fusion_groups(comp.graph))
        kernels += count_kernels(comp.graph, registry)
        for choice in (comp.compiled or comp.static).choices:
            # reasons of codegens that declined a group another codegen then compiled
            # (triton declining a CPU group that cpu takes) are not fallbacks
            for reason in choice.fallback_reasons if choice.codegen == "eager" else ():
                fallbacks.append({"graph": comp.name, "reason": f"group on eager: {reason}"})
        for rec in comp.report.records:
            entry = {"graph": comp.name, "name": rec.name, "ms": round(rec.ms, 3),
                     "changed": rec.changed, "stats": rec.stats}
            if rec.cpu_ms is not None:  # (None: a record from an older cache entry)
                entry["cpu_ms"] = round(rec.cpu_ms, 3)
            if rec.skipped:
                entry["skipped"] = rec.skipped
            passes.append(entry)
        notes.extend(n for n in comp.notes if n not in notes)
    return {"graphs": len(compilations), "nodes_before": nodes_before,
            "nodes_after": nodes_after, "fusion_groups": groups, "kernels": kernels,
            "unique_kernels": unique_kernels(compilations, kernel_cache), "fallbacks": fallbacks,
            "passes": passes,
            "notes": notes, "kernel_cache": _cache_stats(kernel_cache),
            "dedup": dedup_summary(compilations, kernel_cache, groups)}


def unique_kernels(compilations: list, kernel_cache) -> int:
    """Distinct kernels: the kernel cache's size, or, compiled for a target (nothing
    loaded), the distinct sources generated."""
    static = [c.static for c in compilations if getattr(c, "static", None) is not None]
    if static:
        return len({k.source for plan in static for k in plan.sources.values()})
    return len(kernel_cache)


def kernel_summary(compiler) -> dict[str, Any]:
    """``kernel_details`` (every kernel one call of each graph launches: grid, bytes read,
    written and compulsory; registers and spills when compiled for a target),
    ``bytes_moved`` (their sum) and ``bytes_compulsory`` (each graph's tensor inputs and
    outputs once, summed over graphs). Graphs that fell back to eager are left out."""
    from torchloom.runtime.static import describe_kernels, graph_compulsory
    registry = compiler.registry
    details, compulsory = [], 0
    for comp in compiler.compilations:
        if comp.fallback_reason is not None:
            continue
        if comp.static is not None:
            kernels = comp.static.kernels(registry, comp.name)
        else:
            sources = {c.node: compiler.kernel_source(c) for c in comp.compiled.choices}
            kernels = describe_kernels(comp.graph, registry, sources, name=comp.name)
        details.extend(k.as_json() for k in kernels)
        compulsory += graph_compulsory(comp.graph, registry)
    moved = sum(k["bytes_read"] + k["bytes_written"] for k in details)
    return {"kernel_details": details, "bytes_moved": moved, "bytes_compulsory": compulsory}


def compile_cache_summary(graph_cache) -> dict[str, int] | None:
    """``compile_cache`` of ``explain --json``: the compile cache's ``hits`` (local or
    remote), ``misses``, ``remote_hits`` and ``remote_errors``; None when it is off."""
    if graph_cache is None:
        return None
    return {"hits": graph_cache.hits, "misses": graph_cache.misses,
            "remote_hits": graph_cache.remote_hits, "remote_errors": graph_cache.remote_errors}


def _cache_stats(kernel_cache) -> dict[str, Any]:
    stats = getattr(kernel_cache, "stats", None)
    return stats() if callable(stats) else {}


def dedup_summary(compilations: list, kernel_cache, groups: int) -> dict[str, Any]:
    """What deduplication saved: fusion groups against unique kernels, shared regions and
    the occurrences they replaced (added up from the passes that report a
    :class:`~torchloom.passes.base.Deduplication`, whichever they are), and an estimate of
    the compile time saved: each kernel reused at the average measured compile time, plus,
    per graph, the time of the passes after such a pass scaled by the nodes they no longer
    saw (a linear model: passes with a fixed cost per graph make it an overestimate)."""
    total = dict.fromkeys(("regions", "occurrences", "nodes_deduplicated"), 0)
    saved_ms = _cache_stats(kernel_cache).get("saved_ms_estimate", 0.0)
    for comp in compilations:
        if comp.report is None:
            continue
        records = comp.report.records
        seen = comp.graph.num_nodes() + sum(s.num_nodes() for s in comp.graph.subgraphs.values())
        for at, record in enumerate(records):
            if not record.deduplication:
                continue
            for key in total:
                total[key] += record.deduplication.get(key, 0)
            after_ms = sum(r.ms for r in records[at + 1:])
            saved_ms += after_ms * record.deduplication.get("nodes_deduplicated", 0) / max(seen, 1)
    return {"fusion_groups": groups, "unique_kernels": unique_kernels(compilations, kernel_cache),
            "regions": total["regions"], "occurrences_replaced": total["occurrences"],
            "nodes_deduplicated": total["nodes_deduplicated"],
            "compile_ms_saved_estimate": round(saved_ms, 3)}
