"""The perf gates' statistics (core/torchloom/testing/perfstats.py) and sequential
measurement (perfmeasure.py), on synthetic samples and fake clocks: no timing."""

from __future__ import annotations

import math
import random

import pytest

from torchloom.testing.perfmeasure import Budget, sequential
from torchloom.testing.perfstats import (_signed_rank_critical, interval, median_ratio,
                                         shift_interval, verdict)


def test_signed_rank_critical_values_match_the_tables():
    # two-sided 5 %: n=6 rejects only T=0, n=10 rejects T <= 8, n=20 rejects T <= 52
    assert _signed_rank_critical(6, 0.025) == 1
    assert _signed_rank_critical(10, 0.025) == 9
    assert _signed_rank_critical(20, 0.025) == 53
    assert _signed_rank_critical(5, 0.025) == 0  # too few rounds for 95 %


def test_hodges_lehmann_interval_brackets_a_known_ratio():
    rng = random.Random(3)
    base = [1.0 + rng.random() * 0.1 for _ in range(30)]
    cand = [b / 2 * (1 + rng.gauss(0, 0.02)) for b in base]
    iv = interval(cand, base)
    assert iv.low < 2.0 < iv.high and iv.high - iv.low < 0.05
    assert iv.low <= iv.speedup <= iv.high and iv.method == "hodges-lehmann"


def test_too_few_rounds_give_an_unbounded_interval():
    iv = interval([1.0] * 5, [2.0] * 5)
    assert (iv.low, iv.high) == (0.0, math.inf) and verdict(iv, 1.0) == "inconclusive"


def test_bootstrap_is_reproducible_with_its_seed():
    rng = random.Random(1)
    cand = [1 + rng.random() for _ in range(25)]
    base = [c * 1.3 * (1 + rng.gauss(0, 0.05)) for c in cand]
    a = interval(cand, base, method="bootstrap", seed=7)
    assert a == interval(cand, base, method="bootstrap", seed=7)
    assert a.low < 1.3 < a.high and a.method == "bootstrap"
    with pytest.raises(ValueError, match="method 'magic'"):
        interval(cand, base, method="magic")


def test_verdicts():
    from torchloom.testing.perfstats import Interval
    assert verdict(Interval(1.2, 1.1, 1.3, 0.95, "x"), 1.1) == "pass"
    assert verdict(Interval(0.9, 0.8, 0.99, 0.95, "x"), 1.0) == "fail"
    assert verdict(Interval(1.0, 0.95, 1.05, 0.95, "x"), 1.0) == "inconclusive"


def test_shift_interval_sees_a_slowdown_between_runs():
    rng = random.Random(2)
    old = [1 + rng.random() * 0.05 for _ in range(20)]
    new = [1.2 * (1 + rng.random() * 0.05) for _ in range(20)]
    iv = shift_interval(old, new)
    assert iv.high < 1 / 1.05 and iv.low < 1 / 1.2 < iv.high
    assert median_ratio([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]) == 2.0


def _fake(ratio, noise, rng):
    """Samplers of a candidate ``ratio`` times faster than its baseline."""
    return (lambda: (1 + rng.random() * noise) / ratio), (lambda: 1 + rng.random() * noise)


def test_sequential_stops_at_the_first_conclusive_look():
    rng = random.Random(0)
    cand, base = _fake(1.5, 0.1, rng)
    m = sequential(cand, base, threshold=1.0, budget=Budget(8, 200, 60.0), level=0.95,
                   method="hodges-lehmann", seed=0)
    assert m.verdict == "pass" and m.samples.rounds == 8


def test_sequential_ends_inconclusive_when_the_budget_is_spent():
    rng = random.Random(0)
    cand, base = _fake(1.0, 0.1, rng)
    m = sequential(cand, base, threshold=1.0, budget=Budget(6, 40, 60.0), level=0.9999,
                   method="hodges-lehmann", seed=0)
    assert m.verdict == "inconclusive" and m.samples.rounds == 40
    looks = [0]
    while looks[-1] < 40:
        looks.append(Budget(6, 40, 60.0).next_look(looks[-1]))
    assert looks == [0, 6, 9, 14, 21, 32, 40]


def test_sequential_stops_when_time_runs_out():
    rng = random.Random(0)
    cand, base = _fake(1.0, 0.1, rng)
    ticks = iter(range(1000))
    m = sequential(cand, base, threshold=1.0, budget=Budget(6, 10_000, 1.5), level=0.9999,
                   method="hodges-lehmann", seed=0, wall=lambda: next(ticks))
    assert m.verdict == "inconclusive" and m.samples.rounds == 9  # two looks, then 2 "s"
