"""Measuring for perf gates: warm-up, calibration of the inner loop, paired rounds in a
random order per round, and the sequential procedure that measures until the interval
decides or the budget is spent.

A sample is the time (or, in instruction mode, the instructions) of one call, averaged over
``iterations`` calls timed together; calibration picks ``iterations`` so the faster side's
sample lasts at least ``min_sample`` seconds (``MIN_SAMPLE``, 10 ms). That is far above the
clock's resolution (``perf_counter``: nanoseconds on Linux, ~100 ns on Windows) and, what
matters more on a loaded machine, several scheduler time slices (a few ms under Linux's
EEVDF/CFS): a sample of ~1 ms is either clean or, when preempted, several times the others;
one of 10 ms or more is interrupted a few times and averages them. Wall time, not CPU time:
a candidate may run on a device or in torch's worker threads, which a thread's CPU clock
does not see and a process's CPU clock sums over threads.

The time budget ends a measurement (``max_time``, 2 s by default in the gate); the round cap
(``MAX_ROUNDS``) only binds samples shorter than ``max_time / (2 * MAX_ROUNDS)``. A ``fail``
is confirmed by fresh measurements after a pause (:func:`confirmed`), each with its own
order of rounds, so one burst of load cannot decide them all.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from torchloom.testing.perfstats import Interval, Spending, bounds, median_ratio, verdict

#: the calibrated inner loop never exceeds this many calls
MAX_ITERATIONS = 100_000
#: default shortest sample (seconds): well above a scheduler time slice
MIN_SAMPLE = 0.01
#: default round cap of one measurement (the time budget binds first for samples >= 2.5 ms)
MAX_ROUNDS = 400
#: timings of the calibrated loop, the fastest taken (one preempted timing does not shrink it)
CALIBRATION_REPEATS = 3


@attrs.frozen
class Samples:
    """Paired per-call samples, one pair per round (candidate and baseline)."""
    candidate: tuple[float, ...]
    baseline: tuple[float, ...]
    iterations: int = 1

    @property
    def rounds(self) -> int:
        return len(self.candidate)

    @property
    def candidate_s(self) -> float:
        return statistics.median(self.candidate)

    @property
    def baseline_s(self) -> float:
        return statistics.median(self.baseline)

    @property
    def speedup(self) -> float:
        """Median baseline / median candidate (what the gate before issue 44 gated)."""
        return median_ratio(self.candidate, self.baseline)

    def joined(self, other: Samples) -> Samples:
        return Samples(self.candidate + other.candidate, self.baseline + other.baseline,
                       self.iterations)


def sampler(fn: Callable, args: Sequence[Any], iterations: int,
            sync: Callable[[], Any] | None, clock: Callable[[], float]) -> Callable[[], float]:
    """A function that runs ``fn(*args)`` ``iterations`` times and returns the clock's
    advance per call (a device's queue drained before and after when ``sync``)."""
    def sample() -> float:
        if sync is not None:
            sync()
        start = clock()
        for _ in range(iterations):
            fn(*args)
        if sync is not None:
            sync()
        return (clock() - start) / iterations
    return sample


def calibrate(candidate: Callable, baseline: Callable, args: Sequence[Any], *,
              sync: Callable[[], Any] | None, min_sample: float = MIN_SAMPLE,
              clock: Callable[[], float] = time.perf_counter) -> int:
    """Calls per sample so one sample of the faster side lasts ``min_sample`` seconds: the
    loop doubles until it lasts a tenth of a sample, is timed ``CALIBRATION_REPEATS`` times
    (the fastest per call kept: interruptions only add time), then scaled."""
    resolution = time.get_clock_info("perf_counter").resolution
    n = 1
    while True:
        once = min(sampler(fn, args, n, sync, clock)() for fn in (candidate, baseline))
        if once * n >= min_sample / 10 or n >= MAX_ITERATIONS:
            break
        n *= 2
    once = min([once] + [sampler(fn, args, n, sync, clock)()
                         for _ in range(CALIBRATION_REPEATS - 1)
                         for fn in (candidate, baseline)])
    if once >= min_sample:
        return 1
    return min(MAX_ITERATIONS, math.ceil(min_sample / max(once, resolution)))


def paired_rounds(candidate: Callable[[], float], baseline: Callable[[], float], rounds: int,
                  rng: random.Random,
                  first_candidate: Callable[[], float] | None = None) -> Samples:
    """``rounds`` rounds, each timing both samplers once in an order drawn from ``rng``.
    ``first_candidate``, when given, takes the first round's candidate sample (the gate
    lets pytest-benchmark time that one, so its table holds the gate's own samples)."""
    cand: list[float] = []
    base: list[float] = []
    for r in range(rounds):
        take = first_candidate if (r == 0 and first_candidate is not None) else candidate
        if rng.random() < 0.5:
            cand.append(take())
            base.append(baseline())
        else:
            base.append(baseline())
            cand.append(take())
    return Samples(tuple(cand), tuple(base))


@attrs.frozen
class Budget:
    """Where a sequential measurement starts and stops: the first look after ``rounds``,
    then a look each time the rounds grow by half, until ``max_time`` seconds of measuring
    have passed at a look with rounds enough to bound a side of the interval (samples of
    a second still get the rounds a verdict needs), or ``max_rounds`` rounds (a cap for
    very short samples, whose Walsh averages grow with the square of the rounds)."""
    rounds: int
    max_rounds: int
    max_time: float

    def next_look(self, done: int) -> int:
        if done == 0:
            return min(self.rounds, self.max_rounds)
        return min(self.max_rounds, max(done + 1, math.ceil(done * 1.5)))


@attrs.frozen
class Measurement:
    """One sequential measurement: its rounds, the interval of its last look (each side at
    that look's spent rate) and what that look decided."""
    samples: Samples
    interval: Interval
    verdict: str
    seconds: float
    looks: int = 1


def sequential(candidate: Callable[[], float], baseline: Callable[[], float], *,
               threshold: float, budget: Budget, spending: Spending, method: str, seed: int,
               first_candidate: Callable[[], float] | None = None,
               wall: Callable[[], float] = time.monotonic) -> Measurement:
    """Measure in paired rounds until the interval of a look is all above or all below
    ``threshold``, or the budget is spent (then ``inconclusive``). Each side of a look's
    interval is at ``spending.tails(k)``, ``k`` counting that side's looks with enough
    rounds to bound it (a look that cannot reject spends nothing), so the looks together
    keep the measurement's error rates at ``spending``'s."""
    rng = random.Random(seed)
    start = wall()
    samples = Samples((), ())
    looks, pass_look, fail_look, spent, bounded = 0, 1, 1, 0.0, (False, False)
    while True:
        more = budget.next_look(samples.rounds) - samples.rounds
        fit = (budget.max_time - spent) * samples.rounds / max(spent, 1e-9)
        if any(bounded) and fit < more:  # the last look gets the rounds the time left fits
            more = max(1, math.ceil(fit))
        samples = samples.joined(paired_rounds(
            candidate, baseline, more, rng,
            first_candidate if samples.rounds == 0 else None))
        looks += 1
        iv = bounds(samples.candidate, samples.baseline,
                    low_tail=spending.tails(pass_look)[0],
                    high_tail=spending.tails(fail_look)[1], method=method, seed=seed)
        # a side left unbounded (too few rounds for its rate) could not err at this look:
        # it spent nothing, and its next look keeps the same rate
        bounded = (iv.low > 0, math.isfinite(iv.high))
        pass_look += bounded[0]
        fail_look += bounded[1]
        decided = verdict(iv, threshold)
        spent = wall() - start
        # time ends a measurement only at a look that could have decided (slow samples)
        if (decided != "inconclusive" or samples.rounds >= budget.max_rounds
                or (spent >= budget.max_time and any(bounded))):
            return Measurement(samples, iv, decided, spent, looks)


def confirmed(measure: Callable[[int], Measurement], confirm: int, *, pause: float,
              sleep: Callable[[float], Any] = time.sleep) -> list[Measurement]:
    """``measure(0)``, then while the latest ended ``fail``, up to ``confirm`` fresh ones
    (``measure(i)``: its own seed, so its own order of rounds), each after ``pause``
    seconds without load of ours, so a burst that decided one need not decide the next."""
    runs = [measure(0)]
    while runs[-1].verdict == "fail" and len(runs) <= confirm:
        sleep(pause)
        runs.append(measure(len(runs)))
    return runs
