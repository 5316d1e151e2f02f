"""Statistics of perf gates: a speed-up and its confidence interval from paired rounds,
the verdict a gate draws from them, and the two-sample interval a baseline comparison uses.

A round times the candidate and the baseline once each, in an order drawn at random, so
under "no difference" the log-ratio ``log(baseline / candidate)`` of a round is as likely
positive as negative: the Wilcoxon signed-rank test holds without assuming any shape of the
machine's noise, and its Hodges-Lehmann estimate (the median of the Walsh averages of the
log-ratios) with the interval that inverts the test is the default. ``bootstrap`` resamples
whole rounds (pairs) with a seeded generator, so the same samples give the same interval.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from statistics import NormalDist

import attrs

METHODS = ("hodges-lehmann", "bootstrap")
VERDICTS = ("pass", "fail", "inconclusive")
#: exact signed-rank distribution up to this many rounds, the normal approximation above
_EXACT_UP_TO = 60


@attrs.frozen
class Interval:
    """``speedup`` (baseline time / candidate time) and its ``level`` interval."""
    speedup: float
    low: float
    high: float
    level: float
    method: str


def verdict(iv: Interval, threshold: float) -> str:
    """``pass`` when the whole interval is at or above the threshold, ``fail`` when it is
    all below, else ``inconclusive``."""
    if iv.low >= threshold:
        return "pass"
    if iv.high < threshold:
        return "fail"
    return "inconclusive"


def log_ratios(candidate: Sequence[float], baseline: Sequence[float]) -> list[float]:
    if len(candidate) != len(baseline):
        raise ValueError(f"paired samples differ in length: {len(candidate)} candidate, "
                         f"{len(baseline)} baseline")
    return [math.log(b / c) for c, b in zip(candidate, baseline)]


def interval(candidate: Sequence[float], baseline: Sequence[float], *, level: float = 0.95,
             method: str = "hodges-lehmann", seed: int = 0, resamples: int = 2000) -> Interval:
    """Speed-up of the candidate over the baseline from paired per-round times."""
    if not 0 < level < 1:
        raise ValueError(f"level {level}: expected a confidence level between 0 and 1")
    d = log_ratios(candidate, baseline)
    if not d:
        raise ValueError("no rounds to compute a speed-up from")
    if method == "hodges-lehmann":
        center, low, high = _signed_rank_interval(d, level)
    elif method == "bootstrap":
        center, low, high = _bootstrap_interval(d, level, seed, resamples)
    else:
        raise ValueError(f"method {method!r}: expected one of {', '.join(METHODS)}")
    return Interval(math.exp(center), math.exp(low), math.exp(high), level, method)


def _walsh_averages(d: Sequence[float]) -> list[float]:
    n = len(d)
    return sorted((d[i] + d[j]) / 2 for i in range(n) for j in range(i, n))


def _signed_rank_interval(d: Sequence[float], level: float) -> tuple[float, float, float]:
    walsh = _walsh_averages(d)
    center = statistics.median(walsh)
    k = _signed_rank_critical(len(d), (1 - level) / 2)
    if k < 1:  # too few rounds for this level: the interval is everything
        return center, -math.inf, math.inf
    return center, walsh[k - 1], walsh[len(walsh) - k]


def _signed_rank_critical(n: int, tail: float) -> int:
    """The largest k with P(T <= k - 1) <= tail, T the signed-rank statistic of n rounds
    under "no difference": the k-th smallest and largest Walsh averages bound the
    interval."""
    total = n * (n + 1) // 2
    if n > _EXACT_UP_TO:
        sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
        return max(0, int(math.floor(total / 2 - NormalDist().inv_cdf(1 - tail) * sd)))
    counts = [1] + [0] * total  # counts[t]: subsets of ranks 1..n summing to t
    for rank in range(1, n + 1):
        for t in range(total, rank - 1, -1):
            counts[t] += counts[t - rank]
    cumulative, k, scale = 0, 0, 2 ** n
    for t in range(total + 1):
        cumulative += counts[t]
        if cumulative / scale > tail:
            break
        k = t + 1
    return k


def _bootstrap_interval(d: Sequence[float], level: float, seed: int,
                        resamples: int) -> tuple[float, float, float]:
    rng = random.Random(seed)
    n = len(d)
    medians = sorted(statistics.median(rng.choices(d, k=n)) for _ in range(resamples))
    tail = (1 - level) / 2
    low = medians[int(math.floor(tail * (resamples - 1)))]
    high = medians[int(math.ceil((1 - tail) * (resamples - 1)))]
    return statistics.median(d), low, high


def shift_interval(old: Sequence[float], new: Sequence[float], *,
                   level: float = 0.95) -> Interval:
    """Speed of ``new`` relative to ``old`` (old time / new time; below 1 is a slowdown)
    from two independent samples: the two-sample Hodges-Lehmann estimate of the shift in
    log time, with the interval that inverts the Mann-Whitney test (normal approximation
    to its distribution)."""
    if not old or not new:
        raise ValueError("a baseline comparison needs samples on both sides")
    lo, ln = [math.log(x) for x in old], [math.log(x) for x in new]
    diffs = sorted(a - b for a in lo for b in ln)
    m, n = len(lo), len(ln)
    center = statistics.median(diffs)
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    k = int(math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12)))
    if k < 1:
        return Interval(math.exp(center), 0.0, math.inf, level, "mann-whitney")
    return Interval(math.exp(center), math.exp(diffs[k - 1]), math.exp(diffs[len(diffs) - k]),
                    level, "mann-whitney")


def median_ratio(candidate: Sequence[float], baseline: Sequence[float]) -> float:
    """The old gate's figure: median baseline time / median candidate time."""
    c = statistics.median(candidate)
    return statistics.median(baseline) / c if c > 0 else math.inf
