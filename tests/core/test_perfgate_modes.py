"""The perf-gate plugin's switch (--perf-gates=off|warn|fail, ini perf_gates), its need
for pytest-benchmark (the [perfgate] extra), and no private pytest-benchmark attribute,
checked in pytest sessions of their own (pytester)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import torchloom.testing.perfgate as perfgate

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
GATES = """
import pathlib

DATA = list(range(20_000))
CALLS = pathlib.Path("calls.txt")


def cheap():
    return sum(DATA[:100])


def costly():
    with CALLS.open("a") as f:
        f.write("x")
    return sum(DATA) + sum(DATA) + sum(DATA)


def test_too_slow(perf_gate):
    perf_gate(costly, cheap, min_speedup=1.0, rounds=3, iterations=2)


def test_fast_enough(perf_gate):
    perf_gate(cheap, costly, min_speedup=1.5, rounds=3, iterations=2)
"""

RETRIES = """
DATA = list(range(2_000))


def cheap():
    return sum(DATA)


def test_retries_multiply_the_budget(perf_gate):
    # identical sides at a level that practically never decides: the budget runs out
    result = perf_gate(cheap, cheap, min_speedup=1.0, rounds=6, iterations=2, retries=1,
                       level=0.99999, fail_level=0.99999, max_time=60, max_rounds=60)
    assert result.verdict == "inconclusive" and result.rounds == 2 * 60
"""


@pytest.fixture
def gates(pytester):
    pytester.makepyfile(test_gates=GATES)
    return pytester


def test_fail_is_the_default(gates):
    result = gates.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*perf gate: candidate is 0.*x baseline [[]0.*, 0.*[]]*"
                                 "FAIL: *requires >= 1x*"])
    # every gate's verdict line is in the summary, the passing one too
    result.stdout.fnmatch_lines(["*- perf gates -*", "test_gates.py::test_*: *",
                                 "test_gates.py::test_*: *"])
    assert "PASS: candidate" in result.stdout.str()


def test_retries_still_accepted_and_multiply_the_budget(pytester):
    pytester.makepyfile(test_retries=RETRIES)
    result = pytester.runpytest("-p", "no:cacheprovider")
    # inconclusive warns by default (under a loaded machine's xdist run a second warning
    # came once, session 36: its text is printed if it comes again)
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 1 and set(outcomes) <= {"passed", "warnings"}, \
        result.stdout.str()
    assert outcomes.get("warnings", 0) >= 1, result.stdout.str()
    # the same function on both sides: a speed-up near 1 (0.998x or 1.003x), inconclusive
    # after the whole budget, doubled by the retry (60 rounds each)
    result.stdout.fnmatch_lines(["*INCONCLUSIVE: candidate [01].*x baseline*120 rounds x 2 calls*"])


def _both_pass_and_one_warns(result) -> None:
    """Warn mode: the failing gate warns and passes; under a loaded xdist run the passing
    gate (3 rounds) may come out inconclusive, a second warning (sessions 36, 73), never a
    failure."""
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 2 and set(outcomes) <= {"passed", "warnings"}, \
        result.stdout.str()
    assert outcomes.get("warnings", 0) >= 1, result.stdout.str()


def test_warn_times_and_warns_instead_of_failing(gates):
    result = gates.runpytest("-p", "no:cacheprovider", "--perf-gates=warn")
    _both_pass_and_one_warns(result)
    result.stdout.fnmatch_lines(["*PerfGateWarning: perf gate: candidate is 0.*x baseline*"])


def test_off_skips_the_gates_and_times_nothing(gates):
    result = gates.runpytest("-p", "no:cacheprovider", "--perf-gates=off", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*perf gates are off (--perf-gates=off)*"])
    assert not (gates.path / "calls.txt").exists()


def test_the_ini_option_sets_the_default_and_the_flag_wins(gates):
    gates.makeini("[pytest]\nperf_gates = warn\n")
    _both_pass_and_one_warns(gates.runpytest("-p", "no:cacheprovider"))
    gates.runpytest("-p", "no:cacheprovider", "--perf-gates=fail").assert_outcomes(
        passed=1, failed=1)
    gates.makeini("[pytest]\nperf_gates = sometimes\n")
    result = gates.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*perf_gates = 'sometimes': expected one of off, warn, fail*"])


def test_a_bad_flag_value_is_a_usage_error(gates):
    result = gates.runpytest("-p", "no:cacheprovider", "--perf-gates=maybe")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--perf-gates: invalid choice: 'maybe'*"])


def test_without_pytest_benchmark_the_gate_says_what_to_install(gates):
    result = gates.runpytest("-p", "no:cacheprovider", "-p", "no:benchmark")
    result.assert_outcomes(errors=2)  # the fixture cannot be set up
    assert "pip install 'torchloom[perfgate]'" in result.stdout.str()


def test_the_perfgate_extra_pulls_pytest_benchmark():
    try:
        import tomllib
    except ModuleNotFoundError:
        import tomli as tomllib
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(d.startswith("pytest-benchmark") for d in extras["perfgate"])


def test_no_private_pytest_benchmark_attribute_is_used():
    tree = ast.parse(Path(perfgate.__file__).read_text())
    private = [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
               and node.attr.startswith("_") and not node.attr.startswith("__")
               and ast.unparse(node.value) in ("self.benchmark", "benchmark")]
    assert private == []
