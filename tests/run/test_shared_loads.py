"""A generation job handed to a warm process that holds its load (run.shared_loads): the same
cell bit for bit as a job that loads the model itself, its seconds counted from its own
process, nothing written when the job is killed, and idle loads of another model sent away."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import tiny_study

from tokenflip.analysis.compare import _FREE_FIELDS
from tokenflip.core import storage
from tokenflip.core.provenance import flatten_provenance
from tokenflip.run.shared_loads import load_key
from tokenflip.study import config as cfg
from tokenflip.study.plan import cell_job, expand_cells

WARM = re.compile(r"runs in a warm process \(pid (\d+)\) that holds its load: its job (\d+)")


@pytest.fixture(scope="module")
def study(prepared_models, tmp_path_factory):
    """Four cells of one load (fp32: as given, an FP8 cache, chunked prefill, sampled) and one
    of another (bf16), with a private folder for the warm processes."""
    spec = tiny_study()
    spec["benchmarks"] = {"arith": {"kind": "arithmetic", "n": 6, "max_new_tokens": 8}}
    spec["decoding"] = {"greedy": {"strategy": "greedy"}, "sample": {"strategy": "sample", "temperature": 1.3}}
    spec["grids"] = [{"precision": ["fp32"], "cache": ["on"], "batch_size": [2], "decoding": ["greedy", "sample"]},
                     {"precision": ["fp32"], "cache": ["on"], "batch_size": [2], "kv_dtype": ["fp8_e5m2"]},
                     {"precision": ["fp32"], "cache": ["on"], "batch_size": [2], "prefill_chunk": [2]},
                     {"precision": ["bf16"], "cache": ["on"], "batch_size": [2]}]
    spec["comparisons"], spec["probes"] = [], {}
    config = cfg.validate(spec, check_data=False)
    jobs = {cell.id.rsplit("/", 1)[-1]: cell_job(config, cell) for cell in expand_cells(config)}
    root = tmp_path_factory.mktemp("shared")
    (root / "run").mkdir(mode=0o700)
    return jobs, prepared_models("llama"), root


def _generate(job, model, out: Path, root: Path, share: bool, **popen):
    env = {**os.environ, "XDG_RUNTIME_DIR": str(root / "run"), "TOKENFLIP_SHARE_LOADS": "1" if share else "0",
           "OMP_NUM_THREADS": "1"}
    env.pop("SLURM_JOB_ID", None)
    argv = [sys.executable, "-m", "tokenflip", "generate", "--job", job.dumps(), "--model-dir", str(model),
            "--out", str(out), "--quiet"]
    log = open(out.with_suffix(".log"), "w")
    if popen:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, **popen)
    started = time.monotonic()
    proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=300)
    log.close()
    return proc.returncode, time.monotonic() - started, out.with_suffix(".log").read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def test_jobs_handed_to_a_warm_load_are_the_cells_a_fresh_load_makes_bit_for_bit(study, tmp_path):
    jobs, model, root = study
    order = ["fp32-on-bs2-greedy-none-kv_dtype=fp8_e5m2", "fp32-on-bs2-greedy-none", "fp32-on-bs2-sample-none",
             "fp32-on-bs2-greedy-none-prefill_chunk=2", "fp32-on-bs2-greedy-none"]
    assert set(order) < set(jobs), sorted(jobs)
    warm = []
    for i, name in enumerate(order):
        status, seconds, log = _generate(jobs[name], model, tmp_path / f"warm{i}.parquet", root, share=True)
        assert status == 0, log
        pid, number = map(int, WARM.search(log).groups())
        warm.append(pid)
        assert number == i + 1, log
        # The job's seconds are its own process's, not the warm process's (which is older).
        assert 0 < storage.read_metadata(tmp_path / f"warm{i}.parquet")["job_seconds"] <= seconds
    assert len(set(warm)) == 1  # one load for all five jobs
    for i, name in enumerate(order):
        status, _, log = _generate(jobs[name], model, tmp_path / f"fresh{i}.parquet", root, share=False)
        assert status == 0 and not WARM.search(log), log
        shared, shared_meta = storage.read_cell(tmp_path / f"warm{i}.parquet")
        fresh, fresh_meta = storage.read_cell(tmp_path / f"fresh{i}.parquet")
        for column in ("prompt_ids", "token_ids", "top_ids", "top_logits"):
            assert shared.column(column).to_pylist() == fresh.column(column).to_pylist(), (name, column)
        assert (shared_meta["token_stream_sha256"], shared_meta["logits_sha256"]) == \
            (fresh_meta["token_stream_sha256"], fresh_meta["logits_sha256"])
        # Its record too, field by field as a comparison checks it (times apart): a warm cell
        # pairs with a fresh one (a cell whose other side is an intervention, never shared).
        recorded = [{k: v for k, v in flatten_provenance(m).items() if k.split(".")[0] not in _FREE_FIELDS}
                    for m in (shared_meta, fresh_meta)]
        assert recorded[0] == recorded[1], {k for k in recorded[0] if recorded[0][k] != recorded[1].get(k)}
    # Another load (bf16) sends the idle fp32 process away before it loads.
    status, _, log = _generate(jobs["bf16-on-bs2-greedy-none"], model, tmp_path / "bf16.parquet", root, share=True)
    assert status == 0 and int(WARM.search(log).group(1)) != warm[0], log
    assert not _alive(warm[0])


def test_a_job_killed_while_its_warm_load_runs_it_writes_nothing(study, tmp_path):
    jobs, model, root = study
    long = jobs["fp32-on-bs2-greedy-none"]
    long = type(long).from_json({**long.to_json(), "max_new_tokens": 900,
                                 "benchmark": {**long.benchmark, "n": 6}})
    out = tmp_path / "killed.parquet"
    proc = _generate(long, model, out, root, share=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (m := WARM.search(out.with_suffix(".log").read_text())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert m, out.with_suffix(".log").read_text()
    pid = int(m.group(1))
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)  # as Snakemake stops a job
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["killed.log"]


def test_only_loads_a_job_leaves_as_loaded_are_shared(study):
    jobs, model, _ = study
    job = jobs["fp32-on-bs2-greedy-none"]
    assert load_key(job, model) is not None
    assert load_key(job, model) != load_key(jobs["bf16-on-bs2-greedy-none"], model)
    with_intervention = type(job).from_json({**job.to_json(), "intervention": {"kind": "fp32_head"}})
    assert load_key(with_intervention, model) is None
    compiled = type(job).from_json({**job.to_json(), "cell": {**job.to_json()["cell"], "compile": "on"}})
    assert load_key(compiled, model) is None
