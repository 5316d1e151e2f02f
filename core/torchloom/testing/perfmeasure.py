"""Measuring for perf gates: warm-up, calibration of the inner loop, paired rounds in a
random order per round, and the sequential procedure that measures until the interval
decides or the budget is spent.

A sample is the time (or, in instruction mode, the instructions) of one call, averaged over
``iterations`` calls timed together; calibration picks ``iterations`` so the faster side's
sample lasts at least ``min_sample`` seconds, far above the clock's resolution.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from torchloom.testing.perfstats import Interval, interval, median_ratio, verdict

#: the calibrated inner loop never exceeds this many calls
MAX_ITERATIONS = 100_000


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
              sync: Callable[[], Any] | None, min_sample: float,
              clock: Callable[[], float] = time.perf_counter) -> int:
    """Calls per sample so one sample of the faster side lasts ``min_sample`` seconds."""
    resolution = time.get_clock_info("perf_counter").resolution
    n = 1
    while True:  # double the loop until it lasts a tenth of a sample, then scale it
        once = min(sampler(fn, args, n, sync, clock)() for fn in (candidate, baseline))
        if once * n >= min_sample / 10 or n >= MAX_ITERATIONS:
            break
        n *= 2
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
    then a look each time the rounds grow by half, until ``max_rounds`` rounds or
    ``max_time`` seconds of measuring."""
    rounds: int
    max_rounds: int
    max_time: float

    def next_look(self, done: int) -> int:
        if done == 0:
            return min(self.rounds, self.max_rounds)
        return min(self.max_rounds, max(done + 1, math.ceil(done * 1.5)))


@attrs.frozen
class Measurement:
    samples: Samples
    interval: Interval
    verdict: str
    seconds: float


def sequential(candidate: Callable[[], float], baseline: Callable[[], float], *,
               threshold: float, budget: Budget, level: float, method: str, seed: int,
               first_candidate: Callable[[], float] | None = None,
               wall: Callable[[], float] = time.monotonic) -> Measurement:
    """Measure in paired rounds until the interval is all above or all below
    ``threshold``, or the budget is spent (then ``inconclusive``)."""
    rng = random.Random(seed)
    start = wall()
    samples = Samples((), ())
    while True:
        more = budget.next_look(samples.rounds) - samples.rounds
        samples = samples.joined(paired_rounds(
            candidate, baseline, more, rng,
            first_candidate if samples.rounds == 0 else None))
        iv = interval(samples.candidate, samples.baseline, level=level, method=method,
                      seed=seed)
        decided = verdict(iv, threshold)
        spent = wall() - start
        if (decided != "inconclusive" or samples.rounds >= budget.max_rounds
                or spent >= budget.max_time):
            return Measurement(samples, iv, decided, spent)
