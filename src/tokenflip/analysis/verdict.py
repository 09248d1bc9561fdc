"""What the report says of verdicts besides the verdict itself (which comes from
`analysis.decision`, the one rule): a floor's descriptive bound, the larger of several floors,
and the share of prompts still identical after t generated tokens."""

from __future__ import annotations

import math

from statsmodels.stats.proportion import proportion_confint

from tokenflip.analysis.decision import ALPHA


def upper_bound(k: int, n: int, alpha: float = ALPHA) -> float:
    """The Clopper–Pearson (exact) upper bound of a rate of k in n, two-sided 1 − alpha: the
    noise-floor table's description of a floor, not a verdict."""
    return float(proportion_confint(k, n, alpha=alpha, method="beta")[1]) if n else math.nan


def larger_floor(floors: list[tuple[int, int]]) -> tuple[int, int] | None:
    """Of several floors (k, n), the one with the larger rate (None if none): the one a
    setting's table shows."""
    measured = [f for f in floors if f is not None and f[1]]
    return max(measured, key=lambda f: (f[0] / f[1], f[1])) if measured else None


def still_identical(first_div: list[int | None]) -> tuple[list[int], list[float]]:
    """The share of prompts still identical after t generated tokens: a prompt whose streams
    part at step s (0-based) is no longer identical once s + 1 tokens are generated; one that
    ended identical stays identical to the length cap (with one cap per comparison its end is
    an outcome, not a loss to follow-up, so nothing is censored and the curve ends at
    1 − parted/n). Times and the share after each."""
    steps = sorted(t + 1 for t in first_div if t is not None)
    n = len(first_div)
    times = sorted(set(steps))
    return times, [1 - sum(1 for s in steps if s <= t) / n for t in times]


def floor_counts(floors: list[dict]) -> list[tuple[int, int]]:
    return [(int(f["n_diverged"]), int(f["n_prompts"])) for f in floors]
