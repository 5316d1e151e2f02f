"""CUDA graphs on launch-bound workloads: eager, torchloom without and with the
``cudagraphs`` runtime wrapper (copying outputs out, and ``reuse_outputs``), and Inductor
``mode="reduce-overhead"``, all timed in the same run.

Ratios (time / torchloom-with-cudagraphs time and the like) are printed and, when
``TORCHLOOM_BENCH_JSON`` names a file, written there as JSON. The gate is a ratio from this
run: replaying through CUDA graphs must beat the same torchloom pipeline without them.
The issue's goal (at or under Inductor reduce-overhead) is reported, not gated.

Run on a GPU: ``python -m pytest benchmarks/gpu/test_cudagraphs_bench.py -s``.
"""

from __future__ import annotations

import statistics
import time
from importlib import resources

import pytest
import torch

from gpu_common import CUDA_ONLY, append_json, lstm_cell

pytestmark = CUDA_ONLY

CALLS_PER_REPEAT = 200
REPEATS = 7


def _two_input_sets(*shapes):
    """Two sets of fresh inputs, alternated call by call, so that every compiled variant
    sees inputs that change address (as a serving loop does) and must copy them in."""
    return [tuple(torch.randn(*shape, device="cuda") * 0.1 for shape in shapes)
            for _ in range(2)]


def mlp_batch1():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 16)).cuda().eval()
    return model, _two_input_sets((1, 256))


class LSTMStep(torch.nn.Module):
    """One LSTM cell step written out, weights as parameters (static for every variant)."""

    def __init__(self, inp: int, hidden: int):
        super().__init__()
        self.w_ih = torch.nn.Parameter(torch.randn(4 * hidden, inp) * 0.1)
        self.w_hh = torch.nn.Parameter(torch.randn(4 * hidden, hidden) * 0.1)
        self.b_ih = torch.nn.Parameter(torch.randn(4 * hidden) * 0.1)
        self.b_hh = torch.nn.Parameter(torch.randn(4 * hidden) * 0.1)

    def forward(self, x, hx, cx):
        return lstm_cell(x, hx, cx, self.w_ih, self.w_hh, self.b_ih, self.b_hh)


def lstm_step_batch1():
    torch.manual_seed(0)
    hidden, inp = 256, 128
    return LSTMStep(inp, hidden).cuda(), _two_input_sets((1, inp), (1, hidden), (1, hidden))


WORKLOADS = {"mlp_batch1": mlp_batch1, "lstm_step_batch1": lstm_step_batch1}


def _pipeline(tmp_path, name: str, runtime: str) -> str:
    """The shipped default pipeline with a ``[runtime]`` section appended."""
    text = (resources.files("torchloom") / "pipelines" / "default.toml").read_text()
    path = tmp_path / f"{name}.toml"
    path.write_text(text + "\n" + runtime)
    return str(path)


def _seconds_per_call(fn, arg_sets) -> float:
    """Median over REPEATS of the mean time of CALLS_PER_REPEAT back-to-back calls, the
    input sets alternating."""
    for i in range(20):  # compile, warm up, record
        fn(*arg_sets[i % 2])
    torch.cuda.synchronize()
    samples = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for i in range(CALLS_PER_REPEAT):
            fn(*arg_sets[i % 2])
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / CALLS_PER_REPEAT)
    return statistics.median(samples)


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_cudagraphs_against_eager_and_inductor_reduce_overhead(workload, tmp_path, benchmark):
    fn, arg_sets = WORKLOADS[workload]()
    torch._dynamo.reset()
    variants = {
        "eager": fn,
        "torchloom": torch.compile(fn, backend="torchloom", options={
            "pipeline": _pipeline(tmp_path, "plain", "")}),
        "torchloom_cudagraphs": torch.compile(fn, backend="torchloom", options={
            "pipeline": _pipeline(tmp_path, "cg", "[runtime]\ncudagraphs = true\n")}),
        "torchloom_cudagraphs_reuse": torch.compile(fn, backend="torchloom", options={
            "pipeline": _pipeline(tmp_path, "cg_reuse",
                                  "[runtime.cudagraphs]\nreuse_outputs = true\n")}),
        "inductor_reduce_overhead": torch.compile(fn, mode="reduce-overhead"),
    }
    times = {}
    with torch.no_grad():
        expected = [_first(fn(*args)).clone() for args in arg_sets]
        for name, variant in variants.items():
            times[name] = _seconds_per_call(variant, arg_sets)
            for args, want in zip(arg_sets, expected):
                torch.testing.assert_close(_first(variant(*args)), want, rtol=1e-4, atol=1e-4)
        benchmark(variants["torchloom_cudagraphs"], *arg_sets[0])
    torch._dynamo.reset()

    base = times["torchloom_cudagraphs"]
    ratios = {f"{name}_over_torchloom_cudagraphs": round(t / base, 3)
              for name, t in times.items() if name != "torchloom_cudagraphs"}
    result = {"workload": workload, "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "microseconds_per_call": {
                  k: round(v * 1e6, 2) for k, v in times.items()}, "ratios": ratios,
              "meets_goal_vs_inductor_reduce_overhead":
                  times["torchloom_cudagraphs"] <= times["inductor_reduce_overhead"]}
    benchmark.extra_info.update(result)
    print(f"\n{workload} on {result['device']}: " + ", ".join(
        f"{k} {v}x" for k, v in ratios.items()))
    append_json("cudagraphs", result)
    assert times["torchloom_cudagraphs"] < times["torchloom"], result
