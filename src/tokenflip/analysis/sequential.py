"""Anytime-valid paired verdicts: a comparison judged against its noise floor after every
block of prompts, as often as one looks, without the error rate growing with the looks (the
fixed-n rule of `verdict`, applied after each block, says "changes outputs" far more often
than 5% when nothing changed; the tests measure both).

Each prompt gives D = (the comparison parted) − (the floor parted) ∈ {−1, 0, 1}; the excess
δ = E[D]. With Z = (D + 1)/2 ∈ [0, 1] and μ = (δ + 1)/2, betting (Waudby-Smith and Ramdas,
"Estimating means of bounded random variables by betting", JRSS-B 2024):

- "changes outputs": the capital K_t = Π (1 + λ_i (Z_i − 1/2)), λ_i ≥ 0 chosen from the
  prompts before i only, is a nonnegative supermartingale while δ ≤ 0, so by Ville's
  inequality it ever reaches 1/α with probability at most α: rejecting the first time it does
  is valid at every look (an e-process);
- "within noise": the hedged-capital confidence sequence for μ (the m whose capital betting
  either way stays below 1/α), intersected over time, is a two-sided 1 − α interval valid at
  every t; δ within ±margin when its image lies inside (at 1 − 2α: the interval form of two
  one-sided tests, as the fixed-n rule).

The bets are the paper's predictable plug-in (its λ^PrPl), truncated at c/m (c = 1/2). No
maintained Python library carries these (confseq's wheel is a C++ build); the tests check
them against simulation.
"""

from __future__ import annotations

import math

import numpy as np

ALPHA = 0.05
TRUNCATION = 0.5  # c: the largest bet is c/m (c/(1 − m) the other way), as the paper suggests
GRID = 2001  # candidate means for the confidence sequence (a step of 0.001 in δ)


def _bets(z: np.ndarray, alpha: float) -> np.ndarray:
    """The predictable plug-in bet size for each prompt (before truncation), from the prompts
    before it: √(2 log(1/α) / (σ̂²_{t−1} · t · log(1 + t)))."""
    t = np.arange(1, len(z) + 1, dtype=float)
    mean = (0.5 + np.cumsum(z)) / (t + 1)
    variance = (0.25 + np.cumsum((z - mean) ** 2)) / (t + 1)
    before = np.concatenate(([0.25], variance[:-1]))
    return np.sqrt(2 * math.log(1 / alpha) / (before * t * np.log1p(t)))


def _z(d) -> np.ndarray:
    d = np.asarray(d, dtype=float)
    if d.size and (np.nanmax(np.abs(d)) > 1 or np.isnan(d).any()):
        raise ValueError("paired outcomes are -1, 0 or 1 (the comparison parted minus the floor parted)")
    return (d + 1) / 2


def capital_above(d, alpha: float = ALPHA) -> np.ndarray:
    """K_t after each prompt: the e-process against "the comparison parts no more often than
    its floor" (δ ≤ 0)."""
    z = _z(d)
    bets = np.minimum(_bets(z, alpha), TRUNCATION / 0.5)
    return np.cumprod(1 + bets * (z - 0.5))


def first_above(d, alpha: float = ALPHA) -> int | None:
    """The number of prompts after which "changes outputs" is first shown (None: not yet)."""
    reached = np.flatnonzero(capital_above(d, alpha) >= 1 / alpha)
    return int(reached[0]) + 1 if reached.size else None


def excess_sequence(d, alpha: float = ALPHA) -> tuple[np.ndarray, np.ndarray]:
    """The running two-sided 1 − alpha confidence sequence for δ after each prompt (lower,
    upper), from the hedged capital on a grid of candidate means, intersected over time."""
    z = _z(d)
    if not z.size:
        return np.zeros(0), np.zeros(0)
    m = np.linspace(0, 1, GRID)[1:-1]  # (0, 1): the capital of m = 0 or 1 is not defined
    bets = _bets(z, alpha / 2)[:, None]
    up = np.minimum(bets, TRUNCATION / m[None, :])
    down = np.minimum(bets, TRUNCATION / (1 - m[None, :]))
    with np.errstate(divide="ignore"):
        log_up = np.cumsum(np.log(np.maximum(1 + up * (z[:, None] - m), 1e-300)), axis=0)
        log_down = np.cumsum(np.log(np.maximum(1 - down * (z[:, None] - m), 1e-300)), axis=0)
    hedged = np.logaddexp(log_up, log_down) + math.log(0.5)  # ½K⁺ + ½K⁻, never above 1/α for μ
    inside = hedged < math.log(1 / alpha)
    lower = np.where(inside.any(axis=1), m[np.argmax(inside, axis=1)], 1.0)
    upper = np.where(inside.any(axis=1), m[len(m) - 1 - np.argmax(inside[:, ::-1], axis=1)], 0.0)
    lower, upper = np.maximum.accumulate(lower), np.minimum.accumulate(upper)
    step = 1 / (GRID - 1)
    return 2 * (lower - step) - 1, 2 * (upper + step) - 1  # one grid step of slack each way


def first_within(d, margin: float, alpha: float = ALPHA) -> int | None:
    """The number of prompts after which "within noise" is first shown: the 1 − 2α sequence
    inside ±margin (None: not yet)."""
    low, high = excess_sequence(d, 2 * alpha)
    # An empty sequence (lower above upper) is no evidence of equality: the outcomes shifted.
    within = np.flatnonzero((low > -margin) & (high < margin) & (low <= high))
    return int(within[0]) + 1 if within.size else None


def decided(d, margin: float, alpha: float = ALPHA, tested: int = 1) -> tuple[str | None, int | None]:
    """The anytime-valid verdict after the prompts so far, and after how many prompts it was
    first reached: "changes outputs" (the e-process reached tested/α: Bonferroni over the
    study's `tested` comparisons, valid at every look as each e-process is), "within noise"
    (the 1 − 2α sequence inside ±margin), or (None, None) while neither."""
    return decided_against([d], margin, alpha, tested)


def decided_against(floors: list, margin: float, alpha: float = ALPHA,
                    tested: int = 1) -> tuple[str | None, int | None]:
    """`decided` against each of several floors (one outcome sequence each): "changes outputs"
    once shown above every floor, "within noise" once within ±margin of every one (an
    intersection–union rule: each part at its own level)."""
    if not floors:
        return None, None
    aboves = [first_above(d, alpha / tested) for d in floors]
    withins = [first_within(d, margin, alpha) for d in floors]
    above = max(aboves) if None not in aboves else None
    within = max(withins) if None not in withins else None
    if above is not None and (within is None or above <= within):
        return "changes outputs", above
    if within is not None:
        return "within noise", within
    return None, None


def decidable_within(floors: list, remaining: int, margin: float, alpha: float = ALPHA, tested: int = 1) -> bool:
    """Whether `remaining` more prompts could still decide, at best: every one parted only in
    the comparison (the most the e-process can gain), or none parted on either side (the
    tightest the sequence can close around 0). A comparison that could not is stopped: no
    error is made by not deciding, and no prompt is spent that could not change its verdict."""
    if remaining <= 0:
        return False
    best = [np.concatenate([np.asarray(d, dtype=float), np.ones(remaining)]) for d in floors]
    level = [np.concatenate([np.asarray(d, dtype=float), np.zeros(remaining)]) for d in floors]
    return decided_against(best, margin, alpha, tested)[0] == "changes outputs" or \
        decided_against(level, margin, alpha, tested)[0] == "within noise"


def anytime_p(d, alpha: float = ALPHA) -> float:
    """The anytime-valid p-value of "changes outputs": 1 / the largest capital so far (Ville)."""
    capital = capital_above(d, alpha)
    return float(min(1.0, 1 / capital.max())) if capital.size else 1.0


def prompts_to_decide(p_more: float, p_less: float, margin: float, alpha: float = ALPHA, tested: int = 1,
                      cap: int = 4000, sims: int = 40, seed: int = 0) -> int | None:
    """The median prompts the rule takes to decide, by simulation, when each prompt parts in
    the comparison only with probability `p_more` and in the floor only with `p_less` (what a
    comparison stopped at its maximum would still need; None: most runs undecided by `cap`)."""
    rng = np.random.default_rng(seed)
    taken = []
    for _ in range(sims):
        u = rng.random(cap)
        d = np.where(u < p_more, 1, np.where(u < p_more + p_less, -1, 0))
        length = 128  # a prefix's first decision is the whole sequence's: look at growing prefixes
        while (first := decided(d[:length], margin, alpha, tested)[1]) is None and length < cap:
            length *= 2
        taken.append(first)
    done = sorted(t for t in taken if t is not None)
    return done[len(taken) // 2] if len(done) > len(taken) // 2 else None
