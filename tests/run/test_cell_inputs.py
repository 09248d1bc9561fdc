"""Nothing a cell depends on goes unchecked: a prepared model whose files changed after
preparation is refused naming the file, logits that are not numbers fail the cell naming the
step and the prompt, and every file a study writes has the mode the user's umask gives."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from conftest import copy_run, run_snakemake, tiny_study, write_yaml
from tokenflip.core.layout import RunLayout
from tokenflip.models.prepare import ModelError, load_prepared, load_tokenizer, prepare
from tokenflip.run.cell import run_cell
from tokenflip.run.finite import NonFiniteLogits, require_finite
from tokenflip.study import config as cfg
from tokenflip.study.plan import cell_job, expand_cells

LLAMA = {"source": "random", "architecture": "llama", "seed": 0}


def _flip_last_bytes(path: Path) -> None:
    """Change the last four bytes of a file in place (in a safetensors file: the end of its
    last tensor, so the file still loads, with one weight changed)."""
    with path.open("r+b") as fh:
        fh.seek(-4, os.SEEK_END)
        tail = fh.read(4)
        fh.seek(-4, os.SEEK_END)
        fh.write(bytes(b ^ 0x55 for b in tail))


@pytest.fixture
def prepared(tmp_path) -> Path:
    prepare(LLAMA, tmp_path / "m")
    return tmp_path / "m"


def test_a_prepared_model_edited_in_place_is_refused_naming_the_file(prepared):
    load_prepared(prepared, "fp32", "cpu")
    _flip_last_bytes(prepared / "model.safetensors")
    with pytest.raises(ModelError, match=f"{prepared / 'model.safetensors'}: changed since the model was prepared"):
        load_prepared(prepared, "fp32", "cpu")
    load_tokenizer(prepared)  # the tokenizer alone is still what was prepared


@pytest.mark.parametrize("change", ["tokenizer edited", "config edited", "file added", "file removed"])
def test_every_file_of_a_prepared_model_is_checked(prepared, change):
    if change == "tokenizer edited":
        path = prepared / "tokenizer.json"
        path.write_text(path.read_text().replace('"<|im_end|>"', '"<|im_stop|>"', 1))
        with pytest.raises(ModelError, match=f"{path}: changed since"):
            load_tokenizer(prepared)
    elif change == "config edited":
        path = prepared / "config.json"
        config = json.loads(path.read_text())
        path.write_text(json.dumps({**config, "rope_theta": -1.0}))
        with pytest.raises(ModelError, match=f"{path}: changed since"):
            load_prepared(prepared, "fp32", "cpu")
    elif change == "file added":
        (prepared / "model-00002-of-00002.safetensors").write_bytes(b"")
        with pytest.raises(ModelError, match="model-00002-of-00002.safetensors: not a file of the prepared model"):
            load_prepared(prepared, "fp32", "cpu")
    else:
        (prepared / "tokenizer_config.json").unlink()
        with pytest.raises(ModelError, match="tokenizer_config.json: missing"):
            load_tokenizer(prepared)


def test_a_model_prepared_before_per_file_digests_is_checked_by_its_combined_digest(prepared):
    manifest = json.loads((prepared / "model.json").read_text())
    del manifest["files"]
    (prepared / "model.json").write_text(json.dumps(manifest))
    load_prepared(prepared, "fp32", "cpu")
    _flip_last_bytes(prepared / "model.safetensors")
    with pytest.raises(ModelError, match="model.safetensors: not the files whose weights_sha256"):
        load_prepared(prepared, "fp32", "cpu")


@pytest.mark.slow
def test_a_new_cell_of_a_finished_study_is_not_made_from_edited_weights(finished_tiny_study, tmp_path):
    """In a finished study the prepared weights are edited in place and the study grows by a
    batch size, whose cells would be paired with the earlier ones: Snakemake cannot see the edit
    (a directory output's time is its stamp file), each new cell's job refuses naming the file,
    and no new cell or pair is written, nor a report."""
    workdir = copy_run(finished_tiny_study.workdir, tmp_path / "run")
    weights = workdir / "resources" / "models" / "tiny" / "model.safetensors"
    report = workdir / "reports" / "inc" / "index.html"
    report_time = report.stat().st_mtime_ns
    _flip_last_bytes(weights)
    study = tiny_study()
    study["grids"][0]["batch_size"] = [1, 2]
    study["comparisons"].append({"axis": "batch_size", "a": 1, "b": 2})
    proc = run_snakemake(workdir, write_yaml(tmp_path / "grown.yaml", study), check=False)
    assert proc.returncode != 0
    logs = [p.read_text() for p in (workdir / "logs" / "inc" / "generate").rglob("*bs2*.log")]
    assert logs and all("resources/models/tiny/model.safetensors: changed since the model was prepared" in log
                        for log in logs), logs
    assert not list((workdir / "results").rglob("*bs2*")) and report.stat().st_mtime_ns == report_time


def _records(bad_prompt: int | None = None, step: int = 2, field: str = "logsumexp", value=float("inf")):
    rows = []
    for index in range(3):
        n = 4
        row = {"prompt_index": index, "prompt_id": f"p{index}", "top_logits": np.zeros((n, 2), np.float32),
               "logsumexp": [1.0] * n, "margin": [0.5] * n, "entropy": [0.1] * n}
        if index == bad_prompt:
            if field == "top_logits":
                row["top_logits"][step, 1] = value
            else:
                row[field][step] = value
        rows.append(row)
    return rows[::-1]  # a batch's rows may come in any order; the first prompt is named


def test_non_finite_step_statistics_are_named_by_prompt_and_step():
    require_finite(_records(), "c")
    require_finite([{"prompt_index": 0, "prompt_id": "p0", "top_logits": np.zeros((0, 2), np.float32),
                     "logsumexp": [], "margin": [], "entropy": []}], "c")  # stopped at once: no steps
    with pytest.raises(NonFiniteLogits, match=r"cell c: .* step 2 .* prompt 'p1' \(index 1\): logsumexp is inf"):
        require_finite(_records(1), "c")
    with pytest.raises(NonFiniteLogits, match=r"step 3 .* prompt 'p0' .* top_logits is nan"):
        require_finite(_records(0, 3, "top_logits", float("nan")), "c")


@pytest.mark.parametrize("override", [{"rope_theta": -10000.0}, {"rms_norm_eps": -1.0}])
def test_a_model_whose_logits_are_nan_fails_its_cell(tmp_path, override):
    """A negative rope_theta or rms_norm_eps makes every logit NaN: argmax would choose token 0
    at every step and the cell would be compared with others as if it held numbers."""
    spec = {**LLAMA, "overrides": override}
    prepare(spec, tmp_path / "m")
    study = tiny_study()
    study.update(models={"bad": spec}, benchmarks={"a": {"kind": "arithmetic", "n": 2, "max_new_tokens": 4}},
                 grids=[{"precision": ["fp32"], "cache": ["on"], "batch_size": [1]}], comparisons=[], probes={})
    config = cfg.validate(study, check_data=False)
    layout = RunLayout(config["run"], root=str(tmp_path))
    (cell,) = expand_cells(config)
    with pytest.raises(NonFiniteLogits, match=r"not finite at step 0 .* of prompt 'arithmetic-s0-0000'"):
        run_cell(cell_job(config, cell), tmp_path / "m", layout.cell(cell.id), progress=False)
    assert not Path(layout.cell(cell.id)).exists()
    assert issubclass(NonFiniteLogits, ModelError)  # the command line says it in one line


@pytest.mark.slow
def test_every_file_a_study_writes_follows_the_umask(tmp_path):
    """Under umask 002 every file of a tiny study (prepared model, prompt checks, cells, pairs,
    probes, summaries, report, logs) is group-writable and every directory group-searchable."""
    study = tiny_study()
    study["run"] = "umask"
    config = write_yaml(tmp_path / "config.yaml", study)
    workdir = tmp_path / "run"
    previous = os.umask(0o002)
    try:
        run_snakemake(workdir, config)
    finally:
        os.umask(previous)
    written = [p for p in workdir.rglob("*") if ".snakemake" not in p.relative_to(workdir).parts[:1]]
    assert any(p.name == "model.safetensors" for p in written) and any(p.suffix == ".html" for p in written)
    wrong = {str(p.relative_to(workdir)): oct(stat.S_IMODE(p.stat().st_mode)) for p in written
             if stat.S_IMODE(p.stat().st_mode) != (0o775 if p.is_dir() else 0o664)}
    assert wrong == {}
