"""What the rule can decide before it runs, exact over counts: the chance it decides at one look
or at a study's looks, and the one estimate of "prompts needed" every reader prints."""

from __future__ import annotations

import math

import numpy as np

from tokenflip.analysis.decision.rule import ALPHA, MARGIN, _threshold, log_capital_above, log_capital_below

def _trinomial(n: int, up: float, down: float):
    """The counts of +1 and −1 among n prompts (arrays over a window holding all but ~1e-12
    of the mass) and their probabilities."""
    from scipy.stats import binom

    def window(p: float, size: int) -> np.ndarray:
        if p <= 0:
            return np.zeros(1, dtype=int)
        sd = math.sqrt(size * p * (1 - p))
        return np.arange(max(0, int(size * p - 8 * sd - 2)), min(size, int(size * p + 8 * sd + 2)) + 1)

    a = window(up, n)
    rest = down / (1 - up) if up < 1 else 0.0
    ups, downs, probs = [], [], []
    for u in a:
        c = window(rest, n - int(u))
        ups.append(np.full(len(c), u))
        downs.append(c)
        probs.append(binom.pmf(u, n, up) * binom.pmf(c, n - u, rest))
    return np.concatenate(ups), np.concatenate(downs), np.concatenate(probs)


def decides(question: str, ups, levels, downs, margin: float = MARGIN, bound: float | None = None,
            intervals: int = 1, judged: int = 1, alpha: float = ALPHA):
    """Whether the rule decides at these counts (arrays): question "verdict" (changes outputs, at
    e-BH's first threshold judged/α, or within ±margin), "changes", "within", or the gate at
    `bound` ("gate": shown above it or at most it)."""
    threshold = _threshold(intervals, alpha)
    above = log_capital_above(ups, levels, downs, 0.0) >= math.log(max(1, judged) / alpha)
    within = (log_capital_above(ups, levels, downs, -margin) >= threshold) & \
        (log_capital_below(ups, levels, downs, margin) >= threshold)
    if question == "changes":
        return above
    if question == "within":
        return within
    if question == "verdict":
        return above | within
    if question == "gate":
        return (log_capital_above(ups, levels, downs, bound) >= threshold) | \
            (log_capital_below(ups, levels, downs, bound) >= threshold)
    raise ValueError(f"no question {question!r}")


def chance_at(n: int, up: float, down: float, question: str, **levels) -> float:
    """The probability the rule decides `question` at one look after n prompts, when each
    prompt parts in the comparison only with probability `up` and in the floor only with
    `down`: summed over every count, not simulated."""
    u, w, p = _trinomial(n, up, down)
    return float(np.sum(p * decides(question, u, n - u - w, w, **levels)))


MOST_PROMPTS = 100_000


def prompts_needed(up: float, down: float, question: str = "verdict", start: int = 1, **levels) -> int | None:
    """The one estimate of "prompts needed": the fewest prompts at which the rule decides with
    even odds at these rates (None: more than MOST_PROMPTS). Exact at each n; searched by
    doubling, then bisection."""
    n = max(1, start)
    while chance_at(n, up, down, question, **levels) < 0.5:
        if n >= MOST_PROMPTS:
            return None
        n = min(MOST_PROMPTS, n * 2)
    low = max(start, n // 2)
    while n - low > 1:
        mid = (low + n) // 2
        low, n = (mid, n) if chance_at(mid, up, down, question, **levels) < 0.5 else (low, mid)
    return n


def power(looks: list[int], up: float, down: float, question: str = "verdict", **levels) -> float:
    """The probability the rule decides `question` at one of `looks` (its rounds' ends), at these
    rates: exact, over the counts at each look, what an earlier look decided taken out."""
    from scipy.signal import fftconvolve
    from scipy.stats import binom

    rest = down / (1 - up) if up < 1 else 0.0  # a −1 among the prompts that are not +1
    mass = np.zeros((1, 1))
    mass[0, 0] = 1.0
    done, before = 0.0, 0
    for n in looks:
        step = n - before
        inc = np.zeros((step + 1, step + 1))
        for u in range(step + 1):
            inc[u, : step - u + 1] = binom.pmf(u, step, up) * binom.pmf(np.arange(step - u + 1), step - u, rest)
        mass = np.clip(fftconvolve(mass, inc)[: n + 1, : n + 1], 0, None)
        ups, downs = np.meshgrid(np.arange(mass.shape[0]), np.arange(mass.shape[1]), indexing="ij")
        ok = (ups + downs <= n)
        hit = np.zeros_like(mass, dtype=bool)
        hit[ok] = decides(question, ups[ok], n - ups[ok] - downs[ok], downs[ok], **levels)
        done += float(mass[hit].sum())
        mass[hit | ~ok] = 0.0
        before = n
    return min(1.0, done)
