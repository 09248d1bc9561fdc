"""A study of rounds with the real Snakemake: its checkpoint decides the round, the cells of an
undecided comparison get the next block, a raised maximum generates only the new blocks
(every old block file untouched), and the verdicts then equal those of the same study made
at once. (A decided comparison stopping its cells: tests/analysis/test_rounds_record.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from test_workflow import scheduled_jobs

from conftest import run_snakemake, write_yaml

pytestmark = pytest.mark.slow

CELLS = ("fp32-on-bs1-greedy-none", "bf16-on-bs1-greedy-none", "fp32-on-bs1-greedy-none-repeat=2")
VERDICT_COLUMNS = ["pair_id", "n_prompts", "n_diverged", "verdict", "round_decided", "prompts_decided",
                   "interval_low", "interval_high", "verdict_words"]


def study(max_prompts: int) -> dict:
    """fp32 vs bf16 of a tiny random llama against the fp32 cell run again, in rounds of 8 and 16
    prompts: bf16 parts on about 40% of the prompts, which 8 prompts do not show and 16 do."""
    return {
        "run": "rounds", "seed": 0,
        "models": {"tiny": {"source": "random", "architecture": "llama", "seed": 0}},
        "benchmarks": {"onestep": {"kind": "onestep", "n": 16, "max_new_tokens": 8}},
        "generation": {"record_top_k": 4, "device": "cpu", "threads": 1},
        "blocks": {"first": 8},
        "rounds": {"max_prompts": max_prompts},
        "grids": [{"precision": ["fp32", "bf16"], "cache": ["on"], "batch_size": [1]},
                  {"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "repeat": [2]}],
        "comparisons": [{"axis": "precision", "a": "fp32", "b": "bf16"}, {"axis": "repeat", "a": "default", "b": 2}],
    }


def run(workdir: Path, max_prompts: int):
    """The study up to its summary (the report adds nothing to what is checked here)."""
    proc = run_snakemake(workdir, write_yaml(workdir / "config.yaml", study(max_prompts)),
                         "results/rounds/summary/pairs.parquet")
    return proc, {out for rule, out in scheduled_jobs(proc.stdout + proc.stderr) if rule == "generate"}


def blocks(ends) -> set[str]:
    return {f"results/rounds/blocks/tiny/onestep/{cell}/{first}-{end}.parquet"
            for cell in CELLS for first, end in zip([0, *ends], ends)}


def verdicts(workdir: Path) -> pd.DataFrame:
    pairs = pd.read_parquet(workdir / "results/rounds/summary/pairs.parquet")
    return pairs[VERDICT_COLUMNS].sort_values("pair_id").reset_index(drop=True)


def test_a_raised_maximum_generates_only_new_blocks_and_decides_as_a_run_made_at_once(tmp_path):
    stepwise, at_once = tmp_path / "stepwise", tmp_path / "at-once"
    _, made = run(stepwise, 8)
    assert made == blocks([8])  # one round: its block is the last, and no checkpoint is needed
    first = verdicts(stepwise).set_index("pair_id")
    precision = first.loc["tiny/onestep/precision/fp32_vs_bf16/x-on-bs1-greedy-none"]
    assert precision["verdict"] == "undecided" and precision["n_prompts"] == 8
    assert precision["verdict_words"].startswith("undecided at its maximum of 8 prompts (3 parted")
    old = {path: (stepwise / path).stat().st_mtime_ns for path in blocks([8])}

    proc, made = run(stepwise, 16)
    assert made == blocks([8, 16]) - blocks([8]), made  # round 1 decided nothing: only the new block of each cell
    assert {path: (stepwise / path).stat().st_mtime_ns for path in old} == old
    assert "rounds: at most 2 rounds, 6 blocks, 48 prompts" in proc.stderr

    # Raising the benchmark's n remakes its prompt check (more prompts to check) and no old block.
    raised = study(24)
    raised["benchmarks"]["onestep"]["n"] = 24
    dry = run_snakemake(stepwise, write_yaml(stepwise / "raised.yaml", raised), "-n",
                        "results/rounds/summary/pairs.parquet")
    planned = scheduled_jobs(dry.stdout)
    assert ("check_prompts", "results/rounds/checks/tiny/onestep.json") in planned
    assert not {out for rule, out in planned if rule == "generate"} & blocks([8, 16]), planned

    shutil.copytree(stepwise / "resources", at_once / "resources")  # the same prepared model, not made twice
    _, made = run(at_once, 16)
    assert made == blocks([8, 16])
    pd.testing.assert_frame_equal(verdicts(stepwise), verdicts(at_once))
    decided = verdicts(at_once).set_index("pair_id").loc[precision.name]
    # 7 of 16 parted where the floor parted on none: shown in round 2 (a capital of mean(1 + s)^7 ≥ 1/α)
    assert decided["verdict"] == "changes outputs" and decided["round_decided"] == 2
    assert decided["n_diverged"] == 7 and decided["n_prompts"] == 16
    a, b = (json.loads((w / "results/rounds/rounds/1.json").read_text()) for w in (stepwise, at_once))
    assert a == b and a["open"] == [precision.name] and a["decided"] == {} and len(a["continue"]) == 3
    assert not (at_once / "results/rounds/rounds/2.json").exists()  # the last round needs no checkpoint
    cell = at_once / "results/rounds/cells/tiny/onestep/bf16-on-bs1-greedy-none.parquet"
    assert len(pd.read_parquet(cell)) == 16
