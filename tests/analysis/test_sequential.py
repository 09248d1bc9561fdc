"""The anytime-valid paired procedure against simulation at fixed seeds: looking after every
prompt keeps the false "changes outputs" rate within α (the fixed-n exact rule, applied after
every block, does not: measured beside it), the confidence sequence covers the true excess at
every time, and a clear change or a clear equality is decided."""

from __future__ import annotations

import numpy as np
import pytest

from tokenflip.analysis.paired import exact_p_above
from tokenflip.analysis.sequential import (
    anytime_p,
    capital_above,
    decided,
    decidable_within,
    decided_against,
    excess_sequence,
    first_above,
    prompts_to_decide,
)


def _draws(rng, n, rate, floor):
    """n prompts' paired outcomes: the comparison parts at `rate`, its floor at `floor`."""
    return (rng.random(n) < rate).astype(int) - (rng.random(n) < floor).astype(int)


@pytest.mark.parametrize("floor", [0.05, 0.3])
def test_looking_after_every_prompt_keeps_changes_outputs_within_alpha(floor):
    rng = np.random.default_rng(7)
    sims, n = 1000, 300
    sequential = peeking = 0
    for _ in range(sims):
        d = _draws(rng, n, floor, floor)  # nothing changed: the comparison parts as its floor does
        sequential += first_above(d) is not None
        # the fixed-n exact test, read after every block of 10 prompts as a user would
        peeking += any(exact_p_above(int((d[:k] == 1).sum()), int((d[:k] == -1).sum())) <= 0.05
                       for k in range(10, n + 1, 10))
    assert sequential / sims <= 0.05
    assert peeking / sims > 0.08  # the contrast: repeated looks at a fixed-n rule inflate its error


def test_the_confidence_sequence_covers_the_excess_at_every_time():
    rng = np.random.default_rng(11)
    missed = 0
    for rate, floor in [(0.0, 0.0), (0.1, 0.0), (0.2, 0.1), (0.05, 0.3)] * 40:
        low, high = excess_sequence(_draws(rng, 400, rate, floor))
        delta = rate * (1 - floor) - floor * (1 - rate)
        missed += bool(((low > delta) | (high < delta)).any())
    assert missed / 160 <= 0.05
    low, high = excess_sequence(np.zeros(0))
    assert low.size == high.size == 0


def test_a_clear_change_and_a_clear_equality_are_decided_and_the_capital_is_a_product():
    rng = np.random.default_rng(3)
    label, n = decided(_draws(rng, 1000, 0.2, 0.0), margin=0.05)
    assert label == "changes outputs" and n < 100
    label, n = decided(np.zeros(1000, dtype=int), margin=0.05)
    assert label == "within noise" and 50 < n < 200
    assert decided(np.zeros(10, dtype=int), margin=0.05) == (None, None)  # 10 prompts decide nothing
    # by hand: the first bet is √(2·log 20 / (0.25 · 1 · log 2)) truncated at 1: K_1 = 1 + 1·(1 − 1/2)
    assert capital_above([1])[0] == pytest.approx(1.5)
    with pytest.raises(ValueError):
        capital_above([2])


def test_against_several_floors_each_must_agree_and_many_comparisons_ask_more():
    ones, zeros = np.ones(300, dtype=int), np.zeros(300, dtype=int)
    # above one floor and level with the other: neither verdict holds for both
    assert decided_against([ones, zeros], margin=0.05) == (None, None)
    assert decided_against([ones, ones], margin=0.05) == ("changes outputs", first_above(ones))
    assert decided_against([zeros, zeros], margin=0.05) == decided(zeros, margin=0.05)
    assert decided_against([], margin=0.05) == (None, None)
    # Bonferroni over 13 comparisons: the capital must reach 13/α, later than 1/α
    assert decided(ones, margin=0.05, tested=13)[1] == first_above(ones, 0.05 / 13) > first_above(ones)
    # the anytime p: 1 / the largest capital (K_1 = 1.5 by hand, above)
    assert anytime_p([1]) == pytest.approx(1 / 1.5)
    assert anytime_p(zeros) == 1.0


def test_the_prompts_still_needed_are_the_rules_own_where_nothing_is_random():
    # no prompt ever parts on either side: every simulated run is the zero sequence
    assert prompts_to_decide(0.0, 0.0, margin=0.05) == decided(np.zeros(4000, dtype=int), margin=0.05)[1]
    # a comparison that always parts where its floor never does: decided at the first capital above 1/α
    assert prompts_to_decide(1.0, 0.0, margin=0.05) == first_above(np.ones(100, dtype=int))
    assert prompts_to_decide(0.1, 0.1, margin=0.001, cap=256) is None  # a margin that close is not reached


def test_a_comparison_is_stopped_only_where_not_even_the_best_case_could_decide_it():
    zeros, ones = np.zeros(8, dtype=int), np.ones(5, dtype=int)
    assert not decidable_within([zeros], 4, margin=0.05)  # 4 more parted: K ≤ 1.5^4 < 20; level: far from ±5 pp
    assert decidable_within([zeros], 200, margin=0.05)  # level for 116 prompts shows "within noise"
    assert decidable_within([ones], 3, margin=0.05) and not decidable_within([ones], 2, margin=0.05)  # 8 = first_above
    assert not decidable_within([ones], 3, margin=0.05, tested=19)  # among 19 comparisons it takes 15
    assert not decidable_within([ones, zeros], 0, margin=0.05)
