"""`tokenflip run-cell` makes the checks the pipeline makes before a cell: a cell that asks for
more tokens than its model's context holds is refused naming the benchmark and the context,
before any token is generated (it used to run on until the machine ran out of memory), and
nothing is written."""

from __future__ import annotations

import subprocess
import sys

from conftest import tiny_study, write_yaml


def test_a_cell_asking_more_than_its_context_is_refused_before_it_runs(tmp_path):
    study = tiny_study()
    study["benchmarks"] = {"arith": {"kind": "arithmetic", "n": 2, "max_new_tokens": 10 ** 9}}
    study["grids"] = [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1]}]
    study["comparisons"], study["probes"] = [], {}
    config = write_yaml(tmp_path / "study.yaml", study)
    out = tmp_path / "cell.parquet"
    proc = subprocess.run([sys.executable, "-m", "tokenflip", "run-cell", "--config", str(config), "--cell",
                           "tiny/arith/fp32-on-bs1-greedy-none", "--out", str(out), "--models-dir",
                           str(tmp_path / "models"), "--quiet"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("tokenflip run-cell: error: "), proc.stderr
    # where the config names the model's context, validation refuses it; else the prompt check does
    assert "arith" in proc.stderr and "1000000000" in proc.stderr and "context" in proc.stderr
    assert not out.exists()


def test_a_generate_job_asking_more_than_its_context_is_refused_before_any_engine_loads(tmp_path,
                                                                                         prepared_models):
    """`tokenflip generate`, the pipeline's own call, run by hand with a job spec the pipeline
    would have refused: one line naming the cell, max_new_tokens and the context, nothing
    written, on every engine (the check is before the engine: llama.cpp's n_ctx would be sized
    by it)."""
    import json

    from conftest import SMOLLM2
    from tokenflip.core.specs import Cell
    from tokenflip.models.size import context_length
    from tokenflip.study import config as cfg
    from tokenflip.study.plan import cell_job

    study = tiny_study()
    study["models"] = {"smollm2": SMOLLM2}
    study["grids"] = [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1],
                       "engine": ["transformers", "llama.cpp"]}]
    study["comparisons"], study["probes"] = [], {}
    config = cfg.validate(study, source="study.yaml", check_data=False)
    model_dir = prepared_models("smollm2")
    assert context_length(model_dir) == 8192
    for engine in ("transformers", "llama.cpp"):
        cell = Cell("smollm2", "arith_a", "fp32", "on", 1, "greedy", "none", engine=engine)
        job = cell_job(config, cell).to_json()
        job["max_new_tokens"] = 10 ** 9
        out = tmp_path / f"{engine}.parquet"
        proc = subprocess.run([sys.executable, "-m", "tokenflip", "generate", "--job", json.dumps(job), "--model-dir",
                               str(model_dir), "--out", str(out), "--quiet"], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"tokenflip generate: error: cell {cell.id}: max_new_tokens 1000000000 leaves no position for a prompt in "
            f"the model's context of 8192 (max_position_embeddings; a static cache and llama.cpp's n_ctx are sized "
            f"prompt + max_new_tokens)"], proc.stderr
        assert not out.exists()
