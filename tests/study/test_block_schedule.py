"""Where blocks end, checked by hand: geometric ends cut at the maximum, a first block every
batch size divides, one block per cell in a study that declares neither blocks nor rounds;
and the configs that cannot run in blocks or rounds refused naming the key."""

from __future__ import annotations

import pytest

from conftest import tiny_study
from tokenflip.study import config as cfg
from tokenflip.study.plan import expand_cells
from tokenflip.study.rounds import block_ends, blocks_of, first_block, in_blocks, plan_lines, worst_case


def study(n=40, batch_sizes=(1,), **top):
    s = tiny_study()
    s["benchmarks"] = {"a": {"kind": "arithmetic", "max_new_tokens": 4, **({"n": n} if n else {})}}
    s["grids"] = [{"precision": ["fp32"], "cache": ["on"], "batch_size": list(batch_sizes), "repeat": ["default", 2]}]
    s["comparisons"], s["probes"] = [{"axis": "repeat", "a": "default", "b": 2}], {}
    return cfg.validate({**s, **top}, check_data=False)


def test_blocks_end_geometrically_and_are_cut_at_the_maximum():
    assert block_ends(study(40, blocks={}), "a") == [16, 32, 40]
    assert blocks_of(study(40, blocks={}), "a") == [(0, 16), (16, 32), (32, 40)]
    assert block_ends(study(12, blocks={}), "a") == [12]
    assert block_ends(study(64, blocks={"first": 4, "growth": 3}), "a") == [4, 12, 36, 64]
    assert block_ends(study(1000, rounds={"max_prompts": 100}), "a") == [16, 32, 64, 100]
    assert block_ends(study(40), "a") == [None] and not in_blocks(study(40))  # neither declared: the cell, one job


def test_the_default_first_block_is_a_multiple_of_every_batch_size():
    assert first_block(study(blocks={}, batch_sizes=(1, 4))) == 16
    assert first_block(study(blocks={}, batch_sizes=(1, 32))) == 32
    assert first_block(study(blocks={}, batch_sizes=(3,))) == 48


def test_a_first_block_that_would_cut_a_batch_is_refused():
    with pytest.raises(cfg.ConfigError, match=r"blocks.first: 12 prompts is not a multiple of batch size 8.*use 24"):
        study(blocks={"first": 12}, batch_sizes=(1, 8))
    with pytest.raises(cfg.ConfigError, match="blocks.growth: 1 is below the minimum 2"):
        study(blocks={"growth": 1})


def test_rounds_without_a_maximum_are_refused():
    with pytest.raises(cfg.ConfigError, match="rounds: benchmark 'a' states no n and rounds.max_prompts is not set"):
        study(n=None, rounds={})
    assert block_ends(study(n=None, rounds={"max_prompts": 20}), "a") == [16, 20]


def test_the_plan_states_the_worst_case():
    config = study(40, rounds={})
    cells = expand_cells(config)
    assert worst_case(config, cells) == {"blocks": 6, "prompts": 80, "rounds": 3}
    assert plan_lines(config, cells) == [
        "blocks a: [0, 16), [16, 32), [32, 40)",
        "rounds: at most 3, 6 blocks, 80 prompts in all (every comparison undecided to its maximum); decided "
        "comparisons stop after the round that decides them"]
    assert plan_lines(study(40), cells) == []


@pytest.mark.parametrize("text, seconds", [("10 min", 600), ("90 s", 90), ("1.5h", 5400), ("2 h", 7200)])
def test_a_time_budget_is_read_in_seconds_and_stated_by_the_plan(text, seconds):
    from tokenflip.study.rounds import budget_seconds

    config = study(40, rounds={"budget": text})
    assert budget_seconds(config) == seconds and budget_seconds(study(40, rounds={})) is None
    assert plan_lines(config, expand_cells(config))[-1].startswith(f"rounds: a budget of {text} ({seconds} s) of the "
                                                                   f"judged cells' generate jobs")


@pytest.mark.parametrize("text", ["10 minutes", "ten min", "-1 s", "1e3 s", "10", "10 min\n"])
def test_a_budget_in_no_unit_of_time_is_refused(text):
    with pytest.raises(cfg.ConfigError, match=r"rounds.budget"):
        study(40, rounds={"budget": text})


def test_the_schema_and_the_command_line_take_the_same_budgets():
    from tokenflip.study.rounds import BUDGET_PATTERN

    assert cfg.schema()["properties"]["rounds"]["properties"]["budget"]["pattern"] == BUDGET_PATTERN


@pytest.mark.parametrize("budget, prompts, fits", [("10 min", 150, "within it"), ("2 min", 30, "beyond it")])
def test_the_cost_estimate_says_what_the_budget_is_expected_to_decide(budget, prompts, fits):
    """The default's 4 judged cells (the two comparisons' and their floor's) priced at 72 s
    for 72 prompts each: 4 s a prompt together, so 600 s buy 150 prompts a cell, past the 68
    a comparison that parts on none needs and the 77 of "changes outputs" at even odds; 120 s
    buy 30, short of both."""
    from conftest import REPO
    from tokenflip.analysis.power import budget_lines
    from tokenflip.study.plan import expand_pairs

    config = cfg.read_yaml(REPO / "config" / "config.yaml")
    config["rounds"] = {"budget": budget}
    config = cfg.validate(config, check_data=False)
    cells = expand_cells(config)
    (line,) = budget_lines(config, expand_pairs(config, cells), {c.id: 72.0 for c in cells}, "GPU")
    assert line.startswith(f"rounds.budget {budget} ") and f"about {prompts} prompts a judged cell (4 cells, 4 s a " \
        f"prompt together" in line, line
    assert f'"within ±10%" after 68 prompts ({fits})' in line and f"at even odds after 77 prompts ({fits})" in line
