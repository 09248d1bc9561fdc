"""The summary's verdict rows, every one from the decision module (`analysis.decision`): which
floors a comparison is judged against, e-BH across the study, the words, what `plan` says of
the rule; and the report's descriptive helpers (a floor's bound, the first-divergence curve)."""

from __future__ import annotations

import math

import pytest

from tokenflip.analysis.decision import Look, e_bh, interval, with_decisions
from tokenflip.analysis.verdict import larger_floor, still_identical, upper_bound


def ids(*numbers):
    return [f"p{i}" for i in numbers]


def row(axis, a, b, k, n=12, status="done"):
    return {"pair_id": f"{axis}/{a}/{b}", "axis": axis, "cell_a": a, "cell_b": b, "n_diverged": k, "n_prompts": n,
            "status": status}


def _judge(rows, n=12, parted=None):
    parted = parted or {}
    outcomes = {r["pair_id"]: (ids(*range(r["n_prompts"])), set(parted.get(r["pair_id"], ids(*range(r["n_diverged"])))))
                for r in rows}
    return with_decisions(rows, outcomes, lambda r: [r["n_prompts"]])


def test_each_pair_is_judged_against_every_floor_of_either_run_of_its_cells():
    rows = [
        row("repeat", "bf16", "bf16-r2", 0, 64),     # bf16 repeats itself: floor 0
        row("repeat", "fp16", "fp16-r2", 2, 64),     # fp16 does not: 2 of 64
        row("precision", "bf16", "fp16", 64, 64),    # judged against both floors
        row("precision", "bf16-r2", "fp32", 0, 64),  # the second run carries the floor too
        row("precision", "fp32", "fp64", 3, 64),     # neither cell was repeated
        row("batch_size", "x", "y", 0, 64, status="missing"),
    ]
    out = _judge(rows)
    assert [r["verdict"] for r in out] == ["noise floor", "noise floor", "changes outputs", "undecided", "no floor",
                                          None]
    # against the 2-of-64 floor, 62 prompts parted in the comparison only: the smaller capital decides
    counts = [(c["only_comparison"], c["neither_or_both"], c["only_floor"]) for c in
              __import__("json").loads(out[2]["floors_paired"])]
    assert sorted(counts) == [(62, 2, 0), (64, 0, 0)]
    low, high = interval(62, 2, 0, intervals=6)
    assert out[2]["interval_low"] == pytest.approx(low) and out[2]["interval_high"] == pytest.approx(1.0, abs=1e-9)
    assert out[2]["comparisons_tested"] == 2 and out[3]["comparisons_tested"] == 2 and out[2]["intervals"] == 6
    assert out[3]["prompts_needed"] and "undecided at its maximum of 64 prompts (0 parted" in out[3]["verdict_words"]
    assert out[4]["interval_of"] == "rate" and "repeat" in out[4]["verdict_words"]
    assert "guarantee" in out[0] and "e-BH over 2 comparisons" in out[0]["guarantee"]


def test_many_comparisons_share_e_bh_and_accuracy_is_judged_by_the_same_rule():
    """Five comparisons parting on 12 of 12 against a floor of 0 each reach K = mean(1 + s)^12:
    alone a change; e-BH over them and twenty that parted on none still declares the five
    (five e-values each at least 25/(0.05·5) = 100), not a sixth."""
    rows = [row("repeat", "a", "a2", 0)] + [row("order", "a", f"b{i}", 12) for i in range(5)]
    rows += [row("load", "a", f"c{i}", 0) for i in range(20)]
    out = _judge(rows)
    assert [r["verdict"] for r in out[1:6]] == ["changes outputs"] * 5
    assert {r["verdict"] for r in out[6:]} == {"undecided"}
    e = out[1]["e_value"]
    assert e >= 100 and e_bh({i: e for i in range(5)}, family=25) == set(range(5))


def test_accuracy_drops_are_e_bh_over_the_comparisons_scored():
    rows = [row("repeat", "a", "a2", 0, 40), row("precision", "a", "b", 0, 40)]
    outcomes = {r["pair_id"]: (ids(*range(40)), set()) for r in rows}
    correct = {rows[1]["pair_id"]: [(p, True, i >= 30) for i, p in enumerate(ids(*range(40)))]}  # 30 right → wrong
    out = with_decisions(rows, outcomes, lambda r: [40], correct=correct)
    assert out[1]["accuracy_dropped"] is True and out[0]["accuracy_dropped"] is False
    correct = {rows[1]["pair_id"]: [(p, True, i % 2 == 0) for i, p in enumerate(ids(*range(4)))]}
    assert with_decisions(rows, outcomes, lambda r: [40], correct=correct)[1]["accuracy_dropped"] is False


def test_the_verdict_depends_on_the_looks_not_on_how_prompts_are_stored():
    """The same outcomes judged at one look of 64, and in rounds of 16, 32 and 64: a change
    clear by 16 prompts is decided in round 1 either way at the counts of its look."""
    rows = [row("repeat", "a", "a2", 0, 64), row("precision", "a", "b", 64, 64)]
    outcomes = {r["pair_id"]: (ids(*range(64)), set(ids(*range(r["n_diverged"])))) for r in rows}
    once = with_decisions(rows, outcomes, lambda r: [64])[1]
    rounds = with_decisions(rows, outcomes, lambda r: [16, 32, 64])[1]
    assert once["verdict"] == rounds["verdict"] == "changes outputs"
    assert once["prompts_decided"] == 64 and rounds["prompts_decided"] == 16 and rounds["round_decided"] == 1
    assert Look.of([[1] * 16], 16, 2, 0.05).low == pytest.approx(rounds["interval_low"])


def test_the_first_divergence_curve_ends_at_one_minus_parted_over_n():
    # parts at step 3 (no longer identical after 4 tokens), at step 5 (after 6) and step 8
    # (after 9); two end identical and stay so.
    times, share = still_identical([3, None, 5, 8, None])
    assert times == [4, 6, 9] and share == pytest.approx([0.8, 0.6, 0.4])
    assert share[-1] == pytest.approx(1 - 3 / 5)
    assert still_identical([None, None]) == ([], [])
    assert math.isnan(upper_bound(0, 0))


def test_larger_floor_is_the_one_a_settings_table_shows():
    assert larger_floor([(1, 64), (6, 64)]) == (6, 64) and larger_floor([None, None]) is None


def test_plan_says_what_the_rule_the_study_runs_can_decide():
    from conftest import tiny_study
    from tokenflip.analysis.decision import power, prompts_needed
    from tokenflip.analysis.power import power_lines
    from tokenflip.analysis.rounds import judged_pairs
    from tokenflip.study import config as cfg
    from tokenflip.study.plan import expand_cells, expand_pairs

    study = tiny_study()
    study["verdict"] = {"rise": 0.5, "bound": 0.2}
    config = cfg.validate(study, check_data=False)
    pairs = expand_pairs(config, expand_cells(config))
    lines = power_lines(config, pairs)
    judged = len(judged_pairs(pairs))
    assert lines[0].startswith(f"the rule: {judged} comparisons judged")
    comp = config["comparisons"][0]
    bench = sorted({p.a.benchmark for p in pairs if p.axis == comp["axis"]})[0]
    n = config["benchmarks"][bench]["n"]
    levels = {"margin": config["verdict"]["margin"], "intervals": len(pairs), "judged": max(1, judged)}
    line = next(x for x in lines if x.startswith(f"comparison {comp['axis']}: {comp['a']} vs {comp['b']} on {bench}"))
    chance = power([n], 0.5, 0.0, "changes", **levels)
    assert f"with probability {chance:.0%}" in line
    need = prompts_needed(0.0, 0.0, "within", **levels)
    assert f"needs {need} prompts: not within this maximum" in line or f"is decided after {need} prompts" in line
    bounded = prompts_needed(0.0, 0.0, "gate", bound=0.2, **levels)
    assert any(x.endswith(f"shown at most 20% above its floor (verdict.bound) after {bounded} prompts"
                          + ("" if bounded <= n else ": not within this maximum")) for x in lines)


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


def test_a_floor_on_other_prompts_is_left_out_with_its_row():
    """Two repeat pairs of the comparison's cell, the first measured on other prompts only: the
    comparison is judged against the second, and its floor rate is that floor's, not the first's."""
    rows = [row("repeat", "a", "a-r2", 6, 12), row("repeat", "a", "a-r3", 3, 12), row("precision", "a", "b", 12, 12)]
    outcomes = {rows[0]["pair_id"]: ([f"q{i}" for i in range(12)], {f"q{i}" for i in range(6)}),
                rows[1]["pair_id"]: (ids(*range(12)), set(ids(*range(3)))),
                rows[2]["pair_id"]: (ids(*range(12)), set(ids(*range(12))))}
    out = with_decisions(rows, outcomes, lambda r: [12])
    assert out[2]["floor_rate"] == pytest.approx(3 / 12)
    assert len(__import__("json").loads(out[2]["floors_paired"])) == 1
