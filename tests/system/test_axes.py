"""Any axis, any machine: threads and attention kernels as comparisons, cells from two
run directories merged into one, and the digest and diff-runs commands."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from test_workflow import scheduled_jobs, snakemake

from tokenflip.core import storage

TINY = {"source": "random", "architecture": "llama", "seed": 0}


def config(workdir: Path, grids: list, comparisons: list) -> Path:
    cfg = {"run": "axes", "models": {"tiny": TINY},
           "benchmarks": {"arith": {"kind": "arithmetic", "n": 3, "max_new_tokens": 8}},
           "generation": {"record_top_k": 8, "device": "cpu", "threads": 1},
           "grids": grids, "comparisons": comparisons}
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def tokenflip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenflip", *args], capture_output=True, text=True)


BASE = {"precision": ["bf16"], "cache": ["on"], "batch_size": [1]}


@pytest.mark.slow
def test_threads_and_attention_from_two_machines_merged(tmp_path):
    # "Machine" A runs the default cells with 1 thread; "machine" B runs 2 threads and eager attention.
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    snakemake(a, config(a, [dict(BASE, threads=[1])], []), "--until", "generate")
    snakemake(b, config(b, [dict(BASE, threads=[2]), dict(BASE, threads=[1], attention=["eager"])], []),
              "--until", "generate")
    cells_b = sorted((b / "results" / "axes" / "cells").rglob("*.parquet"))
    assert [c.name for c in cells_b] == ["bf16-on-bs1-greedy-none-attention=eager-threads=1.parquet",
                                         "bf16-on-bs1-greedy-none-threads=2.parquet"]
    # Each cell computed with the threads its name states, not the run-wide generation.threads (1),
    # and its record says so (a cell that recorded otherwise would have failed).
    recorded = {c.name: storage.read_table(c)[1]["environment"]["device"]["threads"] for c in cells_b}
    assert recorded == {"bf16-on-bs1-greedy-none-attention=eager-threads=1.parquet": 1,
                        "bf16-on-bs1-greedy-none-threads=2.parquet": 2}, recorded
    # Merge B's cells into A's run directory; the union config then only compares and reports.
    for cell in cells_b:
        target = a / "results" / "axes" / "cells" / cell.relative_to(b / "results" / "axes" / "cells")
        shutil.copy2(cell, target)
    union = config(a, [dict(BASE, threads=[1, 2]), dict(BASE, threads=[1], attention=["eager"])],
                   [{"axis": "threads", "a": 1, "b": 2}, {"axis": "attention", "a": "default", "b": "eager"}])
    jobs = Counter(rule for rule, _ in scheduled_jobs(snakemake(a, union, "-n").stdout))
    assert jobs == {"compare": 2, "summarize": 1, "report": 1, "all": 1}, jobs
    snakemake(a, union)
    pairs = {p["axis"]: p for p in pq.read_table(a / "results" / "axes" / "summary" / "pairs.parquet").to_pylist()}
    assert set(pairs) == {"threads", "attention"} and all(p["status"] == "done" for p in pairs.values())
    assert pairs["threads"]["context"] == "bf16-on-bs1-greedy-none-threads=x"
    html = (a / "reports" / "axes" / "index.html").read_text()
    assert "threads: 1 vs 2" in html and "attention: default vs eager" in html

    # digest and diff-runs: the same cell from two directories is identical ...
    cell = "tiny/arith/bf16-on-bs1-greedy-none-threads=2.parquet"
    digests = tokenflip("digest", str(a / "results/axes/cells" / cell), str(b / "results/axes/cells" / cell))
    lines = digests.stdout.split("\n")
    assert digests.returncode == 0 and lines[0].split()[0] == lines[1].split()[0]
    same = tokenflip("diff-runs", str(a / "results/axes"), str(b / "results/axes"))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "2 identical, 0 different, 1 in one run only" in same.stdout
    # ... and a cell whose tokens differ is reported with where it first differs.
    path = b / "results/axes/cells" / cell
    table, meta = storage.read_table(path)
    tokens = table.column("token_ids").to_pylist()
    tokens[1][3] += 1
    table = table.set_column(table.schema.get_field_index("token_ids"), "token_ids",
                             storage.cell_table([{**r, "token_ids": t} for r, t in zip(table.to_pylist(), tokens)],
                                                8).column("token_ids"))
    storage.write_table(table, path, {**meta, "token_stream_sha256": storage.token_stream_digest(table)})
    diff = tokenflip("diff-runs", str(a / "results/axes"), str(b / "results/axes"))
    assert diff.returncode == 3
    assert f"DIFFERENT  {cell[:-len('.parquet')]}  1/3 prompts; earliest at step 3" in diff.stdout
