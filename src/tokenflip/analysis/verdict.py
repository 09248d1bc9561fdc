"""A verdict a team can act on: a comparison's divergence judged against the engine's own
noise floor (the divergence of the same setting run again), prompt by prompt: both are
measured on the same prompts, so each is a paired test (`analysis/paired.py`):

- `none parted`: no prompt parted; the Clopper–Pearson upper bound says how large a rate that
  can still hide (0 of 64: at most 5.6% at 95%);
- `changes outputs`: the comparison parts more often than its floor: McNemar's exact
  one-sided test on the prompts where one parted and the other did not, at α after
  Benjamini–Hochberg across the study's tested comparisons (the raw and the adjusted p are
  both kept); against **each** of its floors (a comparison's two cells may each have been
  run again: it must part more than either does, an intersection–union test whose p is the
  larger);
- `within noise`: the paired excess (Tango's score interval, two-sided 1 − 2α, the interval
  form of two one-sided tests) lies within ±margin of each floor;
- `undecided`: neither: the prompts are too few to tell, or the comparison parts more than
  one floor and not more than the other (said);
- `no floor`: parted, but no repeat of either side measured the engine's noise: no verdict
  is assumed (a floor of 0 is a measurement, not a default);
- no verdict at all where no prompt was compared.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from statsmodels.stats.proportion import proportion_confint

from tokenflip.analysis.paired import PairedCounts, exact_p_above, tango_interval

ALPHA = 0.05
# The equivalence margin of `within noise` unless a study sets its own: 5 percentage points
# of divergence above or below the floor.
MARGIN = 0.05
LABELS = ("none parted", "changes outputs", "within noise", "undecided", "no floor", "noise floor")


@dataclass(frozen=True)
class Verdict:
    label: str | None  # one of LABELS; None where no prompt was compared
    rate: float
    floor: float | None  # the deciding floor's rate (on the prompts both measured)
    excess: float | None  # rate − floor, paired
    excess_low: float | None  # Tango's interval, two-sided 1 − 2α
    excess_high: float | None
    p_above: float | None  # McNemar's exact one-sided p, the largest over the floors
    upper_bound: float  # the rate's Clopper–Pearson upper bound
    words: str
    p_adjusted: float | None = None  # p_above after Benjamini–Hochberg across the study
    versus: tuple[PairedCounts, ...] = field(default_factory=tuple)  # one per floor


def upper_bound(k: int, n: int, alpha: float = ALPHA) -> float:
    """The Clopper–Pearson (exact) upper bound of a rate of k in n, two-sided 1 − alpha."""
    return float(proportion_confint(k, n, alpha=alpha, method="beta")[1]) if n else math.nan


def judge(k: int, n: int, versus: list[PairedCounts] | tuple = (), margin: float = MARGIN, alpha: float = ALPHA,
          p_adjusted: float | None = None, tested: int = 1) -> Verdict:
    """The verdict on k of n prompts parted, against each floor in `versus` (the comparison
    and one repeat on the prompts both measured; none: no floor measured). `p_adjusted`: the
    exact p after the study's multiple-comparison adjustment over `tested` comparisons."""
    rate, bound = (k / n if n else math.nan), upper_bound(k, n, alpha)
    if n == 0:
        return Verdict(None, rate, None, None, None, None, None, bound, "no prompt was compared: no verdict")
    if k == 0:
        return Verdict("none parted", rate, None, None, None, None, None, bound,
                       f"none parted: 0 of {n} prompts (at most {bound:.1%} at {1 - alpha:.0%})")
    versus = tuple(versus)
    if not versus:
        return Verdict("no floor", rate, None, None, None, None, None, bound,
                       f"no floor: {k} of {n} prompts parted; no repeat measured this engine's own noise, so whether "
                       f"that is more than its noise is not known (add repeat: [default, 2])")
    ps = [exact_p_above(v.only_comparison, v.only_floor) for v in versus]
    spans = [tango_interval(v.only_comparison, v.only_floor, v.n, 2 * alpha) for v in versus]
    # The floor that decides: the one the comparison is least shown to exceed.
    i = max(range(len(versus)), key=lambda j: (ps[j], versus[j].floor_rate))
    p, (low, high), floor = ps[i], spans[i], versus[i]
    decide = p if p_adjusted is None else p_adjusted
    span = f"{low:+.1%} to {high:+.1%}"
    each = f" each of its {len(versus)} floors" if len(versus) > 1 else " the noise floor"
    exact = f"exact paired p = {p:.3g}" + (f", {p_adjusted:.3g} adjusted over {tested} comparisons"
                                           if p_adjusted is not None and tested > 1 else "")
    common = dict(rate=rate, floor=floor.floor_rate, excess=floor.excess, excess_low=low, excess_high=high,
                  p_above=p, upper_bound=bound, p_adjusted=p_adjusted, versus=versus)
    if decide <= alpha:
        return Verdict(label="changes outputs", words=f"changes outputs: {k} of {n} parted, {floor.excess:+.1%} "
                                                      f"above{each} (deciding floor {floor.floor_rate:.1%}; {span}; "
                                                      f"{exact})", **common)
    if all(-margin < lo and hi < margin for lo, hi in spans):
        return Verdict(label="within noise", words=f"within noise: {k} of {n} parted; the excess over{each} "
                                                   f"({span}) is within ±{margin:.0%}", **common)
    above = [v for v, q in zip(versus, ps) if q <= alpha]
    if above and p > alpha:  # one floor exceeded, another not
        why = f"more than the {above[0].floor_rate:.1%} floor, not more than the {floor.floor_rate:.1%} one ({exact})"
    elif p <= alpha:  # every floor exceeded, but not after the adjustment for the study's many comparisons
        why = (f"above the noise floor before the adjustment for the study's {tested} comparisons, not after it "
               f"({exact}): more prompts are needed")
    else:
        why = (f"not shown above the floor of {floor.floor_rate:.1%} ({exact}), nor within ±{margin:.0%} of it "
               f"({span}): more prompts are needed")
    return Verdict(label="undecided", words=f"undecided: {k} of {n} parted; {why}", **common)


def larger_floor(floors: list[tuple[int, int]]) -> tuple[int, int] | None:
    """Of several floors (k, n), the one with the larger rate (None if none): the one a
    setting's table shows."""
    measured = [f for f in floors if f is not None and f[1]]
    return max(measured, key=lambda f: (f[0] / f[1], f[1])) if measured else None


def prompts_for_bound(bound: float, alpha: float = ALPHA) -> int:
    """The fewest prompts whose zero result bounds the rate at `bound` (Clopper–Pearson,
    two-sided 1 − alpha: its upper bound at 0 of n is 1 − (alpha/2)^(1/n))."""
    if not 0 < bound < 1:
        raise ValueError(f"a rate to bound is above 0 and below 1, not {bound}")
    return max(1, math.ceil(math.log(alpha / 2) / math.log(1 - bound) - 1e-9))


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


def repeat_floors(rows: list[dict]) -> dict[str, list[dict]]:
    """Every finished repeat pair, under each of its two runs' cell ids: the floors a cell's
    comparisons are judged against."""
    floors: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("axis") == "repeat" and row.get("status") == "done":
            for cell in (row["cell_a"], row["cell_b"]):  # a floor of both runs
                floors.setdefault(cell, []).append(row)
    return floors


def floor_counts(floors: list[dict]) -> list[tuple[int, int]]:
    return [(int(f["n_diverged"]), int(f["n_prompts"])) for f in floors]


Outcomes = dict[str, tuple[set, set]]  # pair id -> (the prompts compared, the prompts that parted)


def _versus(row: dict, floors: list[dict], outcomes: Outcomes) -> list[PairedCounts]:
    """The comparison against each of its floors, on the prompts both measured."""
    prompts, parted = outcomes[row["pair_id"]]
    out = []
    for floor in {f["pair_id"]: f for f in floors}.values():
        floor_prompts, floor_parted = outcomes[floor["pair_id"]]
        shared = set(prompts) & set(floor_prompts)
        if shared:  # a floor measured on other prompts says nothing of these
            out.append(PairedCounts.of(set(parted), set(floor_parted), shared))
    return out


def with_verdicts(rows: list[dict], outcomes: Outcomes, margin: float = MARGIN, alpha: float = ALPHA) -> list[dict]:
    """The summary's pair rows, each with its verdict: a repeat pair is itself a noise floor
    (the divergence of one setting run again); every other pair is judged, prompt by prompt
    (`outcomes`), against each floor measured for its two cells (every repeat pair either run
    of which is one of them), its exact p adjusted by Benjamini–Hochberg across every pair
    judged against a floor."""
    from statsmodels.stats.multitest import multipletests

    floors = repeat_floors(rows)
    judged: dict[int, list[PairedCounts]] = {}
    for i, row in enumerate(rows):
        if row.get("status") == "done" and row.get("axis") != "repeat" and int(row["n_prompts"]):
            mine = [*floors.get(row["cell_a"], []), *floors.get(row["cell_b"], [])]
            if mine and (versus := _versus(row, mine, outcomes)):
                judged[i] = versus
    raw = {i: max(exact_p_above(v.only_comparison, v.only_floor) for v in versus) for i, versus in judged.items()}
    adjusted = dict(zip(raw, multipletests(list(raw.values()), alpha=alpha, method="fdr_bh")[1])) if raw else {}
    out = []
    for i, row in enumerate(rows):
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
                        "p_adjusted": None, "comparisons_tested": None, "floors_paired": None, "upper_bound": bound})
            continue
        v = judge(k, n, judged.get(i, ()), margin=margin, alpha=alpha,
                  p_adjusted=float(adjusted[i]) if i in adjusted else None, tested=len(raw))
        out.append({**row, "verdict": v.label, "verdict_words": v.words, "floor_rate": v.floor, "excess": v.excess,
                    "excess_low": v.excess_low, "excess_high": v.excess_high, "p_above": v.p_above,
                    "p_adjusted": v.p_adjusted, "comparisons_tested": len(raw) if i in raw else None,
                    # every floor, even where none parted: the gate judges the excess against them
                    "floors_paired": json.dumps([vars(c) for c in judged[i]]) if i in judged else None,
                    "upper_bound": v.upper_bound})
    return out
