"""Statistics used by pair summaries, from statsmodels (not re-derived by hand), imported where
used: statsmodels takes two seconds to import, and a comparison job needs it once a pair."""

from __future__ import annotations

import math

import numpy as np


def wilson(count: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Wilson score interval for a proportion; (nan, nan) when n == 0."""
    if n == 0:
        return math.nan, math.nan
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(count, n, alpha=alpha, method="wilson")
    return float(lo), float(hi)


def mcnemar_exact(correct_a: np.ndarray, correct_b: np.ndarray) -> float:
    """Exact McNemar p-value on paired correctness; 1.0 when no prompt is discordant."""
    from statsmodels.stats.contingency_tables import mcnemar

    a = np.asarray(correct_a, dtype=bool)
    b = np.asarray(correct_b, dtype=bool)
    table = [[int(np.sum(a & b)), int(np.sum(a & ~b))],
             [int(np.sum(~a & b)), int(np.sum(~a & ~b))]]
    return float(mcnemar(table, exact=True).pvalue)
