"""The tiny workflow through a real single-node SLURM cluster (tests/slurm_cluster.py) with
the repository's SLURM profile: every job is an sbatch job, generation jobs ask for a GPU
and land in the GPU partition, and the report comes out as on a workstation."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from slurm_cluster import PARTITIONS, slurm_cluster  # noqa: F401  (the fixture)

from conftest import REPO

SLURM_PROFILE = REPO / "workflow" / "profiles" / "slurm" / "config.yaml"
SUBMITTED = re.compile(r"Job (\S+) has been submitted with SLURM jobid (\d+) \(log: (\S+)\)")


def write_config(workdir: Path) -> Path:
    """The smallest useful study: one random llama, fp32/bf16 x cache on/off."""
    config = {
        "run": "wf",
        "models": {"tiny-llama": {"source": "random", "architecture": "llama", "seed": 0}},
        "benchmarks": {"arith": {"kind": "arithmetic", "n": 3, "max_new_tokens": 6}},
        "generation": {"record_top_k": 8, "device": "cpu", "threads": 1},
        "grids": [{"precision": ["fp32", "bf16"], "cache": ["on", "off"], "batch_size": [1]}],
        "comparisons": [{"axis": "cache", "a": "on", "b": "off"},
                        {"axis": "precision", "a": "fp32", "b": "bf16"}],
    }
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def write_test_profile(directory: Path) -> Path:
    """The repository's SLURM profile, sized for a one-node test cluster without slurmdbd."""
    profile = yaml.safe_load(SLURM_PROFILE.read_text())
    # gpu=1 limits one grouped submission; as a global pool it would serialise the whole cluster.
    assert "gpu=1" in profile["resources"] and "gpu=local" in profile["set-resource-scopes"]
    assert {profile["default-resources"]["slurm_partition"],
            profile["set-resources"]["generate"]["slurm_partition"]} <= set(PARTITIONS)
    profile.update({
        "cores": 2,  # the test node's CPUs: what one grouped submission may use
        "resources": ["gpu=1", "mem_mb=600"],
        "jobs": 4,
        "latency-wait": 5,
        # No accounting here: sacct cannot answer, squeue can (MinJobAge is long enough).
        "slurm-status-command": "squeue",
        "slurm-init-seconds-before-status-checks": 1,
        "slurm-keep-successful-logs": True,
        "set-threads": {rule: 1 for rule in profile.get("set-threads", {})},
    })
    profile["default-resources"].update(mem_mb=300, runtime=10)
    for resources in profile["set-resources"].values():
        resources.update(mem_mb=300, runtime=10)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return directory


def show_job(cluster, jobid: str) -> dict[str, str]:
    out = cluster.run("scontrol", "-o", "show", "job", jobid).stdout.strip()
    assert out, f"slurmctld does not know job {jobid}"
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


@pytest.mark.slow
def test_workflow_runs_through_slurm(slurm_cluster, tmp_path, capsys):  # noqa: F811
    cluster = slurm_cluster
    start = time.monotonic()
    workdir = tmp_path / "work"
    workdir.mkdir()
    config = write_config(workdir)
    profile = write_test_profile(tmp_path / "profile")
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
           "--directory", str(workdir), "--configfile", str(config)]
    # What a plain dry run schedules; every one of these jobs but `all` must go to SLURM.
    dry = subprocess.run([*cmd, "-n"], cwd=workdir, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stdout[-4000:] + dry.stderr[-4000:]
    expected = Counter(re.findall(r"^(?:local)?rule (\w+):", dry.stdout, flags=re.M))
    del expected["all"]
    assert expected["generate"] == 4, expected
    cmd += ["--profile", str(profile)]
    try:
        proc = subprocess.run(cmd, cwd=workdir, env=cluster.env, capture_output=True, text=True, timeout=420)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"snakemake timed out:\n{(e.stdout or b'')[-4000:]}\n{(e.stderr or b'')[-6000:]}\n"
                             f"{cluster.run('squeue', '--states=all').stdout}\n{cluster.log_tail()}")
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{log[-8000:]}\n{cluster.log_tail()}")
    wall = time.monotonic() - start

    assert (workdir / "reports" / "wf" / "index.html").exists()
    assert len(list((workdir / "results" / "wf" / "cells").rglob("*.parquet"))) == 4

    # Every job went through sbatch, grouped: one submission for the model's prompt checks,
    # one for its 4 generation cells (group-components 4), one for its 4 comparisons, and
    # the ungrouped prepare_model, summarize and report: 6 submissions for 12 jobs (a group
    # job's Snakemake id is a UUID).
    submitted = SUBMITTED.findall(log)
    names = {slurm_id: re.search(r"/((?:rule|group)_[\w.-]+)/", path).group(1) for _, slurm_id, path in submitted}
    # (A group's log folder is named by the group and the rules in it.)
    assert Counter(names.values()) == {"rule_prepare_model": 1, "group_prompts_tiny-llama_check_prompts": 1,
                                       "group_generate_tiny-llama_generate": 1,
                                       "group_compare_tiny-llama_arith_compare": 1,
                                       "rule_summarize": 1, "rule_report": 1}, log[-4000:]
    assert sum(expected.values()) == 12
    for slurm_id, name in names.items():
        job = show_job(cluster, slurm_id)
        assert job["JobState"] == "COMPLETED" and job["NodeList"] == cluster.node, (name, job)
        gpu = "gpu" in job.get("TresPerJob", "")
        if name == "group_generate_tiny-llama_generate":
            # gpu=1 per cell, run one after the other: the submission asks for one GPU, in the GPU partition.
            assert gpu and job["TresPerJob"].endswith("gpu:1") and job["Partition"] == "gpu", job
        else:
            assert not gpu and job["Partition"] == "cpu", (name, job)
    # The jobs' own SLURM logs (kept by the test profile) come from inside the allocations.
    slurm_logs = list((workdir / ".snakemake" / "slurm_logs" / "group_generate_tiny-llama_generate").rglob("*.log"))
    assert len(slurm_logs) == 1

    # Grouping changes where jobs run, not what they compute: the same study run locally
    # gives the same tokens in every cell and the same divergences in every pair.
    local = tmp_path / "local"
    local.mkdir()
    run = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory",
                          str(local), "--configfile", str(write_config(local)), "--cores", "2", "--resources",
                          "gpu=1"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    from tokenflip.core import storage

    for path in sorted((workdir / "results" / "wf" / "cells").rglob("*.parquet")):
        twin = local / path.relative_to(workdir)
        assert storage.read_table(path)[1]["token_stream_sha256"] == storage.read_table(twin)[1]["token_stream_sha256"]
    pairs = [pq.read_table(d / "results" / "wf" / "summary" / "pairs.parquet").to_pandas() for d in (workdir, local)]
    columns = ["axis", "context", "n_prompts", "n_diverged"]
    assert pairs[0][columns].sort_values(columns).values.tolist() == pairs[1][columns].sort_values(columns).values.tolist()

    with capsys.disabled():
        print(f"\n[slurm] {len(names)} SLURM submissions for {sum(expected.values())} jobs, "
              f"workflow wall time {wall:.1f}s")


def test_grouping_cuts_the_submissions_of_a_100_cell_study_by_5x(tmp_path):
    """What the repository's SLURM profile submits for a 100-cell study (two models, two
    benchmarks), as the real Snakemake plans it: each group job is one sbatch call, each
    ungrouped job one more. Without the profile's groups, every job is a submission."""
    grid = {"precision": ["fp32", "bf16", "fp16"], "cache": ["on", "off"], "batch_size": [1],
            "repeat": ["default", 2, 3, 4]}
    config = {"run": "s100",
              "models": {"tiny-a": {"source": "random", "architecture": "llama", "seed": 0},
                         "tiny-b": {"source": "random", "architecture": "llama", "seed": 1}},
              "benchmarks": {"arith": {"kind": "arithmetic", "n": 2, "max_new_tokens": 2},
                             "arith2": {"kind": "arithmetic", "n": 2, "seed": 5, "max_new_tokens": 2}},
              "generation": {"record_top_k": 4, "device": "cpu", "threads": 1},
              "grids": [grid, {"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "repeat": [5]}],
              "comparisons": [{"axis": "cache", "a": "on", "b": "off"}, {"axis": "precision", "a": "fp32", "b": "bf16"}]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
           "--configfile", str(path), "-n"]
    plain = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    grouped = subprocess.run([*cmd, "--profile", str(SLURM_PROFILE.parent)], capture_output=True, text=True,
                             timeout=300)
    assert plain.returncode == 0 and grouped.returncode == 0, plain.stderr[-2000:] + grouped.stderr[-2000:]
    jobs = Counter(re.findall(r"^(?:local)?rule (\w+):", plain.stdout, flags=re.M))
    assert jobs["generate"] == 100 and jobs["compare"] == 80
    del jobs["all"]  # runs in Snakemake's own process
    groups = Counter(re.findall(r"Group job (\S+) \(jobs in", grouped.stdout))
    ungrouped = Counter(re.findall(r"^(?:local)?rule (\w+):", grouped.stdout, flags=re.M))
    del ungrouped["all"]
    # Per model: 50 cells in 13 GPU submissions of up to 4, one for its prompt checks,
    # one per benchmark for its comparisons; prepare_model, summarize and report alone.
    assert groups == {"generate_tiny-a": 13, "generate_tiny-b": 13, "prompts_tiny-a": 1, "prompts_tiny-b": 1,
                      "compare_tiny-a_arith": 1, "compare_tiny-a_arith2": 1, "compare_tiny-b_arith": 1,
                      "compare_tiny-b_arith2": 1}
    assert ungrouped == {"prepare_model": 2, "summarize": 1, "report": 1}
    submissions = sum(groups.values()) + sum(ungrouped.values())
    assert sum(jobs.values()) == 188 and submissions == 36
    assert sum(jobs.values()) / submissions >= 5


@pytest.mark.slow
def test_rounds_through_slurm_submit_only_the_open_cells_next_blocks(slurm_cluster, tmp_path):  # noqa: F811
    """A study in rounds under the SLURM profile: after round 1 (its checkpoint runs in
    Snakemake's own process), round 2 submits blocks for the cells of the comparisons still
    open and their floor only; a comparison decided in round 1 takes no further block."""
    cluster = slurm_cluster
    config = {
        "run": "rr",
        "models": {"tiny-llama": {"source": "random", "architecture": "llama", "seed": 0}},
        "benchmarks": {"arith": {"kind": "arithmetic", "n": 32, "max_new_tokens": 6}},
        "generation": {"record_top_k": 4, "device": "cpu", "threads": 1},
        "blocks": {"first": 16},
        "rounds": {},
        "decoding": {"greedy": {"strategy": "greedy"}, "hot": {"strategy": "sample", "temperature": 2.0}},
        "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [4], "decoding": ["greedy", "hot"]},
                  {"precision": ["fp32"], "cache": ["off"], "batch_size": [4]},
                  {"precision": ["fp32"], "cache": ["on"], "batch_size": [4], "repeat": [2]}],
        "comparisons": [{"axis": "decoding", "a": "greedy", "b": "hot"}, {"axis": "cache", "a": "on", "b": "off"},
                        {"axis": "repeat", "a": "default", "b": 2}],
    }
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    profile = write_test_profile(tmp_path / "profile")
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "config.yaml"), "--profile", str(profile)]
    # The cells are the target: their joins ask the rounds which blocks they take (the pairs,
    # summary and report after them go through SLURM as in the test above).
    cells = [f"results/rr/cells/tiny-llama/arith/{name}.parquet" for name in
             ("fp32-on-bs4-greedy-none", "fp32-on-bs4-hot-none", "fp32-off-bs4-greedy-none",
              "fp32-on-bs4-greedy-none-repeat=2")]
    proc = subprocess.run([*cmd, *cells], cwd=workdir, env=cluster.env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{log[-8000:]}\n{cluster.log_tail()}"
    rounds = workdir / "results" / "rr" / "rounds"
    first = json.loads((rounds / "1.json").read_text())
    blocks = workdir / "results" / "rr" / "blocks" / "tiny-llama" / "arith"
    cells = sorted(p.name for p in blocks.iterdir())
    assert len(cells) == 4
    # Sampling at temperature 2 against greedy parts every prompt: decided in round 1; the
    # cache comparison parts none and goes on, with its cells and the floor's.
    assert list(first["decided"]) == ["tiny-llama/arith/decoding/greedy_vs_hot/fp32-on-bs4-x-none"], first
    going_on = {cell_id.rsplit("/", 1)[-1] for cell_id in first["continue"]}
    assert going_on == {"fp32-on-bs4-greedy-none", "fp32-off-bs4-greedy-none", "fp32-on-bs4-greedy-none-repeat=2"}
    assert sorted(cell for cell in cells if (blocks / cell / "16-32.parquet").exists()) == sorted(going_on)
    # Round 2 was submitted after round 1's checkpoint: its generate jobs, the open cells' only.
    second = [line for line in log.splitlines() if "wildcards:" in line and "first=16, end=32" in line]
    assert sorted(re.search(r"cell=([^,]+)", line).group(1) for line in second) == sorted(going_on), log[-4000:]
    generate_groups = [path for _, _, path in SUBMITTED.findall(log) if "/group_generate_" in path]
    assert len(generate_groups) >= 2, log[-4000:]  # round 1's blocks, then round 2's
