"""The perf gates' statistics (core/torchloom/testing/perfstats.py) and sequential
measurement (perfmeasure.py), on synthetic samples and fake clocks: no timing."""

from __future__ import annotations

import math
import random

import pytest

from torchloom.testing.perfmeasure import Budget, calibrate, sequential
from torchloom.testing.perfstats import (Spending, _signed_rank_critical, bounds, interval,
                                         median_ratio, shift_interval, verdict)


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
    m = sequential(cand, base, threshold=1.0, budget=Budget(8, 200, 60.0),
                   spending=Spending(), method="hodges-lehmann", seed=0)
    assert m.verdict == "pass" and m.samples.rounds == 8


def test_sequential_ends_inconclusive_when_the_budget_is_spent():
    rng = random.Random(0)
    cand, base = _fake(1.0, 0.1, rng)
    m = sequential(cand, base, threshold=1.0, budget=Budget(6, 40, 60.0),
                   spending=Spending.of(0.9999, 0.9999), method="hodges-lehmann", seed=0)
    assert m.verdict == "inconclusive" and m.samples.rounds == 40
    looks = [0]
    while looks[-1] < 40:
        looks.append(Budget(6, 40, 60.0).next_look(looks[-1]))
    assert looks == [0, 6, 9, 14, 21, 32, 40]


def test_sequential_stops_when_time_runs_out_at_a_look_that_could_decide():
    rng = random.Random(0)
    cand, base = _fake(1.0, 0.1, rng)
    ticks = iter(range(1000))  # each look takes a "second"
    m = sequential(cand, base, threshold=1.0, budget=Budget(6, 10_000, 1.5),
                   spending=Spending(), method="hodges-lehmann", seed=0,
                   wall=lambda: next(ticks))
    assert m.verdict == "inconclusive" and m.samples.rounds == 9  # two looks, then 2 "s"
    # half a second of budget: the first look (6 rounds) bounds no side at the first
    # look's rates (2^-6 > 0.0152), so the second (9 rounds) ends it
    ticks = iter(range(1000))
    m = sequential(cand, base, threshold=1.0, budget=Budget(6, 10_000, 0.5),
                   spending=Spending(), method="hodges-lehmann", seed=0,
                   wall=lambda: next(ticks))
    assert m.samples.rounds == 9 and m.looks == 2 and 0 < m.interval.low < 1


def test_spending_sums_to_its_rates_over_any_number_of_looks():
    spending = Spending.of(0.95, 0.995)
    assert (spending.pass_tail, spending.fail_tail) == pytest.approx((0.025, 0.005))
    assert spending.tails(1) == pytest.approx((0.025 * 6 / math.pi ** 2,
                                               0.005 * 6 / math.pi ** 2))
    spent = [spending.tails(k) for k in range(1, 100_001)]
    assert 0.02499 < sum(p for p, _ in spent) <= 0.025
    assert 0.004999 < sum(f for _, f in spent) <= 0.005
    assert spending.tails(2)[1] == pytest.approx(spending.tails(1)[1] / 4)
    for bad in (lambda: spending.tails(0), lambda: Spending.of(0.4, 0.99),
                lambda: Spending(fail_tail=0.0)):
        with pytest.raises(ValueError):
            bad()


def test_bounds_put_each_side_at_its_own_rate():
    rng = random.Random(4)
    base = [1.0 + rng.random() * 0.1 for _ in range(30)]
    cand = [b / 1.2 * math.exp(rng.gauss(0, 0.05)) for b in base]
    plain = interval(cand, base, level=0.95)
    strict = bounds(cand, base, low_tail=0.025, high_tail=0.0005)
    assert strict.low == plain.low and strict.speedup == plain.speedup
    assert strict.high > plain.high and strict.level == pytest.approx(1 - 0.0255)
    # too few rounds for the fail side's rate (2^-9 > 0.001): that side is unbounded
    few = bounds(cand[:9], base[:9], low_tail=0.025, high_tail=0.001)
    assert few.high == math.inf and 1.0 < few.low < 1.2
    boot = bounds(cand, base, low_tail=0.025, high_tail=0.0005, method="bootstrap")
    assert boot.low < 1.2 < boot.high


def test_calibration_keeps_the_fastest_of_repeated_timings():
    """Each call advances a fake clock by 100 us; both sides' timings of the loop that
    ends the doubling (16 calls) are interrupted by 50 ms, as a preempted sample would be:
    the repeats still find 100 calls per 10 ms sample."""
    calls, reads = [0], [0]

    def fn():
        calls[0] += 1

    def clock():
        reads[0] += 1
        return calls[0] * 1e-4 + (0.05 if reads[0] >= 18 else 0) + (
            0.05 if reads[0] >= 20 else 0)
    assert calibrate(fn, fn, (), sync=None, min_sample=0.01, clock=clock) in (100, 101)


def test_a_look_with_too_few_rounds_to_decide_spends_nothing():
    """5 rounds cannot bound either side at the first look's rates (2^-5 > 0.0152): the
    second look (8 rounds) still tests at the first look's rates, and passes."""
    rng = random.Random(0)
    cand, base = _fake(1.5, 0.1, rng)
    spending = Spending()
    m = sequential(cand, base, threshold=1.0, budget=Budget(5, 200, 60.0),
                   spending=spending, method="hodges-lehmann", seed=0)
    assert m.verdict == "pass" and m.samples.rounds == 8 and m.looks == 2
    low_tail, high_tail = spending.tails(1)
    assert m.interval == bounds(m.samples.candidate, m.samples.baseline, low_tail=low_tail,
                                high_tail=high_tail)


def test_the_last_look_takes_only_the_rounds_the_time_left_fits():
    """A round costs 0.1 "s" of a 1 s budget: the looks at 6 and 9 rounds, then one more
    round (not the 5 of the schedule) ends the measurement on time."""
    taken = [0]

    def side():
        taken[0] += 1
        return 1.0 + (taken[0] % 7) * 0.01
    m = sequential(side, side, threshold=1.0, budget=Budget(6, 10_000, 1.0),
                   spending=Spending(), method="hodges-lehmann", seed=0,
                   wall=lambda: taken[0] * 0.05)
    assert m.samples.rounds == 10 and m.looks == 3 and m.seconds == pytest.approx(1.0)
