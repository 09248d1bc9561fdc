"""The one decision rule (`analysis.decision`), checked where its right answer is known: by hand,
and by exact enumeration of every count (the capital depends on the counts of +1, 0 and −1
only), never by simulation: its false "changes outputs" under repeated looks, the gate's size at
n = 12, 32 and 128, sampling without replacement from finite benchmarks in any order, the early
stop against every continuation, and one verdict for the summary, the rounds and the gate."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest

from tokenflip.analysis.decision import forecast, rule
from tokenflip.analysis.decision import (
    ALPHA,
    Look,
    could_decide,
    decide,
    decides,
    e_bh,
    interval,
    log_capital_above,
    log_capital_below,
    power,
    prompts_needed,
)


def test_the_capital_by_hand_and_its_mirror():
    # one prompt parted in the comparison only: K⁺(0) = mean over the bets of (1 + s) = 1 + mean(s)
    assert math.exp(float(log_capital_above(1, 0, 0, 0.0))) == pytest.approx(1 + 0.9 * 10.5 / 20)
    # a prompt where neither or both parted stakes nothing at δ = 0
    assert float(log_capital_above(0, 7, 0, 0.0)) == pytest.approx(0.0, abs=1e-12)
    # the mirror: betting down on (+1, 0, −1) counts is betting up on (−1, 0, +1)
    assert float(log_capital_below(2, 3, 5, 0.1)) == pytest.approx(float(log_capital_above(5, 3, 2, -0.1)))
    low, high = interval(0, 200, 0)
    assert low == pytest.approx(-high, abs=1e-9) and 0 < high < 0.05  # nothing parted: symmetric about 0
    assert interval(0, 0, 0) == (-1.0, pytest.approx(1.0))  # no prompt: nothing is known
    with pytest.raises(ValueError):
        Look.of([[2]], 1, 1, ALPHA)


def test_e_bh_by_hand():
    # m = 3, α = 5%: the largest k whose k-th largest e-value is at least 3/(0.05 k): k = 2 (30 ≥ 30)
    assert e_bh({"a": 100.0, "b": 30.0, "c": 1.0}) == {"a", "b"}
    assert e_bh({"a": 59.0, "b": 1.0, "c": 1.0}) == set()  # 59 < 60 = 3/0.05 alone, 1 < 30 for two
    assert e_bh({"a": 25.0}, family=1) == {"a"} and e_bh({"a": 25.0}, family=2) == set()


@pytest.mark.parametrize("floor", [0.0, 0.05, 0.3])
def test_looking_after_every_prompt_keeps_the_false_changes_outputs_within_alpha(floor):
    """Exact: the chance the e-process ever reaches 1/α in 200 prompts, looked at after every
    one, where the comparison parts exactly as often as its floor (every count summed)."""
    error = power(list(range(1, 201)), floor, floor, "changes", judged=1)
    assert error <= ALPHA
    assert error > 0 or floor == 0.0  # not vacuous: with discordant prompts it can err


@pytest.mark.parametrize("n", [12, 32, 128])
@pytest.mark.parametrize("floor_only", [0.0, 0.02, 0.1, 0.3])
def test_the_gate_is_exact_at_its_bound(n, floor_only):
    """At a true excess of exactly X, fail (the lower end above X) and pass (the upper end at
    most X) each happen with probability at most α/2, by exact enumeration of the counts, at a
    single look and at a look after every prompt."""
    bound = 0.05
    up = floor_only + bound
    for side, capital in (("fail", log_capital_above), ("pass", log_capital_below)):
        u, w, p = forecast._trinomial(n, up, floor_only)
        threshold = math.log(2 / ALPHA)
        size = float(np.sum(p * (capital(u, n - u - w, w, bound) >= threshold)))
        assert size <= ALPHA / 2, (side, size)
    assert power(list(range(1, n + 1)), up, floor_only, "gate", bound=bound) <= ALPHA


def _without_replacement_error(population: tuple[int, int, int], delta: float, threshold: float) -> float:
    """Exactly: the chance K⁺(δ) ever reaches the threshold, looked at after every prompt, when
    the prompts are the whole benchmark (`population` of +1, 0, −1 outcomes) in a random order."""
    big_a, big_b, big_c = population
    mass, error = {(0, 0): 1.0}, 0.0
    for t in range(sum(population)):
        new: dict = {}
        for (u, w), p in mass.items():
            rest = (big_a - u, big_b - (t - u - w), big_c - w)
            for (du, dw), r in zip(((1, 0), (0, 0), (0, 1)), rest):
                if r > 0:
                    new[(u + du, w + dw)] = new.get((u + du, w + dw), 0.0) + p * r / sum(rest)
        mass = {}
        for (u, w), p in new.items():
            if float(log_capital_above(u, t + 1 - u - w, w, delta)) >= threshold:
                error += p
            else:
                mass[(u, w)] = p
    return error


@pytest.mark.parametrize("population", [(0, 10, 10), (5, 5, 10), (2, 36, 2), (10, 0, 10), (20, 20, 40), (3, 70, 7)])
def test_prompts_drawn_without_replacement_keep_the_error_in_any_benchmark_order(population):
    """A benchmark whose excess drifts along its order (all +1 first, then all −1) is, once its
    prompts are drawn at random, a finite population: the rule (made for draws with
    replacement) keeps its error at the population's own excess, looked at after every prompt,
    to the whole benchmark."""
    delta = (population[0] - population[2]) / sum(population)
    assert _without_replacement_error(population, delta, math.log(1 / ALPHA)) <= ALPHA


def test_the_early_stop_is_exact_against_every_continuation():
    """For every start of 0 to 6 prompts and up to 6 prompts left, `could_decide` is true
    exactly when some continuation (all 3^r of them, looked at after every prompt) decides."""
    margin, intervals, judged = 0.3, 1, 1
    threshold = rule._threshold(intervals, ALPHA)

    @functools.lru_cache(maxsize=None)
    def decided(u, l, w):
        return (float(log_capital_above(u, l, w, 0.0)) >= math.log(1 / ALPHA)
                or (float(log_capital_above(u, l, w, -margin)) >= threshold
                    and float(log_capital_below(u, l, w, margin)) >= threshold))

    checked = 0
    for start in range(7):
        for u, w in itertools.product(range(start + 1), repeat=2):
            if u + w > start:
                continue
            look = Look(start, [(u, start - u - w, w)], 1.0, -1.0, 1.0)
            for remaining in range(7):
                brute = any(any(decided(u + seq[:i].count(1), start - u - w + seq[:i].count(0), w + seq[:i].count(-1))
                                for i in range(1, remaining + 1))
                            for seq in itertools.product((1, 0, -1), repeat=remaining))
                assert could_decide(look, remaining, margin, intervals, judged) == brute, (u, w, start, remaining)
                checked += brute
    assert checked  # both answers occur


def test_within_noise_is_not_stopped_where_a_floor_only_parting_would_decide_it():
    """After 128 prompts with one parting in the comparison only, a later floor-only parting can
    decide "within noise": the stop must see that continuation, not only the all-level one."""
    look = Look(128, [(1, 127, 0)], 1.0, -1.0, 1.0)
    intervals = 1
    threshold = rule._threshold(intervals, ALPHA)
    # find a margin at which the level continuation fails and one −1 more decides
    for margin in np.arange(0.05, 0.3, 0.0025):
        level = float(log_capital_above(1, 128, 0, -margin)) >= threshold and \
            float(log_capital_below(1, 128, 0, margin)) >= threshold
        minus = float(log_capital_above(1, 127, 1, -margin)) >= threshold and \
            float(log_capital_below(1, 127, 1, margin)) >= threshold
        if minus and not level:
            assert could_decide(look, 1, float(margin), intervals, 1)
            return
    pytest.fail("no margin where a floor-only parting decides and a level prompt does not")


def test_one_verdict_whatever_the_batching_and_the_gate_never_contradicts_it():
    """The decision at a look depends on counts only: the same outcomes in rounds of 8, 16, 32
    or at once, shuffled within, decide alike at the last look; and over every count at n = 24,
    a gate fail at any X ≥ 0 is always "changes outputs", a "within noise" always passes at
    X ≥ margin."""
    rng = np.random.default_rng(0)
    d = list(rng.choice([1, 0, 0, 0, -1], size=64))
    once = decide({"c": [d]}, {"c": [64]})["c"]
    shuffled = list(rng.permutation(d))
    again = decide({"c": [shuffled]}, {"c": [64]})["c"]
    assert (once.verdict, once.look.low, once.look.high) == (again.verdict, again.look.low, again.look.high)
    n, margin, intervals = 24, 0.2, 1
    for u in range(n + 1):
        for w in range(n + 1 - u):
            look = Look.of([[1] * u + [0] * (n - u - w) + [-1] * w], n, intervals, ALPHA)
            changes = "c" in e_bh({"c": look.e_changes}, ALPHA, 1)
            for bound in (0.0, 0.05, 0.2, 0.5):
                if look.low > bound:
                    assert changes, (u, w, bound)
                if look.within(margin) and bound >= margin:
                    assert look.high <= bound


def test_rounds_decide_a_clear_change_and_a_clear_equality_and_stop_what_cannot_be_decided():
    ones, zeros = [1] * 400, [0] * 400
    looks = [8, 16, 32, 64, 128, 256, 400]
    out = decide({"change": [ones], "level": [zeros], "mixed": [[1, 0, -1, 0] * 100]},
                 {k: looks for k in ("change", "level", "mixed")}, margin=0.05)
    assert out["change"].verdict == "changes outputs" and out["change"].round == 2  # 16 ones: e ≥ 3/α
    assert out["level"].verdict == "within noise" and out["level"].look.n == 256
    assert out["mixed"].verdict is None
    # a comparison against two floors must be above both
    both = decide({"c": [ones, zeros]}, {"c": looks})["c"]
    assert both.verdict is None


def test_the_prompts_needed_are_the_rules_own():
    # nothing ever parts: the counts are certain, so the estimate is the first n the rule decides at
    need = prompts_needed(0.0, 0.0, "within", margin=0.05)
    assert decides("within", 0, need, 0, margin=0.05) and not decides("within", 0, need - 1, 0, margin=0.05)
    # always parted in the comparison only: the first n whose capital passes 1/α
    need = prompts_needed(1.0, 0.0, "changes")
    assert math.exp(float(log_capital_above(need, 0, 0, 0.0))) >= 20 > math.exp(float(log_capital_above(need - 1, 0, 0, 0.0)))
    assert prompts_needed(0.0, 0.0, "changes") is None  # nothing parts: "changes outputs" is never shown


def test_the_table_of_prompts_needed_in_the_docs_is_the_rules_own():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "decision.md").read_text()
    table = text[text.index("| comparison parts on |"):].split("\n\n")[0].splitlines()[2:]
    columns = [(0.05, 1), (0.05, 20), (0.10, 1), (0.10, 5)]
    rates = {"none": 0.0, "2%": 0.02, "10%": 0.10, "25%": 0.25, "60%": 0.60}
    assert len(table) == len(rates)
    for line in table:
        cells = [c.strip() for c in line.strip("|").split("|")]
        for (margin, m), shown in zip(columns, cells[1:]):
            assert int(shown) == prompts_needed(rates[cells[0]], 0.0, "verdict", margin=margin, intervals=m, judged=m)


def test_a_gated_comparison_goes_on_after_its_verdict_until_the_gate_is_decided():
    """Half the prompts part where the floor never does: "changes outputs" is shown at 16, but
    its interval then still reaches below a gate at 10%; gated, it goes on (its verdict and the
    prompts it took kept) until the interval lies above 10%; ungated it stops at 16."""
    d = [1, 0] * 40
    looks = {"c": [16, 32, 64, 80]}
    alone = decide({"c": [d]}, looks, margin=0.1)["c"]
    assert alone.verdict == "changes outputs" and alone.look.n == 16 and not alone.open
    gated = decide({"c": [d]}, looks, margin=0.1, gates={"c": 0.10})["c"]
    assert gated.verdict == "changes outputs" and gated.decided_n == 16 and gated.round == 1
    assert gated.look.n == 32 and gated.look.low > 0.10 and not gated.open
    assert alone.look.low <= 0.10  # at 16 prompts the gate could not have said "fail"
    # in progress: after round 1 it is still open for the gate
    assert decide({"c": [d[:16]]}, looks, margin=0.1, gates={"c": 0.10}, through=1)["c"].open
