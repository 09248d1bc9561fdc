"""The verdicts of a study of rounds, on outcomes whose answer is known: a comparison whose
every prompt parts where its floor's never does is decided "changes outputs" in the round
whose end first passes the prompt where its e-process reaches 1/α; one level with its floor
stopped at a maximum too small to show it within the margin says so and what it would need;
none parted stays "none parted"; a study without rounds keeps the fixed-n verdicts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from conftest import tiny_study
from tokenflip.analysis import sequential
from tokenflip.analysis.rounds import judged_pairs, outcome_sequences, question
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
    reached = sequential.first_above(np.ones(32, dtype=int))
    ends = [4, 8, 16, 32]
    decided_in = next(i + 1 for i, end in enumerate(ends) if end >= reached)
    assert row["verdict"] == "changes outputs" and row["round_decided"] == decided_in
    assert row["prompts_decided"] == ends[decided_in - 1]
    assert row["verdict_words"].startswith(f"changes outputs: decided in round {decided_in} of 4, after "
                                           f"{ends[decided_in - 1]} prompts (32 of 32 parted")
    assert row["p_above"] == pytest.approx(sequential.anytime_p(np.ones(32, dtype=int)))


def test_level_with_the_floor_at_too_small_a_maximum_says_what_it_would_need():
    config = study(blocks={"first": 8}, rounds={})
    parts = lambda i: i % 4 == 0  # noqa: E731  the comparison and its floor part on the same prompts
    rows, per_prompt, pairs = rows_and_outcomes(config, parts, parts)
    row = next(r for r in verdict_rows(config, rows, per_prompt, pairs) if r["axis"] == "precision")
    assert row["verdict"] == "undecided" and row["round_decided"] is None
    assert row["prompts_needed"] == sequential.prompts_to_decide(0.0, 0.0, 0.05)  # every outcome paired: D = 0
    assert row["verdict_words"].startswith("undecided at its maximum of 32 prompts (8 parted")
    assert f"about {row['prompts_needed']} prompts in all would decide it" in row["verdict_words"]


def test_none_parted_stays_none_parted_and_without_rounds_the_fixed_rule_holds():
    config = study(blocks={"first": 8}, rounds={})
    rows, per_prompt, pairs = rows_and_outcomes(config, lambda i: False, lambda i: False)
    row = next(r for r in verdict_rows(config, rows, per_prompt, pairs) if r["axis"] == "precision")
    assert row["verdict"] == "none parted" and row["verdict_words"].startswith("none parted: 0 of 32")
    fixed = study()
    rows, per_prompt, pairs = rows_and_outcomes(fixed, lambda i: True, lambda i: False)
    row = next(r for r in verdict_rows(fixed, rows, per_prompt, pairs) if r["axis"] == "precision")
    assert row["verdict"] == "changes outputs" and "round_decided" not in row


def test_each_round_asks_its_own_question():
    config = study(blocks={"first": 8}, rounds={})
    judged = judged_pairs(expand_pairs(config, expand_cells(config)))
    assert [p.axis for p, floors in judged] == ["precision"] and [f.axis for f in judged[0][1]] == ["repeat"]
    asked = question(config, judged, 2)
    assert asked["prompts"] == {"a": 16} and asked["rounds"] == {"a": 3} and asked["tested"] == 1
    assert question(config, judged, 4)["prompts"] == {}
    assert outcome_sequences({"x": True, "y": False, "z": True}, [{"x": False, "y": True}]) == [[1, -1]]


def test_a_round_stops_what_it_decided_and_sends_on_only_the_cells_still_needed(prepared_models, tmp_path):
    """Round 1 of a real study (blocks made by the cell runner on a tiny random llama): greedy
    vs sampling at temperature 1 parts on every one of 10 prompts where greedy run again parts on
    none, which the e-process shows at exactly 10 prompts among 2 judged comparisons (8 alone):
    decided, and its sampled cell goes no further; the second comparison, level with its floor,
    stays open, and only its cells and its floor's go on."""
    import json

    from tokenflip.analysis.rounds import decide_round
    from tokenflip.core.layout import RunLayout
    from tokenflip.run.cell import run_cell
    from tokenflip.study.plan import cell_job

    s = tiny_study()
    s["benchmarks"] = {"a": {"kind": "arithmetic", "n": 20, "max_new_tokens": 6}}
    s["decoding"] = {"greedy": {"strategy": "greedy"}, "hot": {"strategy": "sample", "temperature": 1.0}}
    s["grids"] = [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "decoding": ["greedy", "hot"]},
                  {"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "repeat": [2]},
                  {"precision": ["fp32"], "cache": ["on", "off"], "batch_size": [1]}]
    s["comparisons"] = [{"axis": "decoding", "a": "greedy", "b": "hot"}, {"axis": "repeat", "a": "default", "b": 2},
                        {"axis": "cache", "a": "on", "b": "off"}]
    s["probes"], s["blocks"], s["rounds"] = {}, {"first": 10}, {}
    config = cfg.validate(s, check_data=False)
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
    assert sequential.first_above(np.ones(10, dtype=int), 0.05 / 2) == 10
    assert record["decided"] == {decoding.id: {"verdict": "changes outputs", "prompts": 10, "round": 1}}
    # cache on vs off in fp32 agrees token for token: level with its floor, not yet shown within ±5 pp
    assert record["open"] == [cache.id]
    assert record["continue"] == sorted({c.id for p in (cache, *dict(judged)[cache]) for c in (p.a, p.b)})
    assert decoding.b.id not in record["continue"]
