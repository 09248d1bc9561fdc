"""The verdict procedure, paired prompt by prompt, at its boundaries and on hand-worked
cases: 0 of n, all of n, a rate at its floor, two floors, no floor, no prompts; McNemar's
exact test and its size by exact enumeration for every n up to 64; Tango's interval against
McNemar's statistic (statsmodels) and rebuilt by numerical likelihood; the exact power `plan` prints; the
Benjamini–Hochberg adjustment (statsmodels); how many prompts a bound needs; the
first-divergence curve."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, binomtest
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import confint_proportions_2indep

from tokenflip.analysis.paired import (
    PairedCounts,
    detectable_rise,
    exact_p_above,
    least_rejected,
    power_above,
    prompts_for_power,
    tango_interval,
)
from tokenflip.analysis.verdict import (
    judge,
    larger_floor,
    prompts_for_bound,
    still_identical,
    upper_bound,
    with_verdicts,
)


def ids(*numbers):
    return {f"p{i}" for i in numbers}


def versus(n, comparison, floor):
    """A comparison and one floor on prompts p0..p(n-1), from the prompts each parted on."""
    return PairedCounts.of(ids(*comparison), ids(*floor), ids(*range(n)))


def test_no_prompt_parted_is_said_as_such_with_the_exact_upper_bound():
    v = judge(0, 64, [versus(64, [], [])])
    # Clopper–Pearson at 0 of n, by hand: 1 - (0.025)^(1/n); 0 of 64 -> 5.6%
    assert v.label == "none parted" and v.upper_bound == pytest.approx(1 - 0.025 ** (1 / 64))
    assert v.words == "none parted: 0 of 64 prompts (at most 5.6% at 95%)"
    assert judge(0, 64).label == "none parted"  # no floor is needed to say nothing parted


def test_no_prompt_compared_gets_no_verdict():
    v = judge(0, 0)
    assert v.label is None and "no verdict" in v.words and math.isnan(v.rate)


def test_three_of_twelve_against_none_of_twelve_is_not_yet_a_change():
    """The exact paired test: 3 prompts parted only in the comparison, none only in the
    floor: P(3 of 3 | 3 discordant, 1/2) = 1/8, not below 5%."""
    v = judge(3, 12, [versus(12, [0, 1, 2], [])])
    assert v.p_above == pytest.approx(0.125) and v.label == "undecided"
    five = judge(5, 12, [versus(12, range(5), [])])
    assert five.p_above == pytest.approx(1 / 32) and five.label == "changes outputs"


def test_partings_the_floor_shares_carry_no_evidence_either_way():
    # The comparison parts on 4, its floor on the same 4: nothing discordant, no excess.
    v = judge(4, 12, [versus(12, range(4), range(4))])
    assert v.excess == 0 and v.p_above == 1.0 and v.label == "undecided"


def test_pairing_narrows_the_interval_where_partings_overlap():
    """94 of 1000 against 94 of 1000, 80 of them the same prompts: 14 discordant each way. The
    paired (Tango) 90% interval is ±0.91 pp; the unpaired Newcombe one ±2.15 pp."""
    low, high = tango_interval(14, 14, 1000, alpha=0.1)
    assert (low, high) == pytest.approx((-0.0091, 0.0091), abs=5e-5)
    unpaired = confint_proportions_2indep(94, 1000, 94, 1000, method="newcomb", alpha=0.1)
    assert float(unpaired[1]) == pytest.approx(0.0215, abs=5e-5)
    v = judge(94, 1000, [versus(1000, range(94), [*range(80), *range(94, 108)])])
    assert v.label == "within noise" and (v.excess_low, v.excess_high) == pytest.approx((low, high))


@pytest.mark.parametrize("b,c,n", [(3, 0, 12), (5, 1, 40), (14, 14, 1000), (20, 5, 100), (0, 6, 30), (7, 1, 21)])
def test_tangos_interval_excludes_zero_exactly_where_mcnemars_score_test_rejects(b, c, n):
    """At δ = 0 Tango's score statistic is McNemar's (b − c)/√(b + c) (statsmodels' chi-square
    without continuity correction is its square); swapping the sides mirrors the interval."""
    low, high = tango_interval(b, c, n)
    chi2 = mcnemar([[n - b - c, b], [c, 0]], exact=False, correction=False)
    assert (low > 0 or high < 0) == (chi2.pvalue < 0.05)
    assert tango_interval(c, b, n) == pytest.approx((-high, -low))
    assert low <= (b - c) / n <= high


@pytest.mark.parametrize("b,c,n", [(1, 7, 21), (6, 0, 12), (20, 5, 100)])
def test_tangos_interval_is_the_set_where_the_score_statistic_stays_within_z(b, c, n):
    """Tango's interval rebuilt another way: the restricted maximum-likelihood share found by
    numerical maximisation (scipy) instead of the closed-form root, the score statistic on
    a fine grid of δ, and the interval read off where |Z| ≤ 1.96."""
    from scipy.optimize import minimize_scalar

    def z_of(delta):
        low, high = max(0.0, -delta) + 1e-12, (1 - delta) / 2 - 1e-12

        def minus_loglik(q):
            return -(b * math.log(q + delta) + c * math.log(q) + (n - b - c) * math.log(1 - 2 * q - delta))

        q = minimize_scalar(minus_loglik, bounds=(low, high), method="bounded", options={"xatol": 1e-12}).x
        return (b - c - n * delta) / math.sqrt(n * (2 * q + delta - delta * delta))

    grid = np.linspace(-0.999, 0.999, 3997)
    inside = [d for d in grid if abs(z_of(d)) <= 1.959964]
    low, high = tango_interval(b, c, n)
    assert (low, high) == pytest.approx((min(inside), max(inside)), abs=1e-3)


def test_the_exact_test_is_scipys_binomial_test_on_the_discordant_prompts():
    for b, c in [(0, 0), (3, 0), (5, 1), (10, 10), (2, 9)]:
        expected = binomtest(b, b + c, 0.5, alternative="greater").pvalue if b + c else 1.0
        assert exact_p_above(b, c) == pytest.approx(expected)
    for d in range(0, 70):  # the fewest comparison-only partings it rejects at, against brute force
        first = next((k for k in range(d + 1) if binom.sf(k - 1, d, 0.5) <= 0.05), d + 1) if d else 1
        assert int(least_rejected(d, 0.05)) == first or (first == d + 1 and least_rejected(d, 0.05) > d)


def test_changes_outputs_holds_its_size_for_every_n_up_to_64():
    """Exact enumeration: whatever the share of discordant prompts, when the comparison and its
    floor part equally often the rule says "changes outputs" at most 5% of the time."""
    worst = 0.0
    for n in range(1, 65):
        d = np.arange(n + 1)
        least = least_rejected(d, 0.05)
        reject_given_d = np.where(least <= d, binom.sf(least - 1, d, 0.5), 0.0)
        for discordant in np.linspace(0.01, 1.0, 100):
            worst = max(worst, float(np.sum(binom.pmf(d, n, discordant) * reject_given_d)))
    assert worst <= 0.05


def test_two_floors_the_comparison_must_exceed_each():
    """100 of 1000 against a floor of 0 and a floor of 100 (80 shared): clearly above the
    first, not above the second: undecided, saying which; never "within noise"."""
    zero = versus(1000, range(100), [])
    noisy = versus(1000, range(100), [*range(80), *range(100, 120)])
    v = judge(100, 1000, [zero, noisy])
    assert v.label == "undecided" and v.floor == pytest.approx(0.1) and "more than the 0.0% floor" in v.words
    assert judge(100, 1000, [zero]).label == "changes outputs"
    assert judge(100, 1000, [noisy]).label == "within noise"


def test_without_a_floor_no_verdict_is_assumed():
    v = judge(6, 64)
    assert v.label == "no floor" and v.floor is None and "repeat" in v.words


def test_larger_floor_is_the_one_a_settings_table_shows():
    assert larger_floor([(1, 64), (6, 64)]) == (6, 64) and larger_floor([None, None]) is None


@pytest.mark.parametrize("bound", [0.2, 0.056, 0.05, 0.01])
def test_prompts_for_a_bound_are_the_fewest_whose_zero_result_gives_it(bound):
    n = prompts_for_bound(bound)
    assert upper_bound(0, n) <= bound < upper_bound(0, n - 1)
    assert prompts_for_bound(0.056) == 65  # 0 of 64 bounds at 5.60%, just above
    with pytest.raises(ValueError):
        prompts_for_bound(0.0)


def test_the_power_plan_prints_is_the_exact_rules_own():
    # Against a floor of 0 the exact test needs 5 comparison-only partings (0.5^5 < 0.05):
    # the power is P(Binomial(n, rate) >= 5), by hand.
    assert power_above(12, 0.5, 0.0) == pytest.approx(float(binom.sf(4, 12, 0.5)))
    rise = detectable_rise(12, 0.0)
    assert float(binom.sf(4, 12, rise)) == pytest.approx(0.8, abs=1e-6)
    n = prompts_for_power(0.2, 0.0)
    assert power_above(n, 0.2, 0.0) >= 0.8 > power_above(n - 1, 0.2, 0.0)
    assert prompts_for_power(0.1, 0.2) is None and detectable_rise(3, 0.0) is None  # 3 prompts never reach 5


def test_the_first_divergence_curve_ends_at_one_minus_parted_over_n():
    # parts at step 3 (no longer identical after 4 tokens), at step 5 (after 6) and step 8
    # (after 9); two end identical and stay so.
    times, share = still_identical([3, None, 5, 8, None])
    assert times == [4, 6, 9] and share == pytest.approx([0.8, 0.6, 0.4])
    assert share[-1] == pytest.approx(1 - 3 / 5)
    assert still_identical([None, None]) == ([], [])
    assert math.isnan(upper_bound(0, 0))


def test_plan_says_what_each_comparisons_prompts_can_show():
    from conftest import tiny_study
    from tokenflip.analysis.power import power_lines
    from tokenflip.study import config as cfg
    from tokenflip.study.plan import expand_cells, expand_pairs

    study = tiny_study()
    study["verdict"] = {"bound": 0.056, "rise": 0.2}
    config = cfg.validate(study, check_data=False)
    lines = power_lines(config, expand_pairs(config, expand_cells(config)))
    comp = config["comparisons"][0]
    n = config["benchmarks"][next(iter(config["benchmarks"]))]["n"]
    head = f"comparison {comp['axis']}: {comp['a']} vs {comp['b']}"
    assert f"{head}: {n} prompts a pair: 0 parted would bound the rate at {upper_bound(0, n):.1%} (95%)" in lines[0]
    rise = detectable_rise(n, 0.0)
    assert lines[0].endswith(f"detects a rise of {rise:.1%} at 80% power" if rise else
                             "detects no rise at 80% power (too few prompts)")
    assert f"{head}: bounding the rate at 5.6% takes 65 prompts a pair" in lines
    assert f"{head}: detecting a rise of 20.0% above a floor of 0 at 80% power takes {prompts_for_power(0.2, 0.0)} " \
           f"prompts a pair" in lines


def row(axis, a, b, k, n=12, status="done"):
    return {"pair_id": f"{axis}/{a}/{b}", "axis": axis, "cell_a": a, "cell_b": b, "n_diverged": k, "n_prompts": n,
            "status": status}


def test_each_pair_is_judged_against_every_floor_of_either_run_of_its_cells_with_bh_across_the_study():
    rows = [
        row("repeat", "bf16", "bf16-r2", 0),     # bf16 repeats itself: floor 0 of 12
        row("repeat", "fp16", "fp16-r2", 2),     # fp16 does not: 2 of 12
        row("precision", "bf16", "fp16", 12),    # judged against both floors
        row("precision", "bf16-r2", "fp32", 0),  # the second run carries the floor too
        row("precision", "fp32", "fp64", 3),     # neither cell was repeated
        row("batch_size", "x", "y", 0, status="missing"),
    ]
    outcomes = {r["pair_id"]: (ids(*range(12)), ids(*range(r["n_diverged"]))) for r in rows}
    out = with_verdicts(rows, outcomes)
    assert [r["verdict"] for r in out] == ["noise floor", "noise floor", "changes outputs", "none parted", "no floor",
                                          None]
    # bf16 vs fp16 against 0 of 12 (12 discordant) and against 2 of 12 (10 discordant): the
    # larger p decides; Benjamini–Hochberg over the two pairs tested against a floor.
    p = binomtest(10, 10, 0.5, alternative="greater").pvalue
    assert out[2]["p_above"] == pytest.approx(p) and out[2]["floor_rate"] == pytest.approx(2 / 12)
    assert out[2]["p_adjusted"] == pytest.approx(multipletests([p, 1.0], method="fdr_bh")[1][0])
    assert out[2]["comparisons_tested"] == 2 and out[3]["comparisons_tested"] == 2
    assert "0 of 12 prompts parted when the same setting ran again (at most 26.5% at 95%)" in out[0]["verdict_words"]


def test_many_comparisons_are_adjusted_before_changes_outputs_is_said():
    """Five comparisons, each 5 of 12 against a floor of 0: p = 1/32 each, alone a change; with
    twenty more that parted on none, Benjamini–Hochberg leaves them undecided."""
    rows = [row("repeat", "a", "a2", 0)] + [row("order", "a", f"b{i}", 5) for i in range(5)]
    outcomes = {r["pair_id"]: (ids(*range(12)), ids(*range(r["n_diverged"]))) for r in rows}
    assert {r["verdict"] for r in with_verdicts(rows, outcomes)[1:]} == {"changes outputs"}
    more = rows + [row("load", "a", f"c{i}", 0) for i in range(20)]
    outcomes.update({r["pair_id"]: (ids(*range(12)), set()) for r in more[6:]})
    judged = with_verdicts(more, outcomes)
    assert {r["verdict"] for r in judged[1:6]} == {"undecided"}
    assert judged[1]["p_adjusted"] == pytest.approx(min(1.0, (1 / 32) * 25 / 5))
    assert "adjusted over 25 comparisons" in judged[1]["verdict_words"]


def test_the_curve_pools_a_comparisons_first_runs_only():
    """A setting's second run pairs the same prompts again: the curve of fp32 vs bf16 counts
    the first runs' prompts once, and the repeat comparison keeps its own curve."""
    import pandas as pd

    from conftest import tiny_study
    from tokenflip.analysis.floors import still_identical_rows
    from tokenflip.study import config as cfg
    from tokenflip.study.plan import expand_cells, expand_pairs

    study = tiny_study()
    study["grids"] = [{"precision": ["fp32", "bf16"], "cache": ["on"], "batch_size": [1], "repeat": ["default", 2]}]
    study["comparisons"] = [{"axis": "precision", "a": "fp32", "b": "bf16"}, {"axis": "repeat", "a": "default", "b": 2}]
    study["benchmarks"] = {"arith_a": study["benchmarks"]["arith_a"]}
    del study["probes"]
    config = cfg.validate(study, check_data=False)
    pairs = expand_pairs(config, expand_cells(config))
    assert sorted((p.axis, str(p.a.repeat)) for p in pairs) == [("precision", "2"), ("precision", "default"),
                                                                 ("repeat", "default"), ("repeat", "default")]

    def frame(first):
        return pd.DataFrame({"first_div_step": first, "n_tokens_a": [6, 6], "n_tokens_b": [6, 6]})

    per_prompt = {p.id: frame([1, None] if p.axis == "precision" and str(p.a.repeat) == "default" else
                              [0, 0] if p.axis == "precision" else [None, None]) for p in pairs}
    rows = pd.DataFrame(still_identical_rows(pairs, per_prompt))
    precision = rows[rows["axis"] == "precision"]
    # 2 prompts (the second run's 2 are left out): one parts at step 1 (after 2 tokens), one
    # is identical through its 6 and stays so: 1 -> 1/2 after 2 tokens, to the end at 6
    assert precision[["tokens", "still_identical"]].values.tolist() == [[0, 1.0], [2, 0.5], [6, 0.5]]
    assert set(precision["n_prompts"]) == {2} and set(precision["comparison"]) == {"precision: fp32 vs bf16"}
    repeat = rows[rows["axis"] == "repeat"]
    assert repeat[["tokens", "still_identical"]].values.tolist() == [[0, 1.0], [6, 1.0]]
    assert set(repeat["n_prompts"]) == {4}
