"""The seed workloads of the triton codegen (issue 8): eager, Inductor (``torch.compile``
default) and torchloom (default pipeline, ``triton`` codegen), same inputs, same run.

Per workload: median time per call of each variant, kernels per call (torchloom from its
graph, matmuls included; Inductor's generated kernels from ``torch._inductor.metrics``,
which leaves out its extern matmul calls), compile seconds, and % of the copy
roofline: the minimal bytes the workload must move divided by the copy bandwidth measured
on this device in this run. Each row prints as a table line and, when
``TORCHLOOM_BENCH_JSON`` names a file, is appended there under ``"codegen_triton"``.
Each row is a perf gate of torchloom against Inductor (``GATES``: the ratio reached so far;
the goal is >= 1.0 everywhere).

Run on a GPU: ``python -m pytest benchmarks/gpu/test_triton_bench.py -s``.
"""

from __future__ import annotations

import statistics
import time
import types
from collections.abc import Callable

import pytest
import torch

from gpu_common import CUDA_ONLY, append_json, lstm_cell

pytestmark = CUDA_ONLY

#: minimum speed-up of torchloom over Inductor per workload (the ratio reached so far)
GATES = {"gelu_bookend": 0.9, "transpose_bookend": 0.9, "three_view_a": 0.9,
         "three_view_b": 0.9, "three_view_c": 0.9, "layer_norm": 0.8, "softmax": 0.8,
         "bias_gelu_bf16": 0.9, "lstm_cell": 0.8}


def _gelu_bookend(x):
    rows, cols = x.shape
    return torch.nn.functional.gelu(x.view(rows // 64, 64, cols)).view(rows, cols)


def _transpose_bookend(x):
    return torch.relu(x.transpose(1, 2) * 2.0).transpose(1, 2)


def _three_view_a(x):
    rows, cols = x.shape
    return ((x.view(rows // 64, 64, cols) + 1.0) * 2.0).view(rows, cols)


def _three_view_b(x):
    rows, cols = x.shape
    return (x + 1.0).view(rows // 64, 64, cols) * 2.0


def _three_view_c(x):
    rows, cols = x.shape
    y = (x.view(rows // 64, 64, cols) + 1.0).view(rows, cols)
    return (y * 2.0).view(rows // 64, 64, cols)


def _layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)


def _softmax(x):
    return torch.softmax(x, dim=-1)


def _bias_gelu(y, b):  # y: the bf16 output of a matmul
    return torch.nn.functional.gelu(y + b)


def _inputs(name: str) -> tuple[Callable, list[torch.Tensor], int]:
    """(function, inputs, minimal bytes moved per call)."""
    torch.manual_seed(0)
    dev = "cuda"
    big = (8192, 3072)
    f32 = 8192 * 3072 * 4
    if name == "gelu_bookend":
        return _gelu_bookend, [torch.randn(*big, device=dev)], 2 * f32
    if name == "transpose_bookend":
        x = torch.randn(768, 128, 64, device=dev)
        return _transpose_bookend, [x], 2 * x.numel() * 4
    if name.startswith("three_view"):
        fn = {"a": _three_view_a, "b": _three_view_b, "c": _three_view_c}[name[-1]]
        return fn, [torch.randn(*big, device=dev)], 2 * f32
    if name == "layer_norm":
        return _layer_norm, [torch.randn(*big, device=dev), torch.rand(3072, device=dev),
                             torch.randn(3072, device=dev)], 2 * f32
    if name == "softmax":
        return _softmax, [torch.randn(*big, device=dev)], 2 * f32
    if name == "bias_gelu_bf16":
        a = torch.randn(8192, 1024, device=dev, dtype=torch.bfloat16)
        w = torch.randn(1024, 3072, device=dev, dtype=torch.bfloat16) * 0.03
        y = a @ w
        return _bias_gelu, [y, torch.randn(3072, device=dev, dtype=torch.bfloat16)], f32
    if name == "lstm_cell":
        b, h = 64, 1024
        args = [torch.randn(b, h, device=dev), torch.randn(b, h, device=dev),
                torch.randn(b, h, device=dev), torch.randn(4 * h, h, device=dev) * 0.03,
                torch.randn(4 * h, h, device=dev) * 0.03, torch.randn(4 * h, device=dev),
                torch.randn(4 * h, device=dev)]
        return lstm_cell, args, sum(t.numel() * 4 for t in args) + 2 * b * h * 4
    raise KeyError(name)


def time_us(fn: Callable, args, calls: int = 20, repeats: int = 15) -> float:
    """Median over ``repeats`` of the mean microseconds per call (synchronised)."""
    for _ in range(3):
        fn(*args)
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


@pytest.fixture(scope="module")
def copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy of 256 MiB, measured now."""
    src = torch.empty(64 * 2 ** 20, device="cuda")
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), (), calls=10, repeats=10)
    return 2 * src.numel() * 4 / (us * 1e-6)


def _own_code(fn, tag: str):
    """``fn`` with a code object of its own: dynamo caches per code object, so each
    variant keeps its compiled graph however calls alternate."""
    if not isinstance(fn, types.FunctionType):
        return fn
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__,
                              fn.__closure__)


def compile_variant(fn, args, backend: str, cold: bool = False):
    """Compile and run once. ``cold`` resets dynamo first (compile-time measurements)."""
    if cold:
        torch._dynamo.reset()
    fn = _own_code(fn, backend)
    kernels = None
    t0 = time.perf_counter()
    if backend == "inductor":
        from torch._inductor import metrics
        metrics.reset()
        compiled = torch.compile(fn, dynamic=False)
        compiled(*args)
        kernels = metrics.generated_kernel_count
    else:
        from torchloom.tools import Compiler, count_kernels
        compiler = Compiler("default")
        compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler},
                                 dynamic=False)
        compiled(*args)
        kernels = sum(count_kernels(c.graph, compiler.registry)
                      for c in compiler.compilations if c.graph is not None)
        compiled.torchloom_choices = [ch for c in compiler.compilations if c.compiled
                                      for ch in c.compiled.choices]
    torch.cuda.synchronize()
    return compiled, time.perf_counter() - t0, kernels


def record(row: dict) -> None:
    print("\n" + " | ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in row.items()))
    append_json("codegen_triton", row)


@pytest.mark.parametrize("name", sorted(GATES))
def test_workload(name, perf_gate, copy_bandwidth):
    fn, args, nbytes = _inputs(name)
    torch._dynamo.reset()
    with torch.no_grad():
        inductor, inductor_s, inductor_kernels = compile_variant(fn, args, "inductor")
        loom, loom_s, loom_kernels = compile_variant(fn, args, "torchloom")
        want, got = fn(*args), loom(*args)
        torch.testing.assert_close(got, want, rtol=2e-2 if name.endswith("bf16") else 1e-4,
                                   atol=2e-2 if name.endswith("bf16") else 1e-4)
        eager_us = time_us(fn, args)
        result = perf_gate(loom, inductor, args=args, min_speedup=GATES[name], rounds=15,
                           iterations=20, sync=torch.cuda.synchronize,
                           names=("torchloom", "inductor"))
    roofline_us = nbytes / copy_bandwidth * 1e6
    loom_us, inductor_us = result.candidate_s * 1e6, result.baseline_s * 1e6
    record({"workload": name, "device": torch.cuda.get_device_name(),
            "eager_us": eager_us, "inductor_us": inductor_us, "torchloom_us": loom_us,
            "roofline_us": roofline_us, "torchloom_pct_roofline": 100 * roofline_us / loom_us,
            "inductor_pct_roofline": 100 * roofline_us / inductor_us,
            "speedup_vs_inductor": inductor_us / loom_us, "torchloom_kernels": loom_kernels,
            "inductor_kernels": inductor_kernels, "torchloom_compile_s": loom_s,
            "inductor_compile_s": inductor_s,
            "codegens": sorted({c.codegen for c in loom.torchloom_choices})})


class _Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def test_compile_time_12_blocks_vs_1():
    """Compile seconds of a 12-block MLP over a 1-block one (cold kernel caches)."""
    x = torch.randn(64, 256, device="cuda")
    row = {"workload": "mlp_compile_12_vs_1", "device": torch.cuda.get_device_name()}
    with torch.no_grad():
        for backend in ("torchloom", "inductor"):
            seconds = {}
            for blocks in (1, 12):
                model = torch.nn.Sequential(*[_Block(256) for _ in range(blocks)]).cuda()
                compiled, seconds[blocks], _ = compile_variant(model, [x], backend, cold=True)
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
            row[f"{backend}_compile_1_s"] = seconds[1]
            row[f"{backend}_compile_12_s"] = seconds[12]
            row[f"{backend}_ratio_12_vs_1"] = seconds[12] / seconds[1]
    record(row)
    assert row["torchloom_ratio_12_vs_1"] < 12  # dedup: identical blocks compile once
