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
