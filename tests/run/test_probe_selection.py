"""Probes trace the prompts the pairs they explain diverged on (arXiv 2609.26621 traced
Diverged and Agreed prompt groups, App. III), so a run with any divergence has flips to
trace; which prompts were chosen, and why, is in every probe row."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest


def _items(n: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(id=f"p{i}") for i in range(n)]


@pytest.mark.parametrize("n, diverged, expected", [
    # half (rounded up) from the diverged, as many agreed, in benchmark order
    (4, {1, 4, 6}, [("p0", "agreed"), ("p1", "diverged"), ("p2", "agreed"), ("p4", "diverged")]),
    (5, {1, 4, 6}, [("p0", "agreed"), ("p1", "diverged"), ("p2", "agreed"), ("p4", "diverged"), ("p6", "diverged")]),
    # one diverged prompt: it, and agreed ones for the rest
    (4, {7}, [("p0", "agreed"), ("p1", "agreed"), ("p2", "agreed"), ("p7", "diverged")]),
    # nothing agreed: diverged ones fill in
    (3, set(range(8)), [("p0", "diverged"), ("p1", "diverged"), ("p2", "diverged")]),
])
def test_half_diverged_half_agreed_the_other_group_filling_in(n, diverged, expected):
    from tokenflip.run.probes.base import choose_prompts

    agreement = {f"p{i}": i not in diverged for i in range(8)}
    assert [(item.id, why) for item, why in choose_prompts(_items(8), n, agreement)] == expected


def test_without_pair_results_the_first_prompts():
    from tokenflip.run.probes.base import choose_prompts

    assert [(i.id, why) for i, why in choose_prompts(_items(8), 3, None)] == [("p0", "first"), ("p1", "first"),
                                                                           ("p2", "first")]


def _config(**probes):
    from tokenflip.study import config as cfg

    return cfg.validate({
        "run": "sel", "models": {"m": {"source": "random", "architecture": "llama", "seed": 0}},
        "benchmarks": {"arith": {"kind": "arithmetic", "n": 8, "max_new_tokens": 24}},
        "generation": {"record_top_k": 8, "device": "cpu", "threads": 1},
        "interventions": {"none": {"kind": "none"}, "c": {"kind": "fp32_head", "tau": 0.01}},
        "grids": [{"precision": ["bf16", "fp16"], "cache": ["on", "off"], "batch_size": [1, 4]},
                  {"precision": ["bf16", "fp16"], "cache": ["on"], "batch_size": [1], "intervention": ["c"]},
                  {"precision": ["bf16", "fp16"], "cache": ["on"], "batch_size": [1], "repeat": [2]}],
        "comparisons": [{"axis": "precision", "a": "bf16", "b": "fp16"}, {"axis": "cache", "a": "on", "b": "off"},
                        {"axis": "batch_size", "a": 1, "b": 4}],
        "probes": probes})


def test_a_probe_explains_the_plain_pairs_of_its_own_comparison():
    """Of the BF16-vs-FP16 pairs (cache on and off, batch sizes 1 and 4, with C, a repeat),
    the precision probe (cache on, batch size 1, no intervention) explains one; the
    KV-cache probe at FP16 the FP16 cache pair at batch size 1; `select: first` none."""
    from tokenflip.study.plan import probe_job

    config = _config(precision={"prompts": 2, "pairs": [["fp16", "bf16"]]}, kv_cache={"prompts": 2,
                                                                                      "precisions": ["fp16"]})
    assert probe_job(config, "precision", "m", "arith").explains == ["m/arith/precision/bf16_vs_fp16/x-on-bs1-greedy-none"]
    assert probe_job(config, "kv_cache", "m", "arith").explains == ["m/arith/cache/on_vs_off/fp16-x-bs1-greedy-none"]
    first = _config(precision={"prompts": 2, "select": "first"})
    assert probe_job(first, "precision", "m", "arith").explains == []


def test_the_precision_probe_traces_the_flips_of_the_prompts_that_diverged(tmp_path):
    """The tiny model's bf16 and fp16 greedy outputs part on some of 8 prompts. The probe
    (2 prompts) takes the first diverged one and the first agreed one, and finds the flip of
    the diverged one at exactly the step where the pair's outputs part: the probe replays
    the computation the cells ran. The first two prompts alone would hold no flip here."""
    from tokenflip.cli import main as cli
    from tokenflip.core import storage
    from tokenflip.core.layout import RunLayout
    from tokenflip.study.plan import cell_job, expand_cells, expand_pairs, probe_job

    config = _config(precision={"prompts": 2, "pairs": [["bf16", "fp16"]], "flips": 1})
    config["grids"] = config["grids"][:1]
    layout = RunLayout(config["run"], root=str(tmp_path))
    model_dir = layout.model_dir("m")
    assert cli.main(["prepare-model", "--spec", json.dumps(config["models"]["m"]), "--out", model_dir]) == 0
    cells = [c for c in expand_cells(config) if c.cache == "on" and c.batch_size == 1]
    for cell in cells:
        assert cli.main(["generate", "--quiet", "--job", cell_job(config, cell).dumps(), "--model-dir", model_dir,
                         "--out", layout.cell(cell.id)]) == 0
    (pair,) = [p for p in expand_pairs(config, cells) if p.axis == "precision"]
    assert cli.main(["compare", layout.cell(pair.a.id), layout.cell(pair.b.id), "--pair-id", pair.id,
                     "--out", layout.pair(pair.id)]) == 0
    outcome = storage.read_table(layout.pair(pair.id), kind="pair")[0].to_pandas().set_index("prompt_id")
    diverged = list(outcome.index[~outcome["identical"]])
    assert diverged and diverged[0] not in ("arith-0", "arith-1")  # this seed: the first two agree

    job = probe_job(config, "precision", "m", "arith", [pair])
    out = layout.probe_dir("precision", "m", "arith")
    assert cli.main(["probe", "--job", job.dumps(), "--model-dir", model_dir, "--out-dir", out,
                     "--pairs", layout.pair(pair.id)]) == 0
    steps = storage.read_table(f"{out}/steps.parquet", kind="probe")[0].to_pandas()
    chosen = steps.drop_duplicates("prompt_id").set_index("prompt_id")["chosen_as"].to_dict()
    first_agreed = next(p for p in outcome.index if outcome.loc[p, "identical"])
    assert chosen == {diverged[0]: "diverged", first_agreed: "agreed"}
    flips = steps[steps["prompt_id"] == diverged[0]].sort_values("step")
    assert int(flips.loc[flips["flip"], "step"].iloc[0]) == int(outcome.loc[diverged[0], "first_div_step"])
    assert not steps.loc[steps["prompt_id"] == first_agreed, "flip"].any()


def test_a_pair_file_the_job_does_not_explain_is_refused(tmp_path):
    import pyarrow as pa

    from tokenflip.core import storage
    from tokenflip.core.specs import ProbeJob
    from tokenflip.run.probes.base import pair_agreement

    path = tmp_path / "pair.parquet"
    storage.write_table(pa.table({"prompt_id": ["p0"], "identical": [True]}), path,
                        {"kind": "pair", "pair": {"id": "m/b/precision/fp32_vs_bf16/x-on-bs1-greedy-none"}})
    job = ProbeJob(probe="precision", model_name="m", benchmark_name="b", run_seed=0, model={}, benchmark={},
                   max_new_tokens=4, prompts=2, select="diverged",
                   explains=["m/b/precision/bf16_vs_fp16/x-on-bs1-greedy-none"])
    with pytest.raises(storage.StorageError, match="does not explain"):
        pair_agreement(job, [path])
