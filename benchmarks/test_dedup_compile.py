"""Compile time of a 12-layer transformer-like stack against a 1-layer one, with
``dedup.regions`` in the pipeline: the layers become calls of one shared subgraph, so
every later pass and the codegen see one layer.

Gate (a ratio from this run): torchloom compile time for 12 layers / for 1 layer <= 1.2
(Inductor measured 3.27 s / 1.49 s = 2.2 on an H100). "Compile time" is what torchloom
adds after aot_autograd: ``Compiler.compile_graph`` (the pipeline and the kernels) for
the forward and the backward graph. Dynamo's and aot_autograd's tracing, which grow with
the model whatever the backend, are traced once up front and not timed. Each size is
compiled in interleaved rounds (fresh Compiler, fresh kernel-cache directory, so nothing
is shared between sizes or rounds) and the minimum is kept, so that a busy machine slows
both alike.

Run: ``python -m pytest benchmarks/test_dedup_compile.py -s``.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch

from torchloom.api import Compiler, clone_graph, load_plugins
from torchloom.frontend.fx import import_fx

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "transformer_stack.py"
MAX_RATIO = 1.2
ROUNDS = 5

#: the default pipeline with dedup.regions first, so that every later pass sees one layer
PIPELINE = """\
[pipeline]
name = "default-dedup"
codegen = "triton"
verify = "each"

[[pass]]
name = "dedup.regions"

[[pass]]
name = "canonicalize"

[[pass]]
name = "cse"

[[pass]]
name = "fusion.decompose"
optional = true

[[pass]]
name = "fusion.functionalize"
optional = true

[[pass]]
name = "views.collapse"
optional = true

[[pass]]
fixpoint = ["fusion.vertical", "fusion.horizontal"]
max_iterations = 10
optional = true

[[pass]]
name = "fusion.merge-groups"
optional = true

[[pass]]
name = "views.strip-bookends"
optional = true

[[pass]]
name = "dedup.kernels"

[[pass]]
name = "dce"
"""


def aten_graphs(layers: int) -> list:
    """The forward and backward IR graphs of the stack, as aot_autograd hands them over."""
    spec = importlib.util.spec_from_file_location("transformer_stack", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, (x,) = module.workload(layers=layers)
    graphs = []

    def backend(gm, example_inputs):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        def keep(fx_graph, inputs):
            graphs.append(import_fx(fx_graph, inputs, f"graph{len(graphs)}").graph)
            return make_boxed_func(fx_graph)
        return aot_autograd(fw_compiler=keep, bw_compiler=keep)(gm, example_inputs)

    torch._dynamo.reset()
    try:
        torch.compile(model, backend=backend)(x).sum().backward()
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 2
    return graphs


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dedup-bench")
    (tmp / "pipeline.toml").write_text(PIPELINE)
    plugins = load_plugins()
    assert "dedup.regions" in plugins.passes, "install plugins/dedup"
    return tmp, plugins, {1: aten_graphs(1), 12: aten_graphs(12)}


def compile_seconds(tmp: Path, plugins, graphs: list, label: str) -> tuple[float, Compiler]:
    compiler = Compiler(tmp / "pipeline.toml", plugins=plugins, cache_dir=tmp / label)
    for g in graphs:
        compiler.compile_graph(clone_graph(g)[0])
    return sum(c.compile_seconds for c in compiler.compilations), compiler


def test_compile_time_12_layers_over_1_layer(setup, benchmark):
    tmp, plugins, graphs = setup
    compile_seconds(tmp, plugins, graphs[1], "warmup-1")  # first-use costs of both sizes
    compile_seconds(tmp, plugins, graphs[12], "warmup-12")
    best = {1: float("inf"), 12: float("inf")}
    compilers = {}
    for r in range(ROUNDS):
        for layers in (1, 12):
            seconds, compilers[layers] = compile_seconds(tmp, plugins, graphs[layers],
                                                         f"r{r}-{layers}")
            best[layers] = min(best[layers], seconds)
    ratio = best[12] / best[1]
    regions = [r.stats for c in compilers[12].compilations for r in c.report.records
               if r.name == "dedup.regions"]
    benchmark.extra_info.update({"seconds_1_layer": best[1], "seconds_12_layers": best[12],
                                 "ratio": ratio})
    benchmark.pedantic(compile_seconds, args=(tmp, plugins, graphs[12], "timed"), rounds=1,
                       iterations=1)
    print(f"\ntorchloom compile: 1 layer {best[1] * 1e3:.1f} ms, 12 layers "
          f"{best[12] * 1e3:.1f} ms, ratio {ratio:.2f} (gate <= {MAX_RATIO})")
    assert [(s["regions"], s["occurrences"]) for s in regions] == [(1, 12), (1, 12)]
    assert ratio <= MAX_RATIO, (f"12 layers take {ratio:.2f}x the compile time of 1 layer "
                                f"(gate {MAX_RATIO})")
