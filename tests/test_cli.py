"""The command line outside Snakemake: run one cell, print its digest, exit codes."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tokenflip import storage


def tokenflip(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tokenflip", *args], capture_output=True, text=True, cwd=cwd)


def test_run_cell_then_digest(tmp_path):
    cfg = {"run": "cli", "models": {"tiny": {"source": "random", "architecture": "llama"}},
           "benchmarks": {"arith": {"kind": "arithmetic", "n": 2, "max_new_tokens": 5}},
           "generation": {"device": "cpu", "threads": 1},
           "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1]}], "comparisons": []}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    run = tokenflip("run-cell", "--config", "c.yaml", "--cell", "tiny/arith/fp32-on-bs1-greedy-none", "--quiet",
                    cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    cell = tmp_path / "results/cli/cells/tiny/arith/fp32-on-bs1-greedy-none.parquet"
    meta = storage.read_metadata(cell)
    assert (tmp_path / "resources/models/tiny/model.json").exists()
    digest = tokenflip("digest", str(cell))
    assert digest.returncode == 0 and digest.stdout.split()[0] == meta["token_stream_sha256"]

    missing = tokenflip("run-cell", "--config", "c.yaml", "--cell", "tiny/arith/fp16-on-bs1-greedy-none",
                        cwd=tmp_path)
    assert missing.returncode == 1
    assert "c.yaml: no cell 'tiny/arith/fp16-on-bs1-greedy-none'" in missing.stderr
    assert tokenflip("digest", str(tmp_path / "nope.parquet")).returncode == 1
    assert tokenflip("frobnicate").returncode == 2
