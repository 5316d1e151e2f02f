"""Processes tuning the same kernel at once (DDP ranks) take a file lock: one benchmarks
the candidates, the others wait for its record and use it (Launcher._autotune)."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest
import torch

from torchloom_codegen_triton.codegen import Launcher

CONFIGS = [{"XBLOCK": 256, "num_warps": 4}, {"XBLOCK": 1024, "num_warps": 4}]
META = {"kernel": "fused_exp", "device": "cpu", "grid_size": 4096, "configs": CONFIGS,
        "inputs": [{"shape": [4096], "strides": [1], "dtype": "f32"}],
        "outputs": [{"shape": [4096], "strides": [1], "dtype": "f32"}]}


class _Kernel:
    def __getitem__(self, grid):
        return lambda *args, num_warps, **blocks: None


def _tune_in_child(tmp: str) -> dict:
    import triton.testing
    runs = Path(tmp) / "bench_runs.txt"

    def fake_bench(fn, warmup, rep):
        with runs.open("a") as f:
            f.write("x")
        time.sleep(0.3)
        fn()
        return 1.0 if len(runs.read_text()) % 2 == 0 else 2.0

    triton.testing.do_bench = fake_bench
    launcher = Launcher(_Kernel(), META, dict(CONFIGS[0]), Path(tmp) / "k.tune.json",
                        verbose=False)
    launcher(torch.randn(4096))
    return launcher.config


@pytest.mark.slow
def test_concurrent_tuners_benchmark_once(tmp_path):
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        configs = pool.map_async(_tune_in_child, [str(tmp_path)] * 3).get(timeout=300)
    record = json.loads((tmp_path / "k.tune.json").read_text())
    assert len((tmp_path / "bench_runs.txt").read_text()) == len(CONFIGS)  # one tuner
    assert all(c == record["config"] for c in configs)  # the others took its result


def test_a_record_written_while_waiting_is_used_without_benchmarking(tmp_path, monkeypatch):
    import triton.testing

    def no_bench(*a, **k):
        raise AssertionError("benchmarked although a record exists")

    monkeypatch.setattr(triton.testing, "do_bench", no_bench)
    tune = tmp_path / "k.tune.json"
    launcher = Launcher(_Kernel(), META, dict(CONFIGS[0]), tune, verbose=False)
    tune.write_text(json.dumps({"config": CONFIGS[1], "timings_ms": {}}))  # another rank
    launcher(torch.randn(4096))
    assert launcher.config == CONFIGS[1] and launcher.tune_path is None
