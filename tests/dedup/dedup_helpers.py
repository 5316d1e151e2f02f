"""Test helpers for the dedup tests (imported by them and by their subprocesses): a codegen
that counts ``generate``/``load`` calls, a stand-in grouping pass for when the fusion
plugin is not installed, and a compiler factory."""

from __future__ import annotations

import types
from pathlib import Path
from typing import ClassVar

import attrs

from torchloom.api import (FUSION_GROUP, Graph, KernelSource, Node, Pass, PassContext, PassResult,
                           hookimpl, parse_graph, print_graph)
from torchloom.tools import Compiler, build_function, load_plugins


class CountingCodegen:
    """The eager codegen's behaviour, counting how often it generates and loads."""

    name = "counting"
    version = "1"

    def __init__(self):
        self.generated = 0
        self.loaded = 0

    def supports(self, group: Node, registry):
        return None

    def generate(self, group: Node, registry) -> KernelSource:
        self.generated += 1
        return KernelSource(self.name, print_graph(group.region),
                            {"nodes": len(group.region)})

    def load(self, kernel: KernelSource, registry):
        self.loaded += 1
        return build_function(parse_graph(kernel.source), registry).fn


@attrs.frozen
class GroupPointwiseRuns(Pass):
    """Test stand-in for the fusion plugin: each maximal run of consecutive pointwise
    nodes (two or more) becomes one fusion group. A run is contiguous in topological
    order, so it is convex."""

    name: ClassVar[str] = "test.group-pointwise"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        runs, run = [], []
        for n in graph.nodes:
            if n.region is None and ctx.registry.get(n.op).category == "pointwise":
                run.append(n)
                continue
            runs.append(run)
            run = []
        runs.append(run)
        made = 0
        for run in (r for r in runs if len(r) >= 2):
            _group(graph, run)
            made += 1
        return PassResult(made > 0, {"groups": made})


def _group(graph: Graph, run: list[Node]) -> None:
    inside = set(run)
    region = Graph(f"group{graph.fresh_name('g')}")
    mapping = {}
    outer_inputs = []
    for n in run:
        for v in n.inputs:
            if v.producer not in inside and v not in mapping:
                mapping[v] = region.add_input(v.type, v.name)
                outer_inputs.append(v)
    escaping = []
    for n in run:
        new = region.create(n.op, [mapping[v] for v in n.inputs], [v.type for v in n.outputs],
                            n.attrs, names=[v.name for v in n.outputs])
        mapping.update(zip(n.outputs, new.outputs))
        escaping += [v for v in n.outputs
                     if v in graph.outputs or any(u not in inside for u in v.uses)]
    region.set_outputs([mapping[v] for v in escaping])
    node = graph.create(FUSION_GROUP, outer_inputs, [v.type for v in escaping],
                        names=[v.name for v in escaping], region=region, before=run[0])
    for old, new in zip(escaping, node.outputs):
        graph.replace_all_uses(old, new)
    for n in reversed(run):
        graph.erase(n)


@attrs.frozen
class CountNodes(Pass):
    """Test pass: reports how many nodes it was shown; the pass manager sums the stats
    over the main graph and each shared subgraph."""

    name: ClassVar[str] = "test.count-nodes"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        return PassResult(False, {"nodes": len(graph), "graphs": 1})


def plugin_set(codegen: CountingCodegen):
    """Installed plugins plus the counting codegen and the test passes."""
    module = types.SimpleNamespace(
        torchloom_codegens=hookimpl(lambda: [codegen]),
        torchloom_passes=hookimpl(lambda: [GroupPointwiseRuns, CountNodes]))
    return load_plugins(extra=[("dedup-tests", module, "dedup-tests", "0")])


def has_fusion(plugins) -> bool:
    return "fusion.vertical" in plugins.passes


def write_pipeline(path: Path, passes: list[str], *, codegen: str = "counting",
                   verify: str = "each") -> Path:
    text = f'[pipeline]\nname = "{path.stem}"\ncodegen = "{codegen}"\nverify = "{verify}"\n'
    for p in passes:  # a pass name, or a raw [[pass]] table
        text += f"\n{p}\n" if p.startswith("[[") else f'\n[[pass]]\nname = "{p}"\n'
    path.write_text(text)
    return path


def grouping_passes(plugins) -> list[str]:
    """Fusion passes when the fusion plugin is installed, the stand-in otherwise."""
    if not has_fusion(plugins):
        return ["test.group-pointwise"]
    passes = ["fusion.decompose",
              '[[pass]]\nfixpoint = ["fusion.vertical", "fusion.horizontal"]\nmax_iterations = 10',
              "fusion.merge-groups"]
    if "views.strip-bookends" in plugins.passes:  # bookend views (select of step t) leave groups
        passes.append("views.strip-bookends")
    return passes


def compiler(tmp: Path, passes: list[str], codegen: CountingCodegen, cache_dir: Path | None = None,
             plugins=None, **kwargs) -> Compiler:
    plugins = plugins or plugin_set(codegen)
    tmp.mkdir(parents=True, exist_ok=True)
    pipeline = write_pipeline(tmp / "pipeline.toml", passes, **kwargs)
    return Compiler(pipeline, plugins=plugins, cache_dir=cache_dir or tmp / "cache")
