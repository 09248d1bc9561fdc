"""Incremental reruns with the real Snakemake: after a finished run, a change to the config
schedules exactly the jobs whose inputs or settings changed (asserted job by job on a dry
run), and editing a rule's shell command does not rerun finished GPU jobs under the
repository's rerun policy (workflow/profiles/default: rerun-triggers mtime, params, input)."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from test_workflow import scheduled_jobs

from conftest import REPO, run_snakemake, tiny_study, write_yaml

pytestmark = pytest.mark.slow

AGGREGATION = {("summarize", "results/inc/summary"), ("report", "reports/inc/index.html"), ("all", "")}


def cell(bench: str, name: str) -> tuple[str, str]:
    return ("generate", f"results/inc/cells/tiny/{bench}/{name}.parquet")


def pair(bench: str, axis: str, a: str, b: str, context: str) -> tuple[str, str]:
    return ("compare", f"results/inc/pairs/tiny/{bench}/{axis}/{a}_vs_{b}/{context}.parquet")


def probe(bench: str) -> tuple[str, str]:
    return ("probe", f"results/inc/probes/tiny/{bench}/kv_cache")


def prompt_check(bench: str) -> tuple[str, str]:
    return ("check_prompts", f"results/inc/checks/tiny/{bench}.json")


def jobs_of(stdout: str) -> list[tuple[str, str]]:
    """(rule, output) of each scheduled job; a probe or summarize job by its directory
    (one job writes several tables), every probe rule as 'probe'."""
    jobs = []
    for rule, out in scheduled_jobs(stdout):
        if rule.startswith("probe"):
            jobs.append(("probe", str(Path(out).parent)))
        elif rule == "summarize":
            jobs.append((rule, str(Path(out).parent)))
        else:
            jobs.append((rule, out))
    return jobs


def dry_run(study, config: dict, tmp_path: Path, *extra: str, **kwargs):
    path = write_yaml(tmp_path / "config.yaml", config)
    proc = run_snakemake(study.workdir, path, "-n", *extra, **kwargs)
    return proc, jobs_of(proc.stdout)


def add_benchmark(config):
    config["benchmarks"]["arith_c"] = {"kind": "arithmetic", "n": 2, "seed": 2, "max_new_tokens": 6}
    return {cell("arith_c", "fp32-on-bs1-greedy-none"), cell("arith_c", "fp32-off-bs1-greedy-none"),
            pair("arith_c", "cache", "on", "off", "fp32-x-bs1-greedy-none"), probe("arith_c"),
            prompt_check("arith_c")}


def add_batch_size(config):
    config["grids"][0]["batch_size"] = [1, 2]
    config["comparisons"].append({"axis": "batch_size", "a": 1, "b": 2})
    return {job for bench in ("arith_a", "arith_b") for job in (
        cell(bench, "fp32-on-bs2-greedy-none"), cell(bench, "fp32-off-bs2-greedy-none"),
        pair(bench, "cache", "on", "off", "fp32-x-bs2-greedy-none"),
        pair(bench, "batch_size", "1", "2", "fp32-on-x-greedy-none"),
        pair(bench, "batch_size", "1", "2", "fp32-off-x-greedy-none"))}


def add_precision(config):
    config["grids"][0]["precision"] = ["fp32", "bf16"]
    config["comparisons"].append({"axis": "precision", "a": "fp32", "b": "bf16"})
    return {job for bench in ("arith_a", "arith_b") for job in (
        cell(bench, "bf16-on-bs1-greedy-none"), cell(bench, "bf16-off-bs1-greedy-none"),
        pair(bench, "cache", "on", "off", "bf16-x-bs1-greedy-none"),
        pair(bench, "precision", "fp32", "bf16", "x-on-bs1-greedy-none"),
        pair(bench, "precision", "fp32", "bf16", "x-off-bs1-greedy-none"))}


def _one_benchmark_changed():
    return {cell("arith_b", "fp32-on-bs1-greedy-none"), cell("arith_b", "fp32-off-bs1-greedy-none"),
            pair("arith_b", "cache", "on", "off", "fp32-x-bs1-greedy-none"), probe("arith_b")}


def change_n(config):
    config["benchmarks"]["arith_b"]["n"] = 3
    return _one_benchmark_changed() | {prompt_check("arith_b")}   # more prompts to check


def change_max_new_tokens(config):
    config["benchmarks"]["arith_b"]["max_new_tokens"] = 8
    return _one_benchmark_changed() | {prompt_check("arith_b")}   # prompt + new tokens within the context


@pytest.mark.parametrize("change", [add_benchmark, add_batch_size, add_precision, change_n,
                                    change_max_new_tokens], ids=lambda f: f.__name__)
def test_a_config_change_reruns_only_what_it_touches(finished_tiny_study, tmp_path, change):
    config = tiny_study()
    expected = change(config) | AGGREGATION
    proc, jobs = dry_run(finished_tiny_study, config, tmp_path)
    assert len(jobs) == len(set(jobs)), jobs
    assert set(jobs) == expected, (sorted(set(jobs) - expected), sorted(expected - set(jobs)))
    print(f"{change.__name__}: {dict(sorted(Counter(rule for rule, _ in jobs).items()))}")
    if change in (change_n, change_max_new_tokens):
        # Old cells rerun because their settings changed, and the dry run says so.
        assert "params have changed since last execution" in (proc.stdout + proc.stderr).lower()


def test_nothing_changed_nothing_runs(finished_tiny_study, tmp_path):
    proc, jobs = dry_run(finished_tiny_study, tiny_study(), tmp_path)
    assert jobs == [] and "Nothing to be done" in proc.stdout + proc.stderr


def test_editing_a_rule_command_does_not_rerun_gpu_jobs(finished_tiny_study, tmp_path):
    """A copy of the workflow whose `generate` command gained a flag: under the repository's
    policy nothing reruns; `--list-changes code` names every cell; with the `code` trigger
    switched on, every cell, its pairs and the aggregation would rerun."""
    workflow_copy = tmp_path / "workflow-copy"
    workflow_copy.mkdir()
    shutil.copy2(REPO / "Snakefile", workflow_copy / "Snakefile")  # the checkout's, including the package's
    shipped = Path("src") / "tokenflip" / "workflow"
    shutil.copytree(REPO / shipped, workflow_copy / shipped)
    shutil.copytree(REPO / "config", workflow_copy / "config")
    rule = workflow_copy / shipped / "rules" / "generate.smk"
    text, n = re.subn(r"--out \{output:q\}", "--out {output:q} --quiet", rule.read_text())
    assert n == 1, "generate.smk: the --out argument moved; update this test"
    rule.write_text(text)
    snakefile = workflow_copy / "Snakefile"

    proc, jobs = dry_run(finished_tiny_study, tiny_study(), tmp_path, snakefile=snakefile)
    assert jobs == [] and "Nothing to be done" in proc.stdout + proc.stderr

    listed = run_snakemake(finished_tiny_study.workdir, tmp_path / "config.yaml", "--list-changes", "code",
                           snakefile=snakefile)
    changed = {line.strip() for line in listed.stdout.splitlines() if line.strip().startswith("results/")}
    cells = {cell(bench, f"fp32-{cache}-bs1-greedy-none")[1] for bench in ("arith_a", "arith_b")
             for cache in ("on", "off")}
    assert changed == cells

    proc, jobs = dry_run(finished_tiny_study, tiny_study(), tmp_path, "--rerun-triggers", "mtime", "params",
                         "input", "code", snakefile=snakefile)
    # The KV-cache probes choose their prompts from those cache pairs: they follow them.
    expected = {("generate", c) for c in cells} | AGGREGATION | {
        pair(bench, "cache", "on", "off", "fp32-x-bs1-greedy-none") for bench in ("arith_a", "arith_b")} | {
        ("probe", f"results/inc/probes/tiny/{bench}/kv_cache") for bench in ("arith_a", "arith_b")}
    assert set(jobs) == expected and len(jobs) == len(expected)
    assert "code has changed since last execution" in (proc.stdout + proc.stderr).lower()
