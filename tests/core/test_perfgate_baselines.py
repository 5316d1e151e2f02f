"""Perf-gate baselines across runs (``--perf-baseline=save|compare``, kept in
pytest-benchmark's storage by machine id), ``torchloom perf-history``, and the
instruction-count mode's honest skip, each in a pytest session of its own (pytester)."""

from __future__ import annotations

import json

import pytest

from torchloom.cli import main
from torchloom.testing.perfcount import CountersUnavailable, open_counter

pytest_plugins = ["pytester"]

GATE = """
import os

DATA = list(range(5_000))
SLOW = int(os.environ.get("SLOW", "1"))


def candidate():
    return sum(DATA * SLOW)


def baseline():
    return sum(DATA) + sum(DATA) + sum(DATA) + sum(DATA) + sum(DATA) + sum(DATA)


def test_gate(perf_gate):
    # a wide tolerance: a loaded machine can drift a few percent between two runs
    perf_gate(candidate, baseline, min_speedup=1.0, rounds=12, max_time=5,
              max_regression=0.3)
"""


@pytest.fixture
def gate(pytester):
    pytester.makepyfile(test_gate=GATE)
    return pytester


def test_save_then_compare_fails_a_slowdown_the_ratio_gate_still_passes(gate, monkeypatch,
                                                                          capsys):
    monkeypatch.setenv("SLOW", "1")
    gate.runpytest("-p", "no:cacheprovider", "--perf-baseline=save").assert_outcomes(passed=1)
    files = list(gate.path.glob(".benchmarks/*/perfgate/*.json"))
    assert len(files) == 1
    run = json.loads(files[0].read_text())["runs"][0]
    assert run["gate"] == "test_gate.py::test_gate[candidate-vs-baseline]"
    assert run["verdict"] == "pass" and len(run["candidate"]) == run["rounds"] >= 12
    # unchanged: compared, no regression
    same = gate.runpytest("-p", "no:cacheprovider", "--perf-baseline=compare")
    same.assert_outcomes(passed=1)
    same.stdout.fnmatch_lines(["*test_gate: baseline: candidate is *x its saved run*"])
    # three times the work: still faster than its baseline (6 sums against 3), but a
    # regression (twice the work was once let through on a loaded 2-core machine: its
    # rounds' spread put the interval's top at 0.88x, inside the 30% tolerance)
    monkeypatch.setenv("SLOW", "3")
    slower = gate.runpytest("-p", "no:cacheprovider", "--perf-baseline=compare")
    slower.assert_outcomes(failed=1)
    slower.stdout.fnmatch_lines(["*PASS: candidate *x baseline*",
                                 "*REGRESSION: candidate is 0.*x its saved run*tolerance 30%*"])
    gate.runpytest("-p", "no:cacheprovider", "--perf-baseline=save").assert_outcomes(passed=1)
    capsys.readouterr()
    assert main(["perf-history", "test_gate", "--storage", str(gate.path / ".benchmarks")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("test_gate.py::test_gate[candidate-vs-baseline]")
    assert len(out) == 3 and "pass" in out[1] and "the run before" in out[2]
    assert main(["perf-history", "--json", "--storage", str(gate.path / ".benchmarks")]) == 0
    doc = json.loads(capsys.readouterr().out)
    (saved,) = doc["gates"]
    assert saved["runs"][1]["vs_previous"][0] < 0.8  # the SLOW=3 run saved second


def test_compare_without_a_saved_run_says_so(gate):
    result = gate.runpytest("-p", "no:cacheprovider", "--perf-baseline=compare")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*no saved baseline for test_gate.py::test_gate*"])


def test_perf_history_of_a_missing_folder_is_a_user_error(tmp_path, capsys):
    assert main(["perf-history", "--storage", str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_instruction_mode_counts_or_skips_saying_why(pytester):
    pytester.makepyfile(test_count="""
DATA = list(range(2_000))

def test_instructions(perf_gate):
    r = perf_gate(lambda: sum(DATA[:10]), lambda: sum(DATA), min_speedup=2.0,
                  measure="instructions", rounds=6)
    assert r.verdict == "pass" and r.unit == "instructions"
""")
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    try:
        open_counter().close()
    except CountersUnavailable as exc:  # this machine (a VM without a virtual PMU) says so
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines([f"*instruction counts unavailable: {exc}*"])
    else:
        result.assert_outcomes(passed=1)
