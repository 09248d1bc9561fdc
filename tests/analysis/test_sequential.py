"""The anytime-valid paired procedure against simulation at fixed seeds: looking after every
prompt keeps the false "changes outputs" rate within α (the fixed-n exact rule, applied after
every block, does not: measured beside it), the confidence sequence covers the true excess at
every time, and a clear change or a clear equality is decided."""

from __future__ import annotations

import numpy as np
import pytest

from tokenflip.analysis.paired import exact_p_above
from tokenflip.analysis.sequential import capital_above, decided, excess_sequence, first_above


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
