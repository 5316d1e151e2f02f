"""The shared (remote) cache: compiling the 12-layer transformer stack (forward and
backward graph) on a new machine (empty local cache directory) whose fleet compiled it
before (warm Redis), against compiling it with Redis empty (cold: every pass runs, every
kernel is generated, and both are written to Redis). Same run, interleaved rounds, CPU
seconds of the compiling process (other processes on the cores stay out of the ratio; the
round trips to a loopback Redis, a few per graph and kernel, are well under a
millisecond), in a fresh interpreter against a redis-server of its own
(:mod:`torchloom.testing.redis_server`).

Gate: warm / cold <= ``MAX_RATIO``.

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


if __name__ == "__main__":  # the measurement, in a fresh process
    print(json.dumps(measure(sys.argv[1])))
