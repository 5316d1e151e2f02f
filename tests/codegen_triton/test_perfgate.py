"""The perf-gate pytest plugin (core/torchloom/testing/perfgate.py), on CPU with two
functions of clearly different cost."""

from __future__ import annotations

import pytest
from torchloom.testing.perfgate import PerfGate

DATA = list(range(20_000))


def cheap():
    return sum(DATA[:100])


def costly():
    return sum(DATA) + sum(DATA) + sum(DATA)


def test_plugin_is_registered_through_pytest11(request):
    assert request.config.pluginmanager.hasplugin("torchloom_perfgate")


def test_gate_passes_when_the_candidate_is_faster(perf_gate):
    result = perf_gate(cheap, costly, min_speedup=2.0, rounds=7, iterations=5)
    assert result.speedup >= 2.0
    assert result.candidate_s < result.baseline_s
    assert perf_gate.benchmark.extra_info["speedup"] == result.speedup


def test_gate_fails_when_the_speedup_is_below_the_threshold(perf_gate):
    with pytest.raises(pytest.fail.Exception, match=r"perf gate: candidate is 0\.\d+x baseline"):
        perf_gate(costly, cheap, min_speedup=1.0, rounds=5, iterations=3)


def test_measure_passes_arguments_and_calls_sync():
    calls = []
    result = PerfGate(benchmark=None).measure(lambda n: calls.append(n), lambda n: calls.append(-n),
                               args=(3,), rounds=3, warmup=1, sync=lambda: calls.append(0))
    assert calls.count(3) == 4 and calls.count(-3) == 4 and 0 in calls
    assert result.candidate_s > 0 and result.baseline_s > 0
