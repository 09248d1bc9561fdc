"""A verdict a team can act on: a comparison's divergence judged against the engine's own
noise floor (the divergence of the same setting run again), each from a named procedure of
statsmodels, never re-derived by hand:

- `identical`: no prompt parted; the Clopper–Pearson upper bound says how large a rate that
  can still hide (0 of 64 → at most 5.6% at 95%);
- `changes outputs`: the rate is above the floor: the lower end of Newcombe's hybrid score
  interval of the excess (rate − floor, two-sided 1 − 2α) is above 0, the one-sided test at α
  in its interval form (the score test's p-value is reported beside it);
- `within noise`: the same interval lies within ±margin: two one-sided tests (TOST) at α, in
  their interval form;
- `undecided`: neither: the prompts are too few to tell (`prompts_for_bound` says how many);
- `no floor`: parted, but no repeat of either side measured the engine's noise: no verdict
  is assumed (a floor of 0 is a measurement, not a default).

Two sides with different floors are judged against the larger one. The comparison and its
floor are counted on the same prompts; the tests treat them as independent samples, which
errs towards `undecided`, not towards either verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint, test_proportions_2indep

ALPHA = 0.05
# The equivalence margin of `within noise` unless a study sets its own: 5 percentage points
# of divergence above or below the floor.
MARGIN = 0.05


@dataclass(frozen=True)
class Verdict:
    label: str  # identical | changes outputs | within noise | undecided | no floor
    rate: float
    floor: float | None
    excess: float | None  # rate − floor
    excess_low: float | None
    excess_high: float | None
    p_above: float | None  # the one-sided score test that the rate is above the floor (reported)
    upper_bound: float  # the rate's Clopper–Pearson upper bound
    words: str


def upper_bound(k: int, n: int, alpha: float = ALPHA) -> float:
    """The Clopper–Pearson (exact) upper bound of a rate of k in n, two-sided 1 − alpha."""
    return float(proportion_confint(k, n, alpha=alpha, method="beta")[1]) if n else math.nan


def judge(k: int, n: int, floor_k: int | None = None, floor_n: int | None = None, margin: float = MARGIN,
          alpha: float = ALPHA) -> Verdict:
    """The verdict on k of n prompts parted, against a floor of floor_k of floor_n (None:
    no floor measured)."""
    rate, bound = (k / n if n else math.nan), upper_bound(k, n, alpha)
    floor = floor_k / floor_n if floor_k is not None and floor_n else None
    if k == 0:
        return Verdict("identical", rate, floor, None, None, None, None, bound,
                       f"identical: 0 of {n} prompts parted (at most {bound:.1%} at {1 - alpha:.0%})")
    if floor is None:
        return Verdict("no floor", rate, None, None, None, None, None, bound,
                       f"no floor: {k} of {n} prompts parted; no repeat measured this engine's own noise, so whether that "
                       f"is more than its noise is not known (add repeat: [default, 2])")
    # One interval decides both ways (the interval-inclusion form of the one-sided test and of
    # TOST): Newcombe's hybrid score interval of the difference, two-sided 1 − 2·alpha, which
    # stays defined at 0 of n and n of n.
    low, high = (float(v) for v in confint_proportions_2indep(k, n, floor_k, floor_n, method="newcomb",
                                                              alpha=2 * alpha))
    excess = rate - floor
    with np.errstate(all="ignore"):  # the score test's ratio and odds at a floor of 0
        p_above = float(test_proportions_2indep(k, n, floor_k, floor_n, method="score",
                                                alternative="larger").pvalue)
    span = f"{low:+.1%} to {high:+.1%}"
    if low > 0:
        return Verdict("changes outputs", rate, floor, excess, low, high, p_above, bound,
                       f"changes outputs: {k} of {n} parted, {excess:+.1%} above the noise floor of {floor:.1%} "
                       f"({span})")
    if -margin < low and high < margin:
        return Verdict("within noise", rate, floor, excess, low, high, p_above, bound,
                       f"within noise: {k} of {n} parted against a floor of {floor:.1%}; the excess ({span}) is "
                       f"within ±{margin:.0%}")
    return Verdict("undecided", rate, floor, excess, low, high, p_above, bound,
                   f"undecided: {k} of {n} parted against a floor of {floor:.1%}; not above it, nor shown within "
                   f"±{margin:.0%} of it ({span}): more prompts are needed")


def larger_floor(floors: list[tuple[int, int]]) -> tuple[int, int] | None:
    """Of the two sides' floors (k, n), the one with the larger rate (None if neither)."""
    measured = [f for f in floors if f is not None and f[1]]
    return max(measured, key=lambda f: (f[0] / f[1], f[1])) if measured else None


def prompts_for_bound(bound: float, alpha: float = ALPHA) -> int:
    """The fewest prompts whose zero result bounds the rate at `bound` (Clopper–Pearson,
    two-sided 1 − alpha: its upper bound at 0 of n is 1 − (alpha/2)^(1/n))."""
    if not 0 < bound < 1:
        raise ValueError(f"a rate to bound is above 0 and below 1, not {bound}")
    return max(1, math.ceil(math.log(alpha / 2) / math.log(1 - bound) - 1e-9))


def detectable_difference(n: int, floor: float = 0.0, power: float = 0.8, alpha: float = ALPHA) -> float:
    """The smallest rise above `floor` that n prompts on each side detect with `power` (a
    one-sided test of two proportions at alpha, through Cohen's h: statsmodels'
    NormalIndPower)."""
    from statsmodels.stats.power import NormalIndPower

    h = NormalIndPower().solve_power(effect_size=None, nobs1=n, alpha=alpha, power=power, ratio=1.0,
                                     alternative="larger")
    phi = 2 * math.asin(math.sqrt(floor)) + h
    return (1.0 if phi >= math.pi else math.sin(phi / 2) ** 2) - floor


def still_identical(first_div: list[int | None], lengths: list[int]) -> tuple[list[int], list[float]]:
    """The share of prompts still identical after t generated tokens (Kaplan–Meier, through
    statsmodels' SurvfuncRight): a prompt whose streams part at step s (0-based) is no longer
    identical once s + 1 tokens are generated, an event at s + 1; one that ends identical is
    censored at its length (nothing is known of it beyond). Times and the curve after each."""
    from statsmodels.duration.survfunc import SurvfuncRight

    times = np.array([t + 1 if t is not None else length for t, length in zip(first_div, lengths)], dtype=float)
    events = np.array([t is not None for t in first_div], dtype=int)
    if not events.any():
        return [], []
    curve = SurvfuncRight(times, events)
    return [int(t) for t in curve.surv_times], [float(p) for p in curve.surv_prob]


def repeat_floors(rows: list[dict]) -> dict[str, list[tuple[int, int]]]:
    """Every finished repeat pair's divergence (k, n), under each of its two runs' cell ids:
    the floors a cell's comparisons are judged against."""
    floors: dict[str, list[tuple[int, int]]] = {}
    for row in rows:
        if row.get("axis") == "repeat" and row.get("status") == "done":
            for cell in (row["cell_a"], row["cell_b"]):  # a floor of both runs
                floors.setdefault(cell, []).append((int(row["n_diverged"]), int(row["n_prompts"])))
    return floors


def with_verdicts(rows: list[dict], margin: float = MARGIN, alpha: float = ALPHA) -> list[dict]:
    """The summary's pair rows, each with its verdict: a repeat pair is itself a noise floor
    (the divergence of one setting run again); every other pair is judged against the floors
    measured for its two cells (every repeat pair either run of which is one of them), the
    largest."""
    floors = repeat_floors(rows)
    out = []
    for row in rows:
        row = dict(row)
        if row.get("status") != "done":
            out.append({**row, "verdict": None, "verdict_words": None})
            continue
        k, n = int(row["n_diverged"]), int(row["n_prompts"])
        if row.get("axis") == "repeat":
            bound = upper_bound(k, n, alpha)
            words = (f"noise floor: {k} of {n} prompts parted when the same setting ran again"
                     + (f" (at most {bound:.1%} at {1 - alpha:.0%})" if k == 0 else ""))
            out.append({**row, "verdict": "noise floor", "verdict_words": words, "floor_rate": k / n if n else None,
                        "excess": None, "excess_low": None, "excess_high": None, "p_above": None,
                        "upper_bound": bound})
            continue
        floor = larger_floor([*floors.get(row["cell_a"], []), *floors.get(row["cell_b"], [])])
        v = judge(k, n, *(floor or (None, None)), margin=margin, alpha=alpha)
        out.append({**row, "verdict": v.label, "verdict_words": v.words, "floor_rate": v.floor, "excess": v.excess,
                    "excess_low": v.excess_low, "excess_high": v.excess_high, "p_above": v.p_above,
                    "upper_bound": v.upper_bound})
    return out
