"""The verdict procedure at its boundaries, on hand-worked cases, and against statsmodels'
own functions: 0 of n, all of n, a rate exactly at the floor, floors that differ between the
two sides, no floor; how many prompts a bound needs; the first-divergence curve."""

from __future__ import annotations

import math

import pytest
from statsmodels.stats.power import NormalIndPower
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_effectsize
from statsmodels.stats.proportion import test_proportions_2indep as score_test  # not a test of this module

from tokenflip.analysis.verdict import (
    detectable_difference,
    judge,
    larger_floor,
    prompts_for_bound,
    still_identical,
    upper_bound,
)


def test_zero_of_n_is_identical_with_the_exact_upper_bound():
    v = judge(0, 64, 0, 64)
    # Clopper–Pearson at 0 of n, by hand: 1 - (0.025)^(1/n); 0 of 64 -> 5.6%
    assert v.label == "identical" and v.upper_bound == pytest.approx(1 - 0.025 ** (1 / 64))
    assert "at most 5.6% at 95%" in v.words
    assert judge(0, 64).label == "identical"  # no floor is needed to say nothing parted


def test_all_of_n_against_a_floor_of_zero_changes_outputs():
    v = judge(64, 64, 0, 64)
    assert v.label == "changes outputs" and v.excess == 1.0 and v.excess_high == pytest.approx(1.0)
    low, high = confint_proportions_2indep(64, 64, 0, 64, method="newcomb", alpha=0.1)
    assert (v.excess_low, v.excess_high) == pytest.approx((low, high))


def test_a_rate_exactly_at_the_floor_is_within_noise_only_with_enough_prompts():
    # 6 of 64 against 6 of 64: no excess, but the interval (about ±8.9 pp) is wider than ±5 pp
    few = judge(6, 64, 6, 64)
    assert few.label == "undecided" and few.excess == 0 and few.excess_high > 0.05 and "more prompts" in few.words
    many = judge(94, 1000, 94, 1000)
    assert many.label == "within noise" and -0.05 < many.excess_low < 0 < many.excess_high < 0.05
    assert judge(6, 64, 6, 64, margin=0.10).label == "within noise"  # the margin is the study's to set


def test_floors_that_differ_between_the_sides_judge_against_the_larger():
    floor = larger_floor([(1, 64), (6, 64)])
    assert floor == (6, 64) and larger_floor([None, (2, 64)]) == (2, 64) and larger_floor([None, None]) is None
    assert judge(6, 64, *floor).label == "undecided"
    assert judge(6, 64, 1, 64).label == "changes outputs"  # against the smaller floor alone it would


def test_without_a_floor_no_verdict_is_assumed():
    v = judge(6, 64)
    assert v.label == "no floor" and v.floor is None and "repeat" in v.words


@pytest.mark.parametrize("k,n,fk,fn", [(6, 64, 1, 64), (12, 64, 2, 64), (30, 200, 10, 200), (3, 50, 5, 50)])
def test_the_figures_are_statsmodels_own(k, n, fk, fn):
    v = judge(k, n, fk, fn)
    low, high = confint_proportions_2indep(k, n, fk, fn, method="newcomb", alpha=0.1)
    assert (v.excess_low, v.excess_high) == pytest.approx((low, high))
    assert v.p_above == pytest.approx(score_test(k, n, fk, fn, method="score", alternative="larger").pvalue)
    assert (v.label == "changes outputs") == (low > 0)


@pytest.mark.parametrize("bound", [0.2, 0.056, 0.05, 0.01])
def test_prompts_for_a_bound_are_the_fewest_whose_zero_result_gives_it(bound):
    n = prompts_for_bound(bound)
    assert upper_bound(0, n) <= bound < upper_bound(0, n - 1)
    assert prompts_for_bound(0.056) == 65  # 0 of 64 bounds at 5.60%, just above
    with pytest.raises(ValueError):
        prompts_for_bound(0.0)


@pytest.mark.parametrize("n,floor", [(64, 0.0), (64, 0.05), (500, 0.1)])
def test_the_detectable_difference_has_the_power_it_claims(n, floor):
    d = detectable_difference(n, floor)
    power = NormalIndPower().power(effect_size=proportion_effectsize(floor + d, floor), nobs1=n, alpha=0.05,
                                   ratio=1.0, alternative="larger")
    assert power == pytest.approx(0.8, abs=1e-6) and 0 < d < 1 - floor


def test_the_first_divergence_curve_by_hand():
    # parts at step 3 (no longer identical after 4 tokens); identical through 5 (censored at
    # 5); parts at step 5 (after 6); at step 8 (after 9); identical through 10 (censored).
    times, share = still_identical([3, None, 5, 8, None], [9, 5, 9, 9, 10])
    # after 4: 5 at risk, 1 parts -> 4/5; after 6: 3 at risk (6, 9, 10), 1 parts -> 0.8 * 2/3;
    # after 9: 2 at risk -> 0.8 * 2/3 * 1/2
    assert times == [4, 6, 9] and share == pytest.approx([0.8, 0.8 * 2 / 3, 0.8 / 3])
    assert still_identical([None, None], [4, 6]) == ([], [])
    assert math.isnan(upper_bound(0, 0))


def test_plan_says_what_each_comparisons_prompts_can_show():
    from conftest import tiny_study
    from tokenflip.analysis.power import power_lines
    from tokenflip.study import config as cfg
    from tokenflip.study.plan import expand_cells, expand_pairs

    study = tiny_study()
    study["verdict"] = {"bound": 0.056}
    config = cfg.validate(study, check_data=False)
    lines = power_lines(config, expand_pairs(config, expand_cells(config)))
    comp = config["comparisons"][0]
    n = config["benchmarks"][next(iter(config["benchmarks"]))]["n"]
    head = f"comparison {comp['axis']}: {comp['a']} vs {comp['b']}"
    assert f"{head}: {n} prompts a pair: 0 parted would bound the rate at {upper_bound(0, n):.1%} (95%)" in lines[0]
    assert f"{head}: bounding the rate at 5.6% takes 65 prompts a pair" in lines


def test_each_pair_is_judged_against_the_floor_of_either_run_of_its_cells():
    from tokenflip.analysis.verdict import with_verdicts

    def row(axis, a, b, k, n=12):
        return {"axis": axis, "cell_a": a, "cell_b": b, "n_diverged": k, "n_prompts": n, "status": "done"}

    rows = with_verdicts([
        row("repeat", "bf16", "bf16-r2", 0),     # bf16 repeats itself: floor 0 of 12
        row("repeat", "fp16", "fp16-r2", 2),     # fp16 does not: 2 of 12
        row("precision", "bf16", "fp16", 12),    # judged against the larger floor, 2 of 12
        row("precision", "bf16-r2", "fp32", 0),  # the second run carries the floor too
        row("precision", "fp32", "fp64", 3),     # neither cell was repeated
        {**row("batch_size", "x", "y", 0), "status": "missing"},
    ])
    verdicts = [r["verdict"] for r in rows]
    assert verdicts == ["noise floor", "noise floor", "changes outputs", "identical", "no floor", None]
    assert rows[2]["floor_rate"] == pytest.approx(2 / 12) and rows[2]["excess"] == pytest.approx(10 / 12)
    low, _ = confint_proportions_2indep(12, 12, 2, 12, method="newcomb", alpha=0.1)
    assert rows[2]["excess_low"] == pytest.approx(low)
    assert "0 of 12 prompts parted when the same setting ran again (at most 26.5% at 95%)" in rows[0]["verdict_words"]


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
    # is identical through its 6 (censored): 1 -> 1/2 after 2 tokens, to the end at 6
    assert precision[["tokens", "still_identical"]].values.tolist() == [[0, 1.0], [2, 0.5], [6, 0.5]]
    assert set(precision["n_prompts"]) == {2} and set(precision["comparison"]) == {"precision: fp32 vs bf16"}
    repeat = rows[rows["axis"] == "repeat"]
    assert repeat[["tokens", "still_identical"]].values.tolist() == [[0, 1.0], [6, 1.0]]
    assert set(repeat["n_prompts"]) == {4}
