"""Perf gates: a pytest plugin (entry point ``pytest11``) with the ``perf_gate`` and
``kernel_gate`` fixtures.

A ratio gate times a *candidate* and a *baseline* in the same run, on the same inputs, in
paired rounds (each round times both, in an order drawn at random), and decides with
statistics (:mod:`perfstats`): the speed-up ``baseline / candidate`` and its confidence
interval (Hodges-Lehmann over the rounds' log-ratios, or a seeded bootstrap over pairs).
``pass`` when the interval's low end is at or above the threshold, ``fail`` when its high
end is below it, else it measures more rounds, until ``max_time`` seconds (2; or
``max_rounds``), and ends ``inconclusive``. Since it looks many times, each look's interval
is corrected by alpha spending (:class:`perfstats.Spending`): over a whole measurement the
pass side errs at most ``(1 - level) / 2`` (``level`` 95 %) and the fail side at most
``1 - fail_level`` (1 %). A ``fail`` must be confirmed by ``confirm`` (2) fresh
measurements, each after a pause of ``confirm_pause`` seconds, that also end ``fail``, their
fail side at ``confirm_level`` (95 %, spent likewise) (a burst of load cannot fail a gate
alone; an unconfirmed one is ``inconclusive``). Under "no difference" the measurements'
signs are independent coin flips (each round's order is drawn at random), so a candidate
no slower than the threshold fails all three with probability at most
0.01 x 0.05 x 0.05 = 2.5e-5::

    def test_fused_softmax_beats_inductor(perf_gate):
        x = torch.randn(8192, 3072, device="cuda")
        result = perf_gate(torchloom_fn, inductor_fn, args=(x,), min_speedup=1.0,
                           sync=torch.cuda.synchronize)
        # result.verdict, .speedup, .low, .high, .rounds

The inner loop is calibrated (``iterations=None``) so one sample lasts ``min_sample``
seconds (10 ms: several scheduler time slices, see :mod:`perfmeasure`). Every gate's
verdict line is printed in pytest's terminal summary; the result is in pytest-benchmark's
``extra_info`` and its table holds the gate's own candidate samples (the first timed by
pytest-benchmark, the others added to that row), not a run of its own.

Options: ``--perf-gates=off|warn|fail`` (ini ``perf_gates``: what a ``fail`` does),
``--perf-inconclusive=pass|warn|fail`` (ini ``perf_inconclusive``, default ``warn``),
``--perf-baseline=off|save|compare`` (:mod:`perfbaseline`), ``--perf-max-time`` (seconds a
measurement may take, default 2). ``measure="instructions"`` counts instructions instead
of time (:mod:`perfcount`) where the platform allows it, and skips, saying why, where not.
``retries=N`` (the gate before issue 44) multiplies the round and time budget by N + 1.
The line and ``low``/``high`` show the interval of the deciding measurement's last look
(corrected as above), ``rounds`` counts every round measured.
``pip install torchloom[perfgate]`` installs pytest-benchmark.
"""

from __future__ import annotations

import itertools
import math
import random
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pytest

from torchloom.testing import perfbaseline
from torchloom.testing.kernelgate import kernel_gate  # noqa: F401  (fixture of this plugin)
from torchloom.testing.perfmeasure import (MAX_ROUNDS, MIN_SAMPLE, Budget, Measurement,
                                           Samples, calibrate, confirmed, sampler,
                                           sequential)
from torchloom.testing.perfstats import METHODS, Spending

MODES = ("off", "warn", "fail")
INCONCLUSIVE = ("pass", "warn", "fail")
PROPERTY = "perf_gate"


class PerfGateWarning(UserWarning):
    """A gate that failed under ``--perf-gates=warn``, or ended inconclusive under
    ``--perf-inconclusive=warn``."""


@attrs.frozen
class GateResult:
    """What a gate decided. ``speedup``/``low``/``high`` are the deciding measurement's
    (the last one) at its last look, each side at that look's spent rate; ``rounds``
    counts every round measured; ``candidate_s``/``baseline_s`` are medians per call over
    them (instructions per call in instruction mode)."""
    verdict: str
    speedup: float
    low: float
    high: float
    rounds: int
    threshold: float
    level: float
    method: str
    iterations: int
    candidate_s: float
    baseline_s: float
    measurements: tuple[tuple[str, float, float, float, int], ...] = ()
    unit: str = "s"
    note: str = ""
    fail_level: float = 0.99
    looks: int = 1

    def line(self, names: tuple[str, str] = ("candidate", "baseline")) -> str:
        """The verdict line: speed-up, interval, rounds, threshold."""
        per = f" x {self.iterations} calls" if self.iterations > 1 else ""
        return (f"{self.verdict.upper()}: {names[0]} {self.speedup:.3f}x {names[1]} "
                f"[{self.low:.3f}, {self.high:.3f}] ({self.level:.0%} {self.method}, "
                f"{self.rounds} rounds{per}{', ' + self.unit if self.unit != 's' else ''}, "
                f"{self.looks} look{'s' if self.looks > 1 else ''}, fail side "
                f"{self.fail_level:.1%}), "
                f"requires >= {self.threshold:g}x" + (f"; {self.note}" if self.note else ""))


def pytest_addoption(parser) -> None:
    group = parser.getgroup("torchloom perf gates")
    group.addoption("--perf-gates", choices=MODES, default=None,
                    help="what a perf gate that fails does: fail the test (default), warn, "
                         "or off (gates are skipped, nothing is timed)")
    group.addoption("--perf-inconclusive", choices=INCONCLUSIVE, default=None,
                    help="what a gate whose interval still straddles its threshold when "
                         "its budget is spent does: pass, warn (default) or fail")
    group.addoption("--perf-baseline", choices=perfbaseline.MODES, default="off",
                    help="save each gate's samples (pytest-benchmark storage, by machine "
                         "id), or compare each candidate with its last saved samples and "
                         "fail a significant slowdown beyond max_regression")
    group.addoption("--perf-max-time", type=float, default=None,
                    help="seconds one gate measurement may take (default 2)")
    parser.addini("perf_gates", "default of --perf-gates: off, warn or fail", default="fail")
    parser.addini("perf_inconclusive", "default of --perf-inconclusive: pass, warn or fail",
                  default="warn")


def pytest_configure(config) -> None:
    gate_mode(config)  # a bad ini value is a usage error before any test runs
    inconclusive_mode(config)


def gate_mode(config) -> str:
    mode = config.getoption("perf_gates") or config.getini("perf_gates") or "fail"
    if mode not in MODES:
        raise pytest.UsageError(f"perf_gates = {mode!r}: expected one of {', '.join(MODES)}")
    return mode


def inconclusive_mode(config) -> str:
    mode = (config.getoption("perf_inconclusive") or config.getini("perf_inconclusive")
            or "warn")
    if mode not in INCONCLUSIVE:
        raise pytest.UsageError(f"perf_inconclusive = {mode!r}: expected one of "
                                f"{', '.join(INCONCLUSIVE)}")
    return mode


def pytest_terminal_summary(terminalreporter) -> None:
    """Every gate's verdict line, passing or not."""
    lines = [f"{report.nodeid}: {value}"
             for reports in terminalreporter.stats.values() for report in reports
             if getattr(report, "when", None) == "call"
             for name, value in getattr(report, "user_properties", ()) if name == PROPERTY]
    if lines:
        terminalreporter.write_sep("-", "perf gates")
        for line in lines:
            terminalreporter.write_line(line)


@attrs.frozen
class GateSettings:
    """The session's choices a gate applies (from the command line and ini file)."""
    mode: str = "fail"
    inconclusive: str = "warn"
    baseline: str = "off"
    max_time: float = 2.0
    store: Any = None  # a Path: pytest-benchmark's storage folder for this machine
    gate_id: str = ""


class PerfGate:
    """Callable returned by the ``perf_gate`` fixture."""

    def __init__(self, benchmark, mode: str = "fail", *, settings: GateSettings | None = None,
                 record: Callable[[str, Any], None] | None = None):
        self.benchmark = benchmark
        self.settings = settings or GateSettings(mode=mode)
        self.mode = self.settings.mode
        self.record = record

    def measure(self, candidate: Callable, baseline: Callable, *, args: Sequence[Any] = (),
                rounds: int = 15, iterations: int | None = 1, warmup: int = 2,
                sync: Callable[[], Any] | None = None, seed: int = 0,
                min_sample: float = MIN_SAMPLE) -> Samples:
        """Paired rounds (random order per round) of both functions, no verdict:
        ``.candidate_s``, ``.baseline_s`` (medians) and ``.speedup`` (their ratio).
        ``iterations=None`` calibrates the inner loop."""
        iterations = self._warm_and_calibrate(candidate, baseline, args, warmup, iterations,
                                              sync, min_sample, time.perf_counter)
        clock = time.perf_counter
        samples = Samples((), ())
        return attrs.evolve(samples.joined(_paired(candidate, baseline, args, iterations,
                                                   sync, clock, rounds,
                                                   random.Random(seed))),
                            iterations=iterations)

    @staticmethod
    def _warm_and_calibrate(candidate, baseline, args, warmup, iterations, sync, min_sample,
                            clock) -> int:
        for _ in range(warmup):
            candidate(*args)
            baseline(*args)
        if sync is not None:
            sync()
        if iterations is None:
            return calibrate(candidate, baseline, args, sync=sync, min_sample=min_sample)
        return iterations

    def __call__(self, candidate: Callable, baseline: Callable, *, min_speedup: float,
                 args: Sequence[Any] = (), rounds: int = 15, iterations: int | None = None,
                 warmup: int = 2, sync: Callable[[], Any] | None = None,
                 names: tuple[str, str] = ("candidate", "baseline"), retries: int = 0,
                 level: float = 0.95, method: str = "hodges-lehmann",
                 max_rounds: int | None = None, max_time: float | None = None,
                 confirm: int = 2, seed: int = 0, min_sample: float = MIN_SAMPLE,
                 measure: str = "time", max_regression: float = 0.05,
                 table: bool = True, fail_level: float = 0.99,
                 confirm_level: float = 0.95, confirm_pause: float = 0.25) -> GateResult:
        """Measure, decide, record; fail (or warn, per ``--perf-gates``) on ``fail``, and
        per ``--perf-inconclusive`` on ``inconclusive``. ``table=False``: a second gate in
        the same test (pytest-benchmark's row is the first's); its result goes to
        ``extra_info["gate_<candidate>_vs_<baseline>"]``."""
        if self.mode == "off":
            pytest.skip("perf gates are off (--perf-gates=off)")
        if method not in METHODS:
            raise ValueError(f"method {method!r}: expected one of {', '.join(METHODS)}")
        spending = Spending.of(level, fail_level)
        confirming = Spending.of(level, confirm_level)
        counter, clock, unit = None, time.perf_counter, "s"
        if measure == "instructions":
            from torchloom.testing.perfcount import CountersUnavailable, open_counter
            try:
                counter = open_counter()
            except CountersUnavailable as exc:
                pytest.skip(f"instruction counts unavailable: {exc}")
            clock, unit = counter.read, "instructions"
            iterations = iterations or 1  # counts need no long samples
        elif measure != "time":
            raise ValueError(f"measure {measure!r}: expected 'time' or 'instructions'")
        try:
            iterations = self._warm_and_calibrate(candidate, baseline, args, warmup,
                                                  iterations, sync, min_sample, clock)
            budget = Budget(rounds=max(rounds, 1),
                            max_rounds=(max_rounds or MAX_ROUNDS) * (retries + 1),
                            max_time=(max_time or self.settings.max_time) * (retries + 1))
            cand = sampler(candidate, args, iterations, sync, clock)
            base = sampler(baseline, args, iterations, sync, clock)
            first = (self._pedantic_sample(candidate, args, iterations, sync)
                     if table and counter is None and self._records() else None)
            runs = confirmed(lambda i: sequential(
                cand, base, threshold=min_speedup, budget=budget,
                spending=confirming if i else spending, method=method, seed=seed + i,
                first_candidate=None if i else first),
                confirm, pause=confirm_pause)
        finally:
            if counter is not None:
                counter.close()
        result = self._result(runs, min_speedup, level, method, iterations, unit, confirm,
                              (fail_level, confirm_level))
        if first is not None:
            for run in runs:
                for s in run.samples.candidate[1 if run is runs[0] else 0:]:
                    self.benchmark.stats.update(s * iterations)
        self._report(result, names, runs, table)
        self._baseline(result, names, runs, level, max_regression)
        self._enforce(result, names)
        return result

    def _records(self) -> bool:
        return self.benchmark is not None and self.benchmark.enabled

    def _pedantic_sample(self, fn, args, iterations, sync) -> Callable[[], float]:
        """The first candidate sample, timed by pytest-benchmark (which makes the table's
        row; the gate's further samples are added to it)."""
        calls = itertools.count(1)

        def call():
            fn(*args)
            if sync is not None and next(calls) % iterations == 0:
                sync()

        def take() -> float:
            if sync is not None:
                sync()
            self.benchmark.pedantic(call, rounds=1, iterations=iterations, warmup_rounds=0)
            if sync is not None:
                sync()
            return self.benchmark.stats.stats.data[0]
        return take

    @staticmethod
    def _result(runs: list[Measurement], threshold, level, method, iterations, unit,
                confirm, fail_levels: tuple[float, float]) -> GateResult:
        samples = runs[0].samples
        for run in runs[1:]:
            samples = samples.joined(run.samples)
        iv = runs[-1].interval
        decided, note = runs[0].verdict, ""
        if decided == "fail" and any(r.verdict != "fail" for r in runs[1:]):
            decided = "inconclusive"
            note = (f"a fail not confirmed: the next measurements ended "
                    f"{', '.join(r.verdict for r in runs[1:])}")
        elif decided == "fail" and confirm:
            note = (f"confirmed by {len(runs) - 1} fresh measurement(s), their fail side at "
                    f"{fail_levels[1]:.0%} (the interval is the last one's)")
        elif decided == "inconclusive":
            note = (f"budget spent ({samples.rounds} rounds, "
                    f"{sum(r.seconds for r in runs):.1f} s)")
        return GateResult(
            decided, iv.speedup, iv.low, iv.high, samples.rounds, threshold, level, method,
            iterations, samples.candidate_s, samples.baseline_s,
            tuple((r.verdict, r.interval.speedup, r.interval.low, r.interval.high,
                   r.samples.rounds) for r in runs), unit, note, fail_levels[0], runs[-1].looks)

    def _report(self, result: GateResult, names, runs, table: bool = True) -> None:
        if self.record is not None:
            self.record(PROPERTY, result.line(names))
        if self.benchmark is None:
            return
        info = {
            "verdict": result.verdict, "speedup": result.speedup, "low": result.low,
            "high": result.high, "rounds": result.rounds, "level": result.level,
            "fail_level": result.fail_level, "looks": result.looks,
            "method": result.method, "iterations": result.iterations, "unit": result.unit,
            "min_speedup": result.threshold, "measurements": [list(m) for m in
                                                              result.measurements],
            "speedups": [m[1] for m in result.measurements],
            f"{names[0]}_median_s": result.candidate_s,
            f"{names[1]}_median_s": result.baseline_s,
            "baseline_samples": [s for r in runs for s in r.samples.baseline],
            "candidate_samples": [s for r in runs for s in r.samples.candidate]}
        if table:
            self.benchmark.extra_info.update(info)
        else:
            self.benchmark.extra_info[f"gate_{names[0]}_vs_{names[1]}"] = info

    def _baseline(self, result: GateResult, names, runs, level, max_regression) -> None:
        mode, store = self.settings.baseline, self.settings.store
        if mode == "off" or store is None:
            return
        gate = f"{self.settings.gate_id}[{names[0]}-vs-{names[1]}]"
        path = perfbaseline.gate_file(store.parent, store.name, gate)
        candidate = [s for r in runs for s in r.samples.candidate]
        if mode == "save":
            fields = {k: getattr(result, k) for k in ("verdict", "speedup", "low", "high",
                                                      "rounds", "iterations", "unit")}
            perfbaseline.save_run(path, gate, perfbaseline.run_record(
                gate, fields, candidate, [s for r in runs for s in r.samples.baseline]))
            return
        saved = perfbaseline.load_runs(path)
        if not saved:
            self._record_line(f"no saved baseline for {gate} ({path}): nothing compared")
            return
        iv, slower = perfbaseline.compare(saved[-1], candidate, level=level,
                                          max_regression=max_regression)
        line = (f"{names[0]} is {iv.speedup:.3f}x its saved run [{iv.low:.3f}, "
                f"{iv.high:.3f}] ({saved[-1].get('commit') or 'no commit'}, "
                f"{saved[-1]['datetime'][:19]}); tolerance {max_regression:.0%}")
        self._record_line(("REGRESSION: " if slower else "baseline: ") + line)
        if slower:
            self._complain(f"perf gate: {line}: a significant slowdown beyond the tolerance")

    def _record_line(self, text: str) -> None:
        if self.record is not None:
            self.record(PROPERTY, text)

    def _enforce(self, result: GateResult, names) -> None:
        if result.verdict == "pass":
            return
        message = (f"perf gate: {names[0]} is {result.speedup:.3f}x {names[1]} "
                   f"[{result.low:.3f}, {result.high:.3f}] ({result.candidate_s * 1e6:.1f} "
                   f"us vs {result.baseline_s * 1e6:.1f} us median per call); "
                   f"{result.line(names)}") if result.unit == "s" else (
                   f"perf gate: {names[0]} is {result.speedup:.3f}x {names[1]}; "
                   f"{result.line(names)}")
        if result.verdict == "fail":
            self._complain(message)
        elif self.settings.inconclusive == "warn":
            warnings.warn(PerfGateWarning(message), stacklevel=3)
        elif self.settings.inconclusive == "fail":
            pytest.fail(message + " (--perf-inconclusive=fail)", pytrace=False)

    def _complain(self, message: str) -> None:
        if self.mode == "warn":
            warnings.warn(PerfGateWarning(message), stacklevel=4)
        else:
            pytest.fail(message, pytrace=False)


def _paired(candidate, baseline, args, iterations, sync, clock, rounds, rng) -> Samples:
    from torchloom.testing.perfmeasure import paired_rounds
    return paired_rounds(sampler(candidate, args, iterations, sync, clock),
                         sampler(baseline, args, iterations, sync, clock), rounds, rng)


def _settings(config, nodeid: str) -> GateSettings:
    baseline = config.getoption("perf_baseline") or "off"
    store = None
    if baseline != "off":
        try:
            root = perfbaseline.storage_root(config.getoption("benchmark_storage", None))
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        store = root / perfbaseline.machine_id()
    max_time = config.getoption("perf_max_time") or GateSettings().max_time
    if not math.isfinite(max_time) or max_time <= 0:
        raise pytest.UsageError(f"--perf-max-time {max_time}: expected seconds > 0")
    return GateSettings(mode=gate_mode(config), inconclusive=inconclusive_mode(config),
                        baseline=baseline, max_time=max_time, store=store, gate_id=nodeid)


@pytest.fixture
def perf_gate(request) -> PerfGate:
    """Gate a candidate against a baseline: ``perf_gate(cand, base, min_speedup=1.2)``."""
    settings = _settings(request.config, request.node.nodeid)
    if settings.mode == "off":
        return PerfGate(None, settings=settings)
    if not request.config.pluginmanager.hasplugin("benchmark"):
        pytest.fail("perf gates record their timings through pytest-benchmark, which is not "
                    "installed (or disabled with -p no:benchmark): pip install "
                    "'torchloom[perfgate]'", pytrace=False)
    return PerfGate(request.getfixturevalue("benchmark"), settings=settings,
                    record=request.getfixturevalue("record_property"))
