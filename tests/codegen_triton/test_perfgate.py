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
    assert result.verdict == "pass" and result.low >= 2.0 and result.rounds >= 7
    assert result.low <= result.speedup <= result.high
    assert result.candidate_s < result.baseline_s
    info = perf_gate.benchmark.extra_info
    assert info["speedup"] == result.speedup and info["verdict"] == "pass"
    assert (info["low"], info["high"], info["rounds"]) == (result.low, result.high,
                                                           result.rounds)
    # the table's row is the gate's own candidate samples, not a run of its own
    assert perf_gate.benchmark.stats.stats.rounds == result.rounds


def test_gate_fails_when_the_speedup_is_below_the_threshold(perf_gate):
    with pytest.raises(pytest.fail.Exception,
                       match=r"perf gate: candidate is 0\.\d+x baseline \[0\.\d+, 0\.\d+\]"):
        perf_gate(costly, cheap, min_speedup=1.0, rounds=6, iterations=3)


def test_measure_passes_arguments_and_calls_sync():
    calls = []
    result = PerfGate(benchmark=None).measure(lambda n: calls.append(n), lambda n: calls.append(-n),
                               args=(3,), rounds=3, warmup=1, sync=lambda: calls.append(0))
    assert calls.count(3) == 4 and calls.count(-3) == 4 and 0 in calls
    assert result.candidate_s > 0 and result.baseline_s > 0 and result.rounds == 3


def test_measure_orders_each_round_at_random_with_a_seed():
    def orders(seed):
        calls = []
        PerfGate(benchmark=None).measure(lambda: calls.append("c"), lambda: calls.append("b"),
                                         rounds=16, warmup=0, seed=seed)
        return "".join(calls)
    assert orders(1) == orders(1)  # reproducible
    firsts = orders(1)[::2]
    assert "c" in firsts and "b" in firsts  # not a fixed alternation either
    assert firsts not in ("cb" * 8, "bc" * 8)


def test_a_second_gate_in_a_test_keeps_out_of_the_table(perf_gate):
    first = perf_gate(cheap, costly, min_speedup=2.0, rounds=7, iterations=5)
    second = perf_gate(cheap, costly, min_speedup=1.5, rounds=7, iterations=5,
                       names=("cheap", "costly"), table=False)
    assert first.verdict == second.verdict == "pass"
    info = perf_gate.benchmark.extra_info
    assert info["speedup"] == first.speedup
    assert info["gate_cheap_vs_costly"]["speedup"] == second.speedup
    assert perf_gate.benchmark.stats.stats.rounds == first.rounds
