"""Compile time of a 12-layer transformer-like stack against a 1-layer one, with
``dedup.regions`` in the pipeline: the layers become calls of one shared subgraph, so
every later pass and the codegen see one layer.

"Compile time" is what torchloom adds after aot_autograd: ``Compiler.compile_graph`` (the
pipeline and the kernels) for the forward and the backward graph, in CPU seconds of this
process (other processes competing for the cores do not enter it). Dynamo's and
aot_autograd's tracing, which grow with the model whatever the backend, are traced once
up front and not timed. Sizes are compiled in interleaved rounds (fresh Compiler, fresh
kernel-cache directory: nothing is shared between sizes or rounds); the minimum is kept.

Gates, ratios from one run:

- CPU (``test_compile_time_12_layers_over_1_layer``): 12 layers / 1 layer <= 2.0, and
  dedup.regions removes at least two thirds of the extra time that 11 more layers cost
  without it: (ratio - 1) <= (ratio without dedup.regions - 1) / 3. On CPU the kernels are
  nearly free to "compile" (eager, or Triton's interpreter), so what remains is Python
  pass time, and a 12-layer graph keeps some per-layer glue outside the shared subgraph
  (a call per layer, and the views of weights that the forward saves for backward: an
  output aliasing a region input is not allowed in a region, so they stay outside).
  Measured on a 2-core machine: about 1.5 with dedup.regions, about 4.5 without.
- GPU (``test_gpu_compile_time_12_layers_over_1_layer``, ``cuda``): the issue's gate,
  12 layers / 1 layer <= 1.2 (Inductor measured 3.27 s / 1.49 s = 2.2 on an H100), where
  real Triton compilation dominates; it also reports torchloom's absolute compile time
  against Inductor's for the same model (goal <= 0.5x; reported, not gated).

Run: ``python -m pytest benchmarks/test_dedup_compile.py -s``; results are recorded in
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import gc
import importlib.util
import time
from pathlib import Path

import pytest
import torch

from torchloom.api import Compiler, clone_graph, load_plugins
from torchloom.frontend.backend import torchloom_backend
from torchloom.frontend.fx import import_fx

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "transformer_stack.py"
MAX_RATIO = 1.2  # the gate, on a GPU
CPU_MAX_RATIO = 2.0
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
    """CPU seconds this process spends in ``compile_graph`` for the graphs: CPU time, not
    wall time, so that other processes competing for the cores do not enter the ratio."""
    compiler = Compiler(tmp / "pipeline.toml", plugins=plugins, cache_dir=tmp / label)
    copies = [clone_graph(g)[0] for g in graphs]
    gc.collect()
    t0 = time.process_time()
    for g in copies:
        compiler.compile_graph(g)
    return time.process_time() - t0, compiler


def interleaved_min(tmp: Path, plugins, graphs: dict, rounds: int,
                    label: str) -> tuple[dict[int, float], dict[int, Compiler]]:
    for layers, gs in graphs.items():  # first-use costs (op inference memos) of each size
        compile_seconds(tmp, plugins, gs, f"{label}-warmup-{layers}")
    best = {layers: float("inf") for layers in graphs}
    compilers = {}
    for r in range(rounds):
        for layers, gs in graphs.items():
            seconds, compilers[layers] = compile_seconds(tmp, plugins, gs,
                                                         f"{label}-r{r}-{layers}")
            best[layers] = min(best[layers], seconds)
    return best, compilers


def test_compile_time_12_layers_over_1_layer(setup, benchmark):
    tmp, plugins, graphs = setup
    best, compilers = interleaved_min(tmp, plugins, graphs, ROUNDS, "dedup")
    ratio = best[12] / best[1]
    regions = [r.stats for c in compilers[12].compilations for r in c.report.records
               if r.name == "dedup.regions"]
    assert [(s["regions"], s["occurrences"]) for s in regions] == [(1, 12), (1, 12)]

    (tmp / "pipeline.toml").write_text(PIPELINE.replace('[[pass]]\nname = "dedup.regions"\n\n', ""))
    try:
        plain, _ = interleaved_min(tmp, plugins, graphs, 2, "plain")
    finally:
        (tmp / "pipeline.toml").write_text(PIPELINE)
    plain_ratio = plain[12] / plain[1]

    benchmark.extra_info.update({"seconds_1_layer": best[1], "seconds_12_layers": best[12],
                                 "ratio": ratio, "ratio_without_dedup_regions": plain_ratio})
    benchmark.pedantic(compile_seconds, args=(tmp, plugins, graphs[12], "timed"), rounds=1,
                       iterations=1)
    print(f"\ntorchloom compile (CPU s): 1 layer {best[1] * 1e3:.1f} ms, 12 layers "
          f"{best[12] * 1e3:.1f} ms, ratio {ratio:.2f} (gate <= {CPU_MAX_RATIO}); without "
          f"dedup.regions: {plain[1] * 1e3:.1f} ms, {plain[12] * 1e3:.1f} ms, ratio "
          f"{plain_ratio:.2f}")
    assert ratio <= CPU_MAX_RATIO, f"12 layers take {ratio:.2f}x the compile time of 1 layer"
    # dedup.regions removes at least two thirds of what 11 more layers add
    assert (ratio - 1) * 3 <= plain_ratio - 1, (ratio, plain_ratio)


GPU_PIPELINE = PIPELINE  # codegen "triton": real Triton compiles on a GPU


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compile_time_12_layers_over_1_layer(tmp_path):
    """End to end on a GPU: torch.compile with torchloom (dedup.regions first) for 1 and
    12 layers; torchloom's own compile time (``Compilation.compile_seconds``, wall time:
    the GPU compiles are what it measures) and Inductor's whole torch.compile time."""
    spec = importlib.util.spec_from_file_location("transformer_stack", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "pipeline.toml").write_text(GPU_PIPELINE)
    seconds, inductor = {}, {}
    for layers in (1, 12):
        model, (x,) = module.workload(device="cuda", layers=layers)
        compiler = Compiler(tmp_path / "pipeline.toml", cache_dir=tmp_path / f"c{layers}",
                            device="cuda")
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=lambda gm, ex: torchloom_backend(
            gm, ex, options={"compiler": compiler}))
        out = compiled(x)
        out.sum().backward()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, model(x))
        seconds[layers] = sum(c.compile_seconds for c in compiler.compilations)
        torch._dynamo.reset()
        t0 = time.perf_counter()
        torch.compile(model)(x).sum().backward()
        torch.cuda.synchronize()
        inductor[layers] = time.perf_counter() - t0
        torch._dynamo.reset()
    ratio = seconds[12] / seconds[1]
    print(f"\ntorchloom compile: 1 layer {seconds[1]:.2f} s, 12 layers {seconds[12]:.2f} s, "
          f"ratio {ratio:.2f} (gate <= {MAX_RATIO}); Inductor torch.compile: "
          f"{inductor[1]:.2f} s, {inductor[12]:.2f} s; torchloom / Inductor at 12 layers "
          f"{seconds[12] / inductor[12]:.2f} (goal <= 0.5)")
    assert ratio <= MAX_RATIO
