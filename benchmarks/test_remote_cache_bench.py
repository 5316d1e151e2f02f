"""The shared (remote) cache: compiling the 12-layer transformer stack (forward and
backward graph) on a new machine (empty local cache directory) whose fleet compiled it
before (warm Redis), against compiling it with Redis empty (cold: every pass runs, every
kernel is generated, and both are written to Redis). Same run, interleaved rounds, CPU
seconds of the compiling process (other processes on the cores stay out of the ratio; the
round trips to a loopback Redis, a few per graph and kernel, are well under a
millisecond), in a fresh interpreter against a redis-server of its own
(:mod:`torchloom.testing.redis_server`).

Gate: warm / cold <= ``MAX_RATIO``.

The first training step (torch.compile, the forward, the backward) of the same stack on the
CPU with the default pipeline, where the ``cpu`` codegen builds each graph's library with the
C compiler: a new machine of a fleet that ran the step before (warm: graphs, kernels and
libraries from Redis, no pass, no compiler) against the first machine (cold: Redis emptied).
Each step in a fresh interpreter; CPU seconds of that process and of the compilers it ran:
the whole step (Dynamo and aot_autograd, which no cache skips, included; gate warm / cold
<= ``FIRST_STEP_MAX_RATIO``) and torchloom's part of it (its ``compile_fx`` calls: passes,
kernels, the plan; and the C compilers it ran, on threads that may end after those calls;
gate <= ``OWN_MAX_RATIO``).

Run: ``python -m pytest benchmarks/test_remote_cache_bench.py -s``.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from timing import in_fresh_interpreter

MAX_RATIO = 0.7  # measured 0.56-0.57 on a shared 2-core machine (RESULTS.md)
ROUNDS = 6
FIRST_STEP_MAX_RATIO = 0.97  # Dynamo and aot_autograd dominate (RESULTS.md): 0.85-0.94
# measured; torchloom's own part has its own gate (OWN_MAX_RATIO)
OWN_MAX_RATIO = 0.5  # see RESULTS.md for what was measured
#: rounds of the first step (cold, then warm), each in fresh interpreters: one, and a
#: second only when the first is above a bound (a retry: the bounds stay; each part's
#: minimum over the rounds is gated)
FIRST_STEP_ROUNDS = 2
KEY = "benchmark-key"


def _compile(pipeline: Path, plugins, graphs: list, work: Path, url: str):
    from torchloom.api import clone_graph
    from torchloom.tools import Compiler
    compiler = Compiler(pipeline, plugins=plugins, cache_dir=work, compile_cache=True,
                        remote_cache=url)
    copies = [clone_graph(g)[0] for g in graphs]
    os.environ["TRITON_CACHE_DIR"] = str(work / "triton-cache")  # nothing reused locally
    gc.collect()
    t0 = time.process_time()
    for g in copies:
        compiler.compile_graph(g)
    return time.process_time() - t0, compiler


def measure(url: str) -> dict:
    import redis
    from torchloom.tools import load_plugins

    from test_dedup_compile import PIPELINE, aten_graphs
    os.environ["TORCHLOOM_REMOTE_CACHE_KEY"] = KEY
    client = redis.Redis.from_url(url)
    tmp = Path(tempfile.mkdtemp(prefix="torchloom-remote-bench-"))
    try:
        plugins = load_plugins()
        graphs = aten_graphs(12)
        pipeline = tmp / "pipeline.toml"
        pipeline.write_text(PIPELINE)
        _compile(pipeline, plugins, graphs, tmp / "warmup", url)  # first-use costs
        cold, warm = [], []
        for r in range(ROUNDS):
            client.flushdb()
            seconds, first = _compile(pipeline, plugins, graphs, tmp / f"cold{r}", url)
            cold.append(seconds)
            seconds, again = _compile(pipeline, plugins, graphs, tmp / f"warm{r}", url)
            warm.append(seconds)
        return {"cold": min(cold), "warm": min(warm),
                "remote_hits": [first.graph_cache.remote_hits, again.graph_cache.remote_hits],
                "kernel_compiles": again.kernel_cache.compiles}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_warm_remote_cache_over_cold(benchmark, tmp_path):
    from torchloom.testing.redis_server import start_redis, stop_redis
    proc, url = start_redis(tmp_path)
    try:
        data = benchmark.pedantic(in_fresh_interpreter, args=(__file__, f"{url}/0"),
                                  kwargs={"timeout": 900}, rounds=1, iterations=1)
    finally:
        stop_redis(proc)
    assert data["remote_hits"] == [0, 2]  # cold: none; warm: both graphs
    assert data["kernel_compiles"] == 0
    ratio = data["warm"] / data["cold"]
    benchmark.extra_info.update(data, ratio=ratio)
    print(f"\n12-layer stack, forward + backward, new machine: cold {data['cold'] * 1e3:.1f} "
          f"ms, warm remote cache {data['warm'] * 1e3:.1f} ms, ratio {ratio:.2f} "
          f"(gate <= {MAX_RATIO})")
    assert ratio <= MAX_RATIO


def first_step(url: str, work: str) -> dict:
    """One first training step of the 12-layer stack on the CPU, default pipeline, an
    empty local cache in ``work``: CPU seconds (this process and the compilers it ran)
    and what came from the shared cache."""
    import resource

    import torch
    from torchloom.tools import Compiler, import_workload

    from test_dedup_compile import EXAMPLE
    os.environ.update(TORCHLOOM_REMOTE_CACHE_KEY=KEY, TORCHLOOM_CACHE_DIR=work)
    torch.set_num_threads(1)  # CPU seconds, not the spin of idle OpenMP threads

    def cc_seconds() -> float:  # the compilers this process ran (and waited for)
        cc = resource.getrusage(resource.RUSAGE_CHILDREN)
        return cc.ru_utime + cc.ru_stime

    def self_seconds() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        return own.ru_utime + own.ru_stime

    def cpu_seconds() -> float:
        return self_seconds() + cc_seconds()
    model, (x,) = import_workload(EXAMPLE).workload(layers=12)
    compiler = Compiler("default", remote_cache=url)
    # CPU seconds of each torchloom compile in this process (passes, kernels, the plan);
    # the library builds are the compilers' (cc below: they run on threads, and may end
    # after compile_fx returns, during the step)
    own = []
    compile_fx = compiler.compile_fx

    def timed_compile_fx(gm, example_inputs, **options):  # boxed, donated
        t0 = self_seconds()
        try:
            return compile_fx(gm, example_inputs, **options)
        finally:
            own.append(self_seconds() - t0)
    compiler.compile_fx = timed_compile_fx
    step = torch.compile(model, backend="torchloom", options={"compiler": compiler})
    gc.collect()
    t0, cc0 = cpu_seconds(), cc_seconds()
    out = step(x)
    out.sum().backward()
    seconds, cc = cpu_seconds() - t0, cc_seconds() - cc0
    torch.testing.assert_close(out, model(x))
    return {"seconds": seconds, "own_seconds": sum(own) + cc, "cc_seconds": cc,
            "graph_remote_hits": compiler.graph_cache.remote_hits,
            "kernel_compiles": compiler.kernel_cache.compiles,
            "libraries": compiler.remote_cache.stats("artifact-cpu")}


def first_step_best(runs: list) -> dict:
    """(cold or warm, part) -> the least seconds of that part over the rounds."""
    return {(kind, part): min(r[i][part] for r in runs)
            for i, kind in enumerate(["cold", "warm"])
            for part in ("seconds", "own_seconds", "cc_seconds")}


def first_step_ratios(best: dict) -> tuple[float, float]:
    """(warm / cold of the whole step, of torchloom's own part) of ``first_step_best``."""
    return (best["warm", "seconds"] / best["cold", "seconds"],
            best["warm", "own_seconds"] / best["cold", "own_seconds"])


def test_first_step_on_a_new_machine_warm_over_cold(benchmark, tmp_path):
    import redis

    from torchloom.testing.redis_server import start_redis, stop_redis
    proc, url = start_redis(tmp_path)

    def rounds():
        client = redis.Redis.from_url(f"{url}/0")
        runs = []
        for r in range(FIRST_STEP_ROUNDS):
            client.flushdb()
            runs.append([in_fresh_interpreter(__file__, "first-step", f"{url}/0",
                                              str(tmp_path / f"{kind}{r}"), timeout=900)
                         for kind in ("cold", "warm")])
            ratio, own = first_step_ratios(first_step_best(runs))
            if ratio <= FIRST_STEP_MAX_RATIO and own <= OWN_MAX_RATIO:
                break
        return runs
    try:
        runs = benchmark.pedantic(rounds, rounds=1, iterations=1)
    finally:
        stop_redis(proc)
    for cold, warm in runs:
        assert cold["graph_remote_hits"] == 0 and cold["libraries"]["stores"] > 0
        assert warm["graph_remote_hits"] == 2 and warm["kernel_compiles"] == 0
        assert warm["libraries"]["hits"] == cold["libraries"]["stores"]
        assert warm["cc_seconds"] == 0 < cold["cc_seconds"]  # no compiler ran
    best = first_step_best(runs)
    ratio, own = first_step_ratios(best)
    benchmark.extra_info.update({f"{k}_{p}": v for (k, p), v in best.items()}, ratio=ratio,
                                own_ratio=own)
    print(f"\n12-layer stack, first training step on the CPU, new machine (CPU seconds, C "
          f"compiler included): cold {best['cold', 'seconds']:.2f} s, warm remote cache "
          f"{best['warm', 'seconds']:.2f} s, ratio {ratio:.2f} (gate <= "
          f"{FIRST_STEP_MAX_RATIO}); torchloom's part {best['cold', 'own_seconds']:.2f} s, "
          f"{best['warm', 'own_seconds']:.2f} s, ratio {own:.2f} (gate <= {OWN_MAX_RATIO}); "
          f"of which the C compiler {best['cold', 'cc_seconds']:.2f} s, "
          f"{best['warm', 'cc_seconds']:.2f} s")
    assert ratio <= FIRST_STEP_MAX_RATIO
    assert own <= OWN_MAX_RATIO


if __name__ == "__main__":  # a measurement, in a fresh process
    if sys.argv[1] == "first-step":
        print(json.dumps(first_step(*sys.argv[2:4])))
    else:
        print(json.dumps(measure(sys.argv[1])))
