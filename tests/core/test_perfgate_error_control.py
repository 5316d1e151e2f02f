"""The perf gate's error control on synthetic samples with heavy-tailed noise (seeded, no
timing): the Hodges-Lehmann interval's coverage, false fails under many looks with and
without alpha spending, confirmations with pauses, and the issue-44 scenarios (identical,
1.3x slower, 1.05x faster, gated at 1.0) with the gate's default rates."""

from __future__ import annotations

import math
import random

from torchloom.testing.perfmeasure import Budget, Measurement, confirmed, sequential
from torchloom.testing.perfstats import Spending, bounds, interval, verdict


def heavy(ratio: float, rng: random.Random, *, sigma: float = 0.08, hit: float = 0.2,
          additive: bool = True):
    """Samplers of a candidate ``ratio`` times faster than its baseline (true times
    1/ratio and 1), each sample with lognormal jitter and, with probability ``hit``, an
    interruption: added time of mean 0.5 (a preempted sample; ``additive``), or a
    multiplicative factor exp(Exp(1)) (the noise is then the same for both sides)."""
    def sample(true: float) -> float:
        t = true * math.exp(rng.gauss(0, sigma))
        if rng.random() < hit:
            t = t + rng.expovariate(2.0) if additive else t * math.exp(rng.expovariate(1.0))
        return t
    return (lambda: sample(1 / ratio)), (lambda: sample(1.0))


def test_hodges_lehmann_interval_covers_under_heavy_tailed_noise():
    rng = random.Random(11)
    covered = 0
    for _ in range(300):
        cand, base = heavy(1.3, rng, additive=False)
        c, b = zip(*[(cand(), base()) for _ in range(30)])
        iv = interval(c, b, level=0.95)
        covered += iv.low <= 1.3 <= iv.high
    assert covered >= 0.92 * 300  # nominal 95 %; 300 runs: binomial sd ~1.3 %


def _false_fails(looks_corrected: bool, rng: random.Random, runs: int = 300) -> int:
    """Identical sides, looks at 6, 9, 14, ... 60 rounds, a fail side of 5 %."""
    spending = Spending(pass_tail=0.05, fail_tail=0.05)
    fails = 0
    for _ in range(runs):
        cand, base = heavy(1.0, rng)
        if looks_corrected:
            m = sequential(cand, base, threshold=1.0, budget=Budget(6, 60, math.inf),
                           spending=spending, method="hodges-lehmann", seed=rng.random())
            fails += m.verdict == "fail"
            continue
        c: list[float] = []
        b: list[float] = []
        while len(c) < 60:  # the same looks, each at the uncorrected 5 %
            more = Budget(6, 60, math.inf).next_look(len(c)) - len(c)
            for _ in range(more):  # iid synthetic noise: the order within a round is moot
                c.append(cand())
                b.append(base())
            decided = verdict(bounds(c, b, low_tail=0.05, high_tail=0.05), 1.0)
            if decided != "inconclusive":
                fails += decided == "fail"
                break
    return fails


def test_alpha_spending_keeps_false_fails_at_the_rate_where_looks_compound():
    corrected = _false_fails(True, random.Random(5))
    uncorrected = _false_fails(False, random.Random(5))
    assert corrected <= 0.08 * 300  # spent 5 %: binomial sd ~1.3 %
    assert uncorrected > 0.08 * 300 and uncorrected > 2 * corrected


def _gate(ratio: float, rng: random.Random, sleeps: list[float]) -> list[Measurement]:
    """As the gate decides: the first measurement's fail side at 99 %, confirmations' at
    95 %, each spent over its looks."""
    cand, base = heavy(ratio, rng)
    return confirmed(lambda i: sequential(
        cand, base, threshold=1.0, budget=Budget(15, 100, math.inf),
        spending=Spending.of(0.95, 0.95 if i else 0.99), method="hodges-lehmann",
        seed=rng.random()), 2, pause=0.25, sleep=sleeps.append)


def test_the_issue_scenarios_on_heavy_tailed_noise():
    rng = random.Random(7)
    outcomes = {}
    for name, ratio in (("identical", 1.0), ("1.3x slower", 1 / 1.3),
                        ("1.05x faster", 1.05)):
        ends = []
        for _ in range(100):
            runs = _gate(ratio, rng, [])
            ends.append("fail" if all(r.verdict == "fail" for r in runs) else
                        runs[-1].verdict)
        outcomes[name] = ends
    assert outcomes["1.3x slower"].count("fail") == 100, outcomes["1.3x slower"]
    assert "fail" not in outcomes["identical"] and "fail" not in outcomes["1.05x faster"]
    # within 100 rounds most 1.05x candidates pass, the rest end inconclusive (honestly)
    assert outcomes["1.05x faster"].count("pass") >= 20


def test_a_fail_is_confirmed_by_fresh_measurements_after_pauses():
    def fake(verdicts):
        return lambda i: Measurement(None, None, verdicts[i], 0.0)
    sleeps: list[float] = []
    runs = confirmed(fake(["fail", "fail", "fail", "fail"]), 2, pause=0.25,
                     sleep=sleeps.append)
    assert [r.verdict for r in runs] == ["fail"] * 3 and sleeps == [0.25, 0.25]
    sleeps.clear()
    runs = confirmed(fake(["fail", "inconclusive", "fail"]), 2, pause=0.5, sleep=sleeps.append)
    assert [r.verdict for r in runs] == ["fail", "inconclusive"] and sleeps == [0.5]
    sleeps.clear()
    assert len(confirmed(fake(["pass"]), 2, pause=1, sleep=sleeps.append)) == 1 and not sleeps
    assert len(confirmed(fake(["fail"]), 0, pause=1, sleep=sleeps.append)) == 1 and not sleeps
