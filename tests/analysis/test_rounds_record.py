"""The verdicts of a study of rounds, on outcomes whose answer is known: a comparison whose
every prompt parts where its floor's never does is decided "changes outputs" in the first
round whose end shows it; one level with its floor stopped at a maximum too small to show it
within the margin says so and what it would need; a study without rounds is judged by the same
rule at its n; and a real round's record stops what it decided."""

from __future__ import annotations

import math

import pandas as pd

from conftest import tiny_study
from tokenflip.analysis.decision import log_capital_above, outcome_sequence, prompts_needed
from tokenflip.analysis.rounds import judged_pairs, question
from tokenflip.analysis.summary import verdict_rows
from tokenflip.study import config as cfg
from tokenflip.study.plan import expand_cells, expand_pairs


def study(**top):
    s = tiny_study()
    s["benchmarks"] = {"a": {"kind": "arithmetic", "n": 32, "max_new_tokens": 4}}
    s["grids"] = [{"precision": ["fp32", "bf16"], "cache": ["on"], "batch_size": [1]},
                  {"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "repeat": [2]}]
    s["comparisons"] = [{"axis": "precision", "a": "fp32", "b": "bf16"}, {"axis": "repeat", "a": "default", "b": 2}]
    s["probes"] = {}
    return cfg.validate({**s, **top}, check_data=False)


def rows_and_outcomes(config, comparison_parts, floor_parts, n=32):
    pairs = expand_pairs(config, expand_cells(config))
    prompts = [f"p{i:02d}" for i in range(n)]
    per_prompt, rows = {}, []
    for pair in pairs:
        parts = floor_parts if pair.axis == "repeat" else comparison_parts
        per_prompt[pair.id] = pd.DataFrame({"prompt_id": prompts, "identical": [not parts(i) for i in range(n)]})
        rows.append({"pair_id": pair.id, "status": "done", "axis": pair.axis, "benchmark": "a",
                     "cell_a": pair.a.id, "cell_b": pair.b.id, "n_prompts": n,
                     "n_diverged": sum(parts(i) for i in range(n))})
    return rows, per_prompt, pairs


def test_every_prompt_parted_is_decided_in_the_round_that_shows_it():
    config = study(blocks={"first": 4}, rounds={})
    rows, per_prompt, pairs = rows_and_outcomes(config, lambda i: True, lambda i: False)
    row = next(r for r in verdict_rows(config, rows, per_prompt, pairs) if r["axis"] == "precision")
    # e-BH over the one judged comparison: the first round end whose capital reaches 1/α
    ends = [4, 8, 16, 32]
    decided_in = next(i + 1 for i, end in enumerate(ends) if math.exp(float(log_capital_above(end, 0, 0, 0.0))) >= 20)
    assert row["verdict"] == "changes outputs" and row["round_decided"] == decided_in == 2
    assert row["prompts_decided"] == ends[decided_in - 1]
    assert row["verdict_words"].startswith(f"changes outputs: shown in round {decided_in} of 4, after "
                                           f"{ends[decided_in - 1]} prompts (e-value")


def test_level_with_the_floor_at_too_small_a_maximum_says_what_it_would_need():
    config = study(blocks={"first": 8}, rounds={})
    parts = lambda i: i % 4 == 0  # noqa: E731  the comparison and its floor part on the same prompts
    rows, per_prompt, pairs = rows_and_outcomes(config, parts, parts)
    row = next(r for r in verdict_rows(config, rows, per_prompt, pairs) if r["axis"] == "precision")
    assert row["verdict"] == "undecided" and row["round_decided"] is None
    # every outcome paired (D = 0); a later run of partings could still show a change, so it runs to 32
    assert not row["stopped_early"] and row["prompts_decided"] == 32
    assert row["prompts_needed"] == prompts_needed(0.0, 0.0, "verdict", start=32, margin=0.05, intervals=2, judged=1)
    assert row["verdict_words"].startswith("undecided at its maximum of 32 prompts (8 parted")
    assert f"about {row['prompts_needed']} prompts in all would decide it" in row["verdict_words"]


def test_none_parted_is_judged_like_any_comparison_and_without_rounds_the_same_rule_holds():
    config = study(blocks={"first": 8}, rounds={})
    rows, per_prompt, pairs = rows_and_outcomes(config, lambda i: False, lambda i: False)
    row = next(r for r in verdict_rows(config, rows, per_prompt, pairs) if r["axis"] == "precision")
    assert row["verdict"] == "undecided" and "(0 parted" in row["verdict_words"]  # one verdict, never "none parted"
    fixed = study()
    rows, per_prompt, pairs = rows_and_outcomes(fixed, lambda i: True, lambda i: False)
    row = next(r for r in verdict_rows(fixed, rows, per_prompt, pairs) if r["axis"] == "precision")
    assert row["verdict"] == "changes outputs" and row["round_decided"] == 1 and row["prompts_decided"] == 32
    assert row["verdict_words"].startswith("changes outputs: shown after 32 prompts (e-value")


def test_each_round_asks_its_own_question():
    config = study(blocks={"first": 8}, rounds={})
    judged = judged_pairs(expand_pairs(config, expand_cells(config)))
    assert [p.axis for p, floors in judged] == ["precision"] and [f.axis for f in judged[0][1]] == ["repeat"]
    asked = question(config, judged, 2)
    assert asked["prompts"] == {"a": 16} and asked["rounds"] == {"a": 3} and asked["tested"] == 1
    assert question(config, judged, 4)["prompts"] == {}
    assert outcome_sequence(["x", "y", "z"], {"x", "z"}, ["x", "y"], {"y"}) == [1, -1]


def decoding_and_cache_study(**top):
    """Greedy vs sampling at temperature 1 and cache on vs off, against greedy run again, on 20
    arithmetic prompts of a tiny random llama in blocks of 10."""
    s = tiny_study()
    s["benchmarks"] = {"a": {"kind": "arithmetic", "n": 20, "max_new_tokens": 6}}
    s["decoding"] = {"greedy": {"strategy": "greedy"}, "hot": {"strategy": "sample", "temperature": 1.0}}
    s["grids"] = [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "decoding": ["greedy", "hot"]},
                  {"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "repeat": [2]},
                  {"precision": ["fp32"], "cache": ["on", "off"], "batch_size": [1]}]
    s["comparisons"] = [{"axis": "decoding", "a": "greedy", "b": "hot"}, {"axis": "repeat", "a": "default", "b": 2},
                        {"axis": "cache", "a": "on", "b": "off"}]
    return {**s, "probes": {}, "blocks": {"first": 10}, **top}


def test_a_round_stops_what_it_decided_and_sends_on_only_the_cells_still_needed(prepared_models, tmp_path):
    """Round 1 of a real study (blocks made by the cell runner on a tiny random llama): greedy
    vs sampling at temperature 1 parts on every one of 10 prompts where greedy run again parts on
    none, which the e-process shows by 10 prompts among 2 judged comparisons (e-BH: 2/α = 40):
    decided, and its sampled cell goes no further; the second comparison, level with its floor,
    stays open, and only its cells and its floor's go on."""
    import json

    from tokenflip.analysis.rounds import decide_round
    from tokenflip.core.layout import RunLayout
    from tokenflip.run.cell import run_cell
    from tokenflip.study.plan import cell_job

    config = cfg.validate(decoding_and_cache_study(rounds={}), check_data=False)
    layout = RunLayout(config["run"], root=str(tmp_path))
    cells = expand_cells(config)
    for cell in cells:
        run_cell(cell_job(config, cell).block(0, 10), prepared_models("llama"), layout.block(cell.id, 0, 10),
                 progress=False)
    judged = judged_pairs(expand_pairs(config, cells))
    decoding = next(p for p, _ in judged if p.axis == "decoding")
    cache = next(p for p, _ in judged if p.axis == "cache")
    record = decide_round(config, layout, 1, judged, None, tmp_path / "1.json")
    assert record == json.loads((tmp_path / "1.json").read_text())
    assert math.exp(float(log_capital_above(10, 0, 0, 0.0))) >= 40
    assert record["decided"] == {decoding.id: {"verdict": "changes outputs", "prompts": 10, "round": 1}}
    # cache on vs off in fp32 agrees token for token: level with its floor, not yet shown within ±5 pp
    assert record["open"] == [cache.id]
    assert record["continue"] == sorted({c.id for p in (cache, *dict(judged)[cache]) for c in (p.a, p.b)})
    assert decoding.b.id not in record["continue"]


def test_a_time_budget_stops_the_round_its_cells_own_seconds_say_would_pass_it(prepared_models, tmp_path):
    """Round 1 of four real cells (10 prompts a block, each block's job 5 s by its record): 20 s
    spent, and the next round's 3 cells of the open comparison predicted at 0.5 s a prompt, 15
    s. A budget of 1 min starts it; one of 30 s does not: the open comparison stops there,
    undecided, its words naming the budget, and no cell goes on."""
    import json

    from tokenflip.analysis.rounds import decide_round, stopped_at_budget
    from tokenflip.core import storage
    from tokenflip.core.layout import RunLayout
    from tokenflip.run.cell import run_cell
    from tokenflip.study.plan import cell_job

    roomy = cfg.validate(decoding_and_cache_study(rounds={"budget": "1 min"}), check_data=False)
    tight = cfg.validate(decoding_and_cache_study(rounds={"budget": "30 s"}), check_data=False)
    layout = RunLayout(roomy["run"], root=str(tmp_path))
    cells = expand_cells(roomy)
    assert len(cells) == 4
    for cell in cells:
        path = layout.block(cell.id, 0, 10)
        run_cell(cell_job(roomy, cell).block(0, 10), prepared_models("llama"), path, progress=False)
        table, meta = storage.read_cell(path)  # the job's time as a job of its own would record it
        storage.write_table(table.replace_schema_metadata({}), path,
                            {k: v for k, v in {**meta, "job_seconds": 5.0}.items()
                             if k not in ("schema_version", "table_sha256", "meta_sha256")})
    judged = judged_pairs(expand_pairs(roomy, cells))
    cache = next(p for p, _ in judged if p.axis == "cache")
    going = decide_round(roomy, layout, 1, judged, None, tmp_path / "roomy.json")
    assert going["budget"] == {"budget": "1 min", "seconds": 60.0, "spent_seconds": 20.0, "next_round_seconds": 15.0,
                               "stops": False}
    assert going["open"] == [cache.id] and len(going["continue"]) == 3
    stopped = decide_round(tight, layout, 1, judged, None, layout.round(1))
    assert stopped["budget"]["stops"] is True and stopped["open"] == [] and stopped["continue"] == []
    assert stopped["stopped"][cache.id] == {"prompts": 10, "round": 1, "maximum": 20, "budget": "30 s"}
    assert stopped_at_budget(tight, layout) == {cache.id: (1, "30 s")}
    assert json.loads(open(layout.round(1)).read())["decided"] == going["decided"]  # the budget decides nothing

    rows, per_prompt, pairs = rows_and_outcomes(tight, lambda i: False, lambda i: False, n=10)
    row = next(r for r in verdict_rows(tight, rows, per_prompt, pairs, stopped_at_budget(tight, layout))
               if r["axis"] == "cache")
    assert row["verdict"] == "undecided"
    assert "undecided stopped at the study's time budget (30 s) after 10 prompts" in row["verdict_words"]


def test_a_comparison_stopped_at_the_budget_is_replayed_with_its_own_maximum():
    """Stopped by the budget after round 2 of 16, 32, ... 320 prompts, a comparison is closed
    there, undecided: the rule still weighs the prompts its maximum would have given (with
    only 32 to go it would have stopped early, at 16, which no round did)."""
    from tokenflip.analysis.decision import decide

    outcomes = {"c": [[-1] * 8 + [0] * 24]}
    looks = {"c": [16, 32, 64, 128, 256, 320]}
    stopped = decide(outcomes, looks, stops={"c": 2})["c"]
    assert (stopped.verdict, stopped.look.n, stopped.stopped_early, stopped.open, stopped.maximum) == \
        (None, 32, False, False, 320)
    cut = decide(outcomes, {"c": [16, 32]})["c"]
    assert (cut.look.n, cut.stopped_early) == (16, True)  # what replaying only the rounds it had would say
