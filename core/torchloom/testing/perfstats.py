"""Statistics of perf gates: a speed-up and its confidence interval from paired rounds,
the verdict a gate draws from them, and the two-sample interval a baseline comparison uses.

A round times the candidate and the baseline once each, in an order drawn at random, so
under "no difference" the log-ratio ``log(baseline / candidate)`` of a round is as likely
positive as negative: the Wilcoxon signed-rank test holds without assuming any shape of the
machine's noise, and its Hodges-Lehmann estimate (the median of the Walsh averages of the
log-ratios) with the interval that inverts the test is the default. ``bootstrap`` resamples
whole rounds (pairs) with a seeded generator, so the same samples give the same interval.

Heavy tails: a sample interrupted by the scheduler is several times the others, but its
log-ratio only takes the highest rank, with a sign that the round's random order makes a
coin flip under "no difference"; the test stays exact (conditionally on the magnitudes)
however heavy the tails, and the interval only widens. Nothing is trimmed: trimming pairs
by size would break that exactness.

A gate looks at its interval many times (:mod:`perfmeasure`), and a 95 % interval looked at
after every few rounds fails an identical candidate far more often than 2.5 % of the time.
:class:`Spending` corrects for it with alpha spending over an unbounded number of looks:
look ``k`` (1, 2, ...) tests each side at ``tail * 6 / (pi^2 k^2)``, whose sum over all
looks is ``tail``, so the error rate of a whole measurement is bounded whatever the number
of looks (the time budget, not a fixed schedule, may end it). The two sides get different
rates: ``pass`` (low end) at ``(1 - level) / 2``, ``fail`` (high end) at the stricter
``1 - fail_level`` (1 % by default, for a gate's first measurement), since a false ``fail``
costs a red build.
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


@attrs.frozen
class Spending:
    """Error rates of one sequential measurement, spent over its looks: ``pass_tail`` the
    chance of passing a candidate whose true speed-up is below the threshold, ``fail_tail``
    of failing one at or above it."""
    pass_tail: float = 0.025
    fail_tail: float = 0.01

    def __attrs_post_init__(self) -> None:
        for name in ("pass_tail", "fail_tail"):
            if not 0 < getattr(self, name) < 0.5:
                raise ValueError(f"{name} {getattr(self, name)}: expected an error rate "
                                 f"between 0 and 0.5")

    @classmethod
    def of(cls, level: float, fail_level: float) -> Spending:
        """From two-sided ``level`` (the pass side gets half its error) and the one-sided
        ``fail_level``."""
        for name, value in (("level", level), ("fail_level", fail_level)):
            if not 0.5 < value < 1:
                raise ValueError(f"{name} {value}: expected a confidence level between "
                                 f"0.5 and 1")
        return cls((1 - level) / 2, 1 - fail_level)

    def tails(self, look: int) -> tuple[float, float]:
        """(pass side, fail side) error rates of look ``look`` (from 1): they sum, over
        every look, to ``pass_tail`` and ``fail_tail`` (sum of 1/k^2 is pi^2/6)."""
        if look < 1:
            raise ValueError(f"look {look}: looks count from 1")
        share = 6 / (math.pi ** 2 * look ** 2)
        return self.pass_tail * share, self.fail_tail * share


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
    """Speed-up of the candidate over the baseline from paired per-round times, with its
    two-sided ``level`` interval."""
    if not 0 < level < 1:
        raise ValueError(f"level {level}: expected a confidence level between 0 and 1")
    return bounds(candidate, baseline, low_tail=(1 - level) / 2, high_tail=(1 - level) / 2,
                  method=method, seed=seed, resamples=resamples)


def bounds(candidate: Sequence[float], baseline: Sequence[float], *, low_tail: float,
           high_tail: float, method: str = "hodges-lehmann", seed: int = 0,
           resamples: int = 2000) -> Interval:
    """The speed-up with a low end that errs (is above the true speed-up) with probability
    ``low_tail`` and a high end that errs with ``high_tail``: the interval a gate's look
    decides from, its two sides at the two rates of :meth:`Spending.tails`."""
    d = log_ratios(candidate, baseline)
    if not d:
        raise ValueError("no rounds to compute a speed-up from")
    if method == "hodges-lehmann":
        center, low, high = _signed_rank_interval(d, low_tail, high_tail)
    elif method == "bootstrap":
        center, low, high = _bootstrap_interval(d, low_tail, high_tail, seed, resamples)
    else:
        raise ValueError(f"method {method!r}: expected one of {', '.join(METHODS)}")
    return Interval(math.exp(center), math.exp(low), math.exp(high),
                    1 - low_tail - high_tail, method)


def _walsh_averages(d: Sequence[float]) -> list[float]:
    n = len(d)
    return sorted((d[i] + d[j]) / 2 for i in range(n) for j in range(i, n))


def _signed_rank_interval(d: Sequence[float], low_tail: float,
                          high_tail: float) -> tuple[float, float, float]:
    walsh = _walsh_averages(d)
    center = statistics.median(walsh)
    lo, hi = _signed_rank_criticals(len(d), (low_tail, high_tail))
    # too few rounds for a side's rate: that side is unbounded
    return (center, walsh[lo - 1] if lo >= 1 else -math.inf,
            walsh[len(walsh) - hi] if hi >= 1 else math.inf)


def _signed_rank_critical(n: int, tail: float) -> int:
    """The largest k with P(T <= k - 1) <= tail, T the signed-rank statistic of n rounds
    under "no difference": the k-th smallest and largest Walsh averages bound the
    interval."""
    return _signed_rank_criticals(n, (tail,))[0]


def _signed_rank_criticals(n: int, tails: Sequence[float]) -> list[int]:
    """:func:`_signed_rank_critical` for several tails (below 1/2) of the same n."""
    total = n * (n + 1) // 2
    if n > _EXACT_UP_TO:
        sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
        return [max(0, int(math.floor(total / 2 - NormalDist().inv_cdf(1 - tail) * sd)))
                for tail in tails]
    half = total // 2 + 1  # the tails below 1/2 end below the middle
    counts = [1] + [0] * half  # counts[t]: subsets of ranks 1..n summing to t
    for rank in range(1, n + 1):
        counts = counts[:rank] + [a + b for a, b in zip(counts[rank:], counts)]
    ks = []
    for tail in tails:
        cumulative, k, limit = 0, 0, tail * 2 ** n
        for t, count in enumerate(counts):
            cumulative += count
            if cumulative > limit:
                break
            k = t + 1
        ks.append(k)
    return ks


def _bootstrap_interval(d: Sequence[float], low_tail: float, high_tail: float, seed: int,
                        resamples: int) -> tuple[float, float, float]:
    """Percentiles of resampled medians; a tail below 1 / resamples takes the extreme
    resample (the bootstrap cannot resolve smaller rates: prefer hodges-lehmann)."""
    rng = random.Random(seed)
    n = len(d)
    medians = sorted(statistics.median(rng.choices(d, k=n)) for _ in range(resamples))
    low = medians[int(math.floor(low_tail * (resamples - 1)))]
    high = medians[int(math.ceil((1 - high_tail) * (resamples - 1)))]
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
