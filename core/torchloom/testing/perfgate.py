"""Perf gates: a pytest plugin (entry point ``pytest11``) with a ``perf_gate`` fixture.

A gate times a *candidate* and a *baseline* in the same run, on the same inputs, in
interleaved rounds (so machine noise hits both alike), records the candidate through
pytest-benchmark (it appears in the benchmark table, with the baseline and the speed-up in
``extra_info``), and fails the test when ``median(baseline) / median(candidate)`` is below
the threshold the test states. A gate is a ratio, never an absolute time::

    def test_fused_softmax_beats_inductor(perf_gate):
        x = torch.randn(8192, 3072, device="cuda")
        perf_gate(torchloom_fn, inductor_fn, args=(x,), min_speedup=1.0,
                  sync=torch.cuda.synchronize)

``retries=N`` measures a gate below its threshold again, up to N more times (every
speed-up measured is recorded and named in the failure).

``--perf-gates=off|warn|fail`` (or the ini option ``perf_gates``) says what a gate does:
``fail`` (the default) fails the test below its threshold, ``warn`` times it and emits a
:class:`PerfGateWarning` instead, ``off`` skips it without timing anything. Timing goes
through pytest-benchmark's public API only (``pedantic``, ``extra_info``);
``pip install torchloom[perfgate]`` installs it.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pytest


@attrs.frozen
class GateResult:
    candidate_s: float
    baseline_s: float

    @property
    def speedup(self) -> float:
        return self.baseline_s / self.candidate_s if self.candidate_s > 0 else float("inf")


MODES = ("off", "warn", "fail")


class PerfGateWarning(UserWarning):
    """A gate below its threshold under ``--perf-gates=warn``."""


def pytest_addoption(parser) -> None:
    group = parser.getgroup("torchloom perf gates")
    group.addoption("--perf-gates", choices=MODES, default=None,
                    help="what a perf gate below its threshold does: fail the test (default), "
                         "warn, or off (gates are skipped, nothing is timed)")
    parser.addini("perf_gates", "default of --perf-gates: off, warn or fail", default="fail")


def pytest_configure(config) -> None:
    gate_mode(config)  # a bad ini value is a usage error before any test runs


def gate_mode(config) -> str:
    mode = config.getoption("perf_gates") or config.getini("perf_gates") or "fail"
    if mode not in MODES:
        raise pytest.UsageError(f"perf_gates = {mode!r}: expected one of {', '.join(MODES)}")
    return mode


class PerfGate:
    """Callable returned by the ``perf_gate`` fixture."""

    def __init__(self, benchmark, mode: str = "fail"):
        self.benchmark = benchmark
        self.mode = mode

    def measure(self, candidate: Callable, baseline: Callable, *, args: Sequence[Any] = (),
                rounds: int = 15, iterations: int = 1, warmup: int = 2,
                sync: Callable[[], Any] | None = None) -> GateResult:
        """Median seconds per call of both functions, measured in alternating rounds."""
        timer = time.perf_counter

        def timed(fn: Callable) -> float:
            if sync is not None:
                sync()
            start = timer()
            for _ in range(iterations):
                fn(*args)
            if sync is not None:
                sync()
            return (timer() - start) / iterations

        for _ in range(warmup):
            timed(candidate)
            timed(baseline)
        cand, base = [], []
        for r in range(rounds):  # alternate which goes first, so drift favours neither
            pair = ((cand, candidate), (base, baseline))
            for samples, fn in (pair if r % 2 == 0 else pair[::-1]):
                samples.append(timed(fn))
        return GateResult(statistics.median(cand), statistics.median(base))

    def __call__(self, candidate: Callable, baseline: Callable, *, min_speedup: float,
                 args: Sequence[Any] = (), rounds: int = 15, iterations: int = 1,
                 warmup: int = 2, sync: Callable[[], Any] | None = None,
                 names: tuple[str, str] = ("candidate", "baseline"),
                 retries: int = 0) -> GateResult:
        """Time both, record them, and fail (or warn, per ``--perf-gates``) when the
        speed-up is below ``min_speedup``. ``retries``: a measurement below the threshold
        is taken again, up to that many more times (a burst of load on a shared machine
        can slow one side of one measurement several-fold); the gate holds when one
        measurement reaches the threshold, and every speed-up measured is recorded
        (``extra_info["speedups"]``) and named in the failure."""
        if self.mode == "off":
            pytest.skip("perf gates are off (--perf-gates=off)")
        speedups: list[float] = []
        for _ in range(retries + 1):
            result = self.measure(candidate, baseline, args=args, rounds=rounds,
                                  iterations=iterations, warmup=warmup, sync=sync)
            speedups.append(result.speedup)
            if result.speedup >= min_speedup:
                break
        info = self.benchmark.extra_info
        info.update({f"{names[0]}_median_s": result.candidate_s,
                     f"{names[1]}_median_s": result.baseline_s,
                     "speedup": result.speedup, "min_speedup": min_speedup,
                     "speedups": speedups})

        def run_candidate():
            candidate(*args)
            if sync is not None:
                sync()
        self.benchmark.pedantic(run_candidate, rounds=rounds, iterations=iterations,
                                warmup_rounds=0)
        if result.speedup < min_speedup:
            message = (f"perf gate: {names[0]} is {result.speedup:.3f}x {names[1]} "
                       f"({result.candidate_s * 1e6:.1f} us vs {result.baseline_s * 1e6:.1f} "
                       f"us median over {rounds} rounds); the test requires >= "
                       f"{min_speedup}x")
            if len(speedups) > 1:
                message += (f" (measured {len(speedups)} times: "
                            f"{', '.join(f'{x:.3f}x' for x in speedups)})")
            if self.mode == "warn":
                warnings.warn(PerfGateWarning(message), stacklevel=2)
            else:
                pytest.fail(message, pytrace=False)
        return result


@pytest.fixture
def perf_gate(request) -> PerfGate:
    """Gate a candidate against a baseline: ``perf_gate(cand, base, min_speedup=1.2)``."""
    mode = gate_mode(request.config)
    if mode == "off":
        return PerfGate(None, mode)
    if not request.config.pluginmanager.hasplugin("benchmark"):
        pytest.fail("perf gates record their timings through pytest-benchmark, which is not "
                    "installed (or disabled with -p no:benchmark): pip install "
                    "'torchloom[perfgate]'", pytrace=False)
    return PerfGate(request.getfixturevalue("benchmark"), mode)
