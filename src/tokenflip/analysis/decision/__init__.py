"""The one decision every reader uses (summary, rounds, report, plan, gate): a comparison
judged against its noise floors, prompt by prompt, by a test that stays valid however often
it is looked at and wherever it stops.

Each prompt gives D = (the comparison parted) − (the floor parted) ∈ {−1, 0, 1}; the excess
δ = E[D], on a prompt drawn at random from the benchmark. With Z = (D + 1)/2 and
μ = (δ + 1)/2, the capital of betting against "μ ≤ m" is a mixture over a fixed grid of
bets s (Waudby-Smith and Ramdas, "Estimating means of bounded random variables by betting",
JRSS-B 2024, §5's grid mixture):

    K⁺(m) = mean_s Π_i (1 + s (Z_i/m − 1)),   s ∈ BETS ⊂ (0, 1),

a nonnegative supermartingale while μ ≤ m, so by Ville's inequality it ever reaches 1/a with
probability at most a: an e-process. Against "μ ≥ m" the mirror (1 − Z against 1 − m). Two
properties follow that the rule is built on:

- the capital depends on the prompts only through how many gave +1, 0 and −1 (no bet
  depends on the past), so a verdict does not depend on how prompts were batched into rounds,
  and its error can be computed exactly, by enumerating counts, not simulated;
- K⁺(m) decreases in m for every s, so the δ it does not reject form an interval: the
  confidence sequence's ends are found by bisection, and "excess at most X" is the same
  statement as "the interval's upper end is at most X".

The prompts are a seeded random sample of the benchmark, without replacement
(`run.benchmarks`): the tests check by exact enumeration that the rule, built for draws with
replacement, keeps its error under sampling without replacement from finite benchmarks.

The decisions, against every floor a comparison has (intersection-union: each floor must say
so, and no level is split among floors):
- "changes outputs": e-BH (Wang and Ramdas, "False discovery rate control with e-values",
  JRSS-B 2022) over the study's judged comparisons, on each one's K⁺(δ = 0), the smallest
  over its floors; the expected share of false ones among those declared is at most α;
- the interval of each comparison's excess: both ends at α / (2m), m the intervals the study
  gives (Bonferroni), so with probability at least 1 − α every interval covers its excess at
  every round at once; "within noise" (inside ±margin) and the gate (pass: the upper end at most
  X; fail: the lower end above X) read it, so neither can contradict the other, and a lower end
  above 0 is always also "changes outputs" (its capital then passes every e-BH threshold);
- an accuracy drop: e-BH over the comparisons scored, on correct_a − correct_b.
"""

from tokenflip.analysis.decision.forecast import MOST_PROMPTS, chance_at, decides, power, prompts_needed
from tokenflip.analysis.decision.rows import outcome_sequence, repeat_floors, verdict_words, with_decisions
from tokenflip.analysis.decision.rule import (
    ALPHA,
    BETS,
    MARGIN,
    Decision,
    Look,
    accuracy_drops,
    could_decide,
    decide,
    deciding_counts,
    e_bh,
    gated,
    guarantee,
    interval,
    log_capital_above,
    log_capital_below,
)

__all__ = ["ALPHA", "BETS", "MARGIN", "MOST_PROMPTS", "Decision", "Look", "accuracy_drops", "chance_at",
           "could_decide", "decide", "decides", "deciding_counts", "e_bh", "gated", "guarantee", "interval",
           "log_capital_above", "log_capital_below", "outcome_sequence", "power", "prompts_needed",
           "repeat_floors", "verdict_words", "with_decisions"]
