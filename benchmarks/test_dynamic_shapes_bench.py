"""Dynamic shapes: the transformer stack of ``examples/transformer_stack.py`` (4 layers)
run forward and backward over 16 sequence lengths, torchloom against eager in one run.

Default ``torch.compile``: the first length compiles a static graph, the second makes
torch mark the sequence dynamic and compiles one graph with a symbolic length that every
later length runs. Gates, from one run:

- compile count (deterministic): at most two compilations per graph (forward and
  backward: <= 4), none of them a fallback to eager, and no guard of torchloom's failing
  at any length;
- time of one pass over the 16 lengths once compiled, torchloom / eager <= ``MAX_RATIO``
  (1.3). The issue's goal is >= eager (torchloom at least as fast): measured 1.05-1.07x
  eager's speed by this gate's medians and 1.06x by the interleaved minima (Intel Xeon 2
  vCPU, load < 1; see benchmarks/RESULTS.md), so the gate guards that with room for the
  noise of a shared machine (medians once swung to 0.63x at a load of 4-5, OpenMP workers
  spinning on the shared cores).
  The first pass (compiles included) is reported.

Inductor (``torch.compile``'s default backend, automatic dynamic as torchloom gets it) is
measured in the same run when ``TORCHLOOM_BENCH_INDUCTOR=1``: its compile count (forward and
backward graphs, at most 4) and compile time, its first pass, and one pass once compiled
against eager and against torchloom (alternating rounds). Opt-in because its C++ compiles
of the four graphs take 1.5-2 minutes on the loaded 2-core CI machine (torchloom's ~10 s);
nothing is gated on Inductor's speed (figures: benchmarks/RESULTS.md).

Run: ``python -m pytest benchmarks/test_dynamic_shapes_bench.py -s``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import pytest
import torch

from torchloom.compiler import Compiler

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LENGTHS = list(range(6, 6 + 4 * 16, 4))  # 16 sequence lengths, 6 to 66
MAX_RATIO = 1.3


@pytest.fixture(scope="module")
def stack():
    sys.path.insert(0, str(EXAMPLES))
    try:
        from transformer_stack import workload
    finally:
        sys.path.remove(str(EXAMPLES))
    model, _ = workload(layers=4)
    gen = torch.Generator().manual_seed(0)
    return model, [torch.randn(2, s, 32, generator=gen) for s in LENGTHS]


def one_pass(fn, xs):
    """Forward and backward at every length."""
    for x in xs:
        x = x.clone().requires_grad_()
        fn(x).sum().backward()


def counted_inductor(model):
    """``torch.compile(model)`` with Inductor, the default backend (its own dynamic-shape
    policy: automatic dynamic), its graph compiles counted and timed: ``graphs`` forward and
    backward graphs compiled (``compile_fx_inner`` calls), ``seconds`` wall time inside
    the backend (Dynamo graph -> aot_autograd -> forward kernels) and the backward compiles
    (run at the first backward unless compiled with the forward)."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner
    stats = {"graphs": 0, "seconds": 0.0, "dynamo": 0}
    inside = []  # non-empty while the backend runs (a backward compiled there is timed)

    def inner(gm, example_inputs, **kwargs):
        stats["graphs"] += 1
        if inside or not kwargs.get("is_backward"):
            return compile_fx_inner(gm, example_inputs, **kwargs)
        start = time.perf_counter()
        try:
            return compile_fx_inner(gm, example_inputs, **kwargs)
        finally:
            stats["seconds"] += time.perf_counter() - start

    def backend(gm, example_inputs):
        stats["dynamo"] += 1
        start = time.perf_counter()
        inside.append(gm)
        try:
            return compile_fx(gm, example_inputs, inner_compile=inner)
        finally:
            inside.pop()
            stats["seconds"] += time.perf_counter() - start

    torch._dynamo.reset()  # Dynamo's automatic dynamic starts afresh, as it did for torchloom
    return torch.compile(model, backend=backend), stats


def test_transformer_stack_over_16_lengths(stack, perf_gate, tmp_path):
    model, xs = stack
    torch._dynamo.reset()
    compiler = Compiler("default", compile_cache=False)
    compiled = torch.compile(model, backend="torchloom", options={"compiler": compiler})
    start = time.perf_counter()
    one_pass(compiled, xs)
    first = time.perf_counter() - start
    comps = compiler.compilations
    assert len(comps) <= 4, [c.name for c in comps]
    assert all(c.fallback_reason is None for c in comps), [c.fallback_reason for c in comps]
    # every group, static or symbolic, is a C kernel: none runs on eager for its sizes
    assert all(c.codegen == "cpu" for comp in comps for c in comp.compiled.choices), [
        (c.codegen, [str(r) for r in c.fallback_reasons]) for comp in comps
        for c in comp.compiled.choices if c.codegen != "cpu"]
    x = xs[-1].clone().requires_grad_()
    torch.testing.assert_close(compiled(x), model(x))
    result = perf_gate(lambda: one_pass(compiled, xs), lambda: one_pass(model, xs),
                       min_speedup=1 / MAX_RATIO, rounds=7, warmup=1,
                       names=("torchloom", "eager"))
    assert all(c.compiled.fallback_calls == 0 for c in comps)
    print(f"\n16 lengths, fw+bw: torchloom {result.candidate_s * 1e3:.1f} ms, eager "
          f"{result.baseline_s * 1e3:.1f} ms ({result.speedup:.2f}x); first pass with "
          f"{len(comps)} compilations {first:.2f} s")
    if os.environ.get("TORCHLOOM_BENCH_INDUCTOR") == "1":
        inductor_column(model, xs, compiled, tmp_path)
    torch._dynamo.reset()


def inductor_column(model, xs, compiled, cache_dir):
    """Inductor beside torchloom and eager, cold (its caches off and in a new directory):
    compile count and time, first pass, then torchloom, eager and Inductor timed in
    interleaved rounds (min and median per pass)."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    original = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    try:
        with inductor_config.patch(fx_graph_cache=False), \
                functorch_config.patch(enable_autograd_cache=False):
            inductor, stats = counted_inductor(model)
            start = time.perf_counter()
            one_pass(inductor, xs)
            first = time.perf_counter() - start
    finally:
        if original is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = original
    compiles = stats["graphs"]
    assert 1 <= compiles <= 4, stats  # at most a static and a symbolic pair
    x = xs[-1].clone().requires_grad_()
    torch.testing.assert_close(inductor(x), model(x))
    sides = {"torchloom": compiled, "eager": model, "Inductor": inductor}
    times: dict[str, list[float]] = {name: [] for name in sides}
    # round 0 warms up (torchloom compiles again after the reset, with the length already
    # dynamic); the order rotates so that drift favours none
    for r in range(8):
        order = list(sides)[r % 3:] + list(sides)[:r % 3]
        for name in order:
            start = time.perf_counter()
            one_pass(sides[name], xs)
            if r:
                times[name].append(time.perf_counter() - start)
    assert stats["graphs"] == compiles, stats  # the timed passes compiled nothing more
    line = ", ".join(f"{name} min {min(t) * 1e3:.1f} / median {statistics.median(t) * 1e3:.1f} ms"
                     for name, t in times.items())
    print(f"interleaved, 7 rounds: {line}; Inductor first pass {first:.1f} s, {compiles} "
          f"graphs compiled (forward and backward) in {stats['seconds']:.1f} s, "
          f"{stats['dynamo']} Dynamo graphs")
