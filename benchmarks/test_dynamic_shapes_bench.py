"""Dynamic shapes: the transformer stack of ``examples/transformer_stack.py`` (4 layers)
run forward and backward over 16 sequence lengths, torchloom against eager in one run.

Default ``torch.compile``: the first length compiles a static graph, the second makes
torch mark the sequence dynamic and compiles one graph with a symbolic length that every
later length runs. Gates, from one run:

- compile count (deterministic): at most two compilations per graph (forward and
  backward: <= 4), none of them a fallback to eager, and no guard of torchloom's failing
  at any length;
- time of one pass over the 16 lengths once compiled, torchloom / eager <= ``MAX_RATIO``,
  a regression guard, not the issue's goal: the goal is >= eager (torchloom at least as
  fast), and it is not met yet: measured 0.88-0.91x eager's speed (29.0 vs 25.5 ms per
  pass, AMD EPYC, load 2) with every symbolic group compiled by the cpu codegen (sizes as
  kernel arguments; 0.67x when they ran on eager), Dynamo's per-call overhead on these
  small inputs being the rest (see benchmarks/RESULTS.md). Under a load of 4-5 the medians
  give 0.63-0.65x (OpenMP workers spinning on the shared cores), so the gate stays at 2.0.
  The first pass (compiles included) is reported.

Inductor (``torch.compile`` default backend) is timed too when ``TORCHLOOM_BENCH_INDUCTOR=1``
(its compile of the symbolic graphs takes minutes on a CPU: not in CI).

Run: ``python -m pytest benchmarks/test_dynamic_shapes_bench.py -s``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch

from torchloom.compiler import Compiler

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LENGTHS = list(range(6, 6 + 4 * 16, 4))  # 16 sequence lengths, 6 to 66
MAX_RATIO = 2.0


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


def test_transformer_stack_over_16_lengths(stack, perf_gate):
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
        torch._dynamo.reset()
        inductor = torch.compile(model)
        start = time.perf_counter()
        one_pass(inductor, xs)
        first = time.perf_counter() - start
        timing = perf_gate.measure(lambda: one_pass(inductor, xs), lambda: one_pass(model, xs),
                                   rounds=7, warmup=1)
        print(f"Inductor {timing.candidate_s * 1e3:.1f} ms ({timing.speedup:.2f}x eager); "
              f"first pass {first:.2f} s")
    torch._dynamo.reset()
