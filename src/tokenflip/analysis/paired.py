"""A comparison against its noise floor, prompt by prompt. Both are measured on the same
prompts (the comparison a vs b, the floor a vs a run again), so each prompt gives a pair of
outcomes (the comparison parted or not, the floor parted or not) and only the prompts where
they differ carry information: `only_comparison` (b) and `only_floor` (c) of a paired 2×2
table. Treating the two rates as independent samples wastes the pairing (an interval 2–3
times wider where partings overlap) and its test is not exact at small n.

- "Is the comparison above its floor?": McNemar's exact test, one-sided: given b + c
  discordant prompts, b is Binomial(b + c, 1/2) when the two rates are equal (scipy's
  `binomtest`); exact at any n.
- "By how much?": Tango's score interval for the paired difference δ = (b − c)/n (Tango 1998,
  Statistics in Medicine 17:891–908): the δ whose score statistic
  Z(δ) = (b − c − nδ) / √(n(2q̂ + δ − δ²)), q̂ the restricted maximum-likelihood estimate of the
  floor-only share, is within ±z. Neither scipy nor statsmodels has it; at δ = 0 its statistic
  is McNemar's (b − c)/√(b + c), which statsmodels has (the tests check both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PairedCounts:
    """A comparison and one floor on the prompts both measured."""

    n: int
    only_comparison: int  # b: the comparison parted, the floor did not
    only_floor: int  # c: the floor parted, the comparison did not
    both: int  # both parted

    @classmethod
    def of(cls, comparison: set[str], floor: set[str], prompts: set[str]) -> "PairedCounts":
        """From the prompt ids that parted on each side, over the prompts both measured."""
        comparison, floor = comparison & prompts, floor & prompts
        return cls(len(prompts), len(comparison - floor), len(floor - comparison), len(comparison & floor))

    @property
    def comparison_rate(self) -> float:
        return (self.only_comparison + self.both) / self.n if self.n else math.nan

    @property
    def floor_rate(self) -> float:
        return (self.only_floor + self.both) / self.n if self.n else math.nan

    @property
    def excess(self) -> float:
        return (self.only_comparison - self.only_floor) / self.n if self.n else math.nan


def exact_p_above(b: int, c: int) -> float:
    """McNemar's exact one-sided p-value that the comparison parts more often than its floor
    (1.0 where no prompt is discordant)."""
    from scipy.stats import binomtest

    return float(binomtest(b, b + c, 0.5, alternative="greater").pvalue) if b + c else 1.0


def _floor_share(b: int, c: int, n: int, delta: float) -> float:
    """The restricted maximum-likelihood estimate of the floor-only share q under δ: the
    positive root of 2n·q² − [(b + c) − (2n − b + c)·δ]·q − c·δ(1 − δ) = 0 (the likelihood
    b·log(q + δ) + c·log q + (n − b − c)·log(1 − 2q − δ), differentiated)."""
    big_b = (b + c) - (2 * n - b + c) * delta
    return (big_b + math.sqrt(max(big_b * big_b + 8 * n * c * delta * (1 - delta), 0.0))) / (4 * n)


def score(b: int, c: int, n: int, delta: float) -> float:
    """Tango's score statistic of δ (decreasing in δ; 0 where nothing is discordant at δ = 0)."""
    numerator = b - c - n * delta
    variance = n * (2 * _floor_share(b, c, n, delta) + delta - delta * delta)
    if variance <= 0:
        return 0.0 if numerator == 0 else math.copysign(math.inf, numerator)
    return numerator / math.sqrt(variance)


def p_excess_above(b: int, c: int, n: int, bound: float) -> float:
    """Tango's one-sided score-test p-value that δ is above `bound`."""
    from scipy.stats import norm

    return float(norm.sf(score(b, c, n, bound)))


def tango_interval(b: int, c: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Tango's two-sided 1 − alpha score interval of δ = (b − c)/n."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    if n == 0:
        return math.nan, math.nan
    z, estimate, tiny = float(norm.isf(alpha / 2)), (b - c) / n, 1e-12
    low = -1.0 if estimate <= -1 else brentq(lambda d: score(b, c, n, d) - z, -1 + tiny, estimate, xtol=1e-10) \
        if score(b, c, n, -1 + tiny) > z else -1.0
    high = 1.0 if estimate >= 1 else brentq(lambda d: score(b, c, n, d) + z, estimate, 1 - tiny, xtol=1e-10) \
        if score(b, c, n, 1 - tiny) < -z else 1.0
    return float(low), float(high)


def least_rejected(d, alpha: float):
    """For d discordant prompts (an array), the fewest comparison-only partings the exact
    test calls "above the floor" at alpha (more than d: none): binom.isf gives the largest k
    whose upper tail P(X > k) is still above alpha."""
    import numpy as np
    from scipy.stats import binom

    d = np.asarray(d)
    return np.where(d > 0, binom.isf(alpha, np.maximum(d, 1), 0.5) + 1, 1).astype(int)


def power_above(n: int, rate: float, floor: float, alpha: float = 0.05) -> float:
    """The exact power of the paired rule ("changes outputs": McNemar's exact test at alpha)
    at n prompts, when the comparison parts at `rate` and its floor at `floor`, independently
    per prompt (b ~ rate·(1 − floor), c ~ floor·(1 − rate) a prompt; prompts fragile on both
    sides only raise it): summed over every number of discordant prompts, not simulated."""
    import numpy as np
    from scipy.stats import binom

    p_b, p_c = rate * (1 - floor), floor * (1 - rate)
    if p_b + p_c == 0:
        return 0.0
    d = np.arange(n + 1)
    least = least_rejected(d, alpha)
    tail = np.where(least <= d, binom.sf(least - 1, d, p_b / (p_b + p_c)), 0.0)
    return float(np.sum(binom.pmf(d, n, p_b + p_c) * tail))


def prompts_for_power(rate: float, floor: float, power: float = 0.8, alpha: float = 0.05,
                      most: int = 20000) -> int | None:
    """The fewest prompts at which `power_above` reaches `power` (None beyond `most`), by
    doubling then bisecting. The exact power has small steps in n (the binomial's), so past
    this n it may dip just below `power` again for a few n."""
    if rate <= floor:
        return None
    high = 8
    while power_above(high, rate, floor, alpha) < power:
        high *= 2
        if high > most:
            return None
    low = high // 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if power_above(mid, rate, floor, alpha) < power else (low, mid)
    return high


def detectable_rise(n: int, floor: float, power: float = 0.8, alpha: float = 0.05) -> float | None:
    """The smallest rise above `floor` the paired rule detects with `power` at n prompts
    (bisection on the exact power; None where even a rate of 1 is not detected)."""
    if power_above(n, 1.0, floor, alpha) < power:
        return None
    low, high = floor, 1.0
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if power_above(n, mid, floor, alpha) < power else (low, mid)
    return high - floor
