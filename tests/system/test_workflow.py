"""The real Snakemake scheduler on tiny models: a full run renders the report, and adding
a model reschedules only that model's jobs plus the aggregation."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from conftest import REPO

MODEL_A = {"source": "random", "architecture": "llama", "seed": 0}
MODEL_B = {"source": "random", "architecture": "mistral", "seed": 1}


def write_config(workdir: Path, models: dict) -> Path:
    config = {
        "run": "wf",
        "models": models,
        "benchmarks": {"arith": {"kind": "arithmetic", "n": 3, "max_new_tokens": 6}},
        "generation": {"record_top_k": 8, "device": "cpu", "threads": 1},
        "interventions": {"none": {"kind": "none"}, "c_gated": {"kind": "fp32_head", "tau": 0.01}},
        "grids": [{"precision": ["fp32", "bf16"], "cache": ["on", "off"], "batch_size": [1]},
                  {"precision": ["fp32", "bf16"], "cache": ["on"], "batch_size": [1],
                   "intervention": ["c_gated"]}],
        "comparisons": [{"axis": "cache", "a": "on", "b": "off"},
                        {"axis": "precision", "a": "fp32", "b": "bf16"}],
        "probes": {"kv_cache": {"prompts": 1, "precisions": ["fp32", "bf16"], "patch_steps": 1},
                   "precision": {"prompts": 2, "pairs": [["bf16", "fp32"]], "flips": 1}},
    }
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def snakemake(workdir: Path, config: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
           "--directory", str(workdir), "--configfile", str(config),
           "--cores", "2", "--resources", "gpu=1", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def scheduled_jobs(dry_run_output: str) -> list[tuple[str, str]]:
    """(rule, first output) of every job a dry run lists."""
    jobs, rule = [], None
    for line in dry_run_output.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):", line.strip()):
            rule = m.group(1)
        elif (m := re.match(r"^output: (.+)$", line.strip())) and rule:
            jobs.append((rule, m.group(1).split(",")[0].strip()))
            rule = None
        elif line.strip() == "" and rule == "all":
            jobs.append(("all", ""))
            rule = None
    return jobs


class _Rates(HTMLParser):
    """Collects the divergence-rate cell of every pair row of the report."""

    def __init__(self):
        super().__init__()
        self.rates: dict[str, str] = {}
        self._pair = None
        self._in_rate = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and "data-pair" in attrs:
            self._pair = attrs["data-pair"]
        if tag == "td" and attrs.get("class") == "rate":
            self._in_rate = True

    def handle_data(self, data):
        if self._in_rate and self._pair:
            self.rates[self._pair] = data.strip()

    def handle_endtag(self, tag):
        if tag == "td":
            self._in_rate = False


@pytest.mark.slow
def test_full_run_then_adding_a_model_reruns_only_its_jobs(tmp_path):
    config = write_config(tmp_path, {"tiny-llama": MODEL_A})
    snakemake(tmp_path, config)
    report = tmp_path / "reports" / "wf" / "index.html"
    assert report.exists()
    cells = sorted((tmp_path / "results" / "wf" / "cells").rglob("*.parquet"))
    assert [c.name for c in cells] == ["bf16-off-bs1-greedy-none.parquet", "bf16-on-bs1-greedy-c_gated.parquet",
                                       "bf16-on-bs1-greedy-none.parquet", "fp32-off-bs1-greedy-none.parquet",
                                       "fp32-on-bs1-greedy-c_gated.parquet", "fp32-on-bs1-greedy-none.parquet"]
    assert not list((tmp_path / "results").rglob("*.tmp"))

    # Numbers in the HTML are the numbers in the summary table.
    pairs = pq.read_table(tmp_path / "results" / "wf" / "summary" / "pairs.parquet").to_pylist()
    assert len(pairs) == 5 and all(p["status"] == "done" for p in pairs)
    parser = _Rates()
    parser.feed(report.read_text())
    assert parser.rates == {p["pair_id"]: f"{100 * p['divergence_rate']:.1f}%" for p in pairs}

    # The intervention table compares C against the baseline on the same prompts.
    inter = pq.read_table(tmp_path / "results" / "wf" / "summary" / "interventions.parquet").to_pandas()
    assert sorted(inter["intervention"]) == ["c_gated", "none"]
    by_name = {r["intervention"]: r for r in inter.to_dict("records")}
    prec_pairs = {p["context"].split("-")[-1]: p for p in pairs if p["axis"] == "precision" and "-on-" in p["context"]}
    assert by_name["c_gated"]["ear"] == prec_pairs["c_gated"]["exact_agreement"]
    assert by_name["none"]["lift"] == 0.0
    assert by_name["c_gated"]["lift"] == pytest.approx(prec_pairs["c_gated"]["exact_agreement"]
                                                       - prec_pairs["none"]["exact_agreement"])
    assert 'id="precision"' in report.read_text()

    # The KV-cache probe ran and its section is in the report.
    kv_steps = pq.read_table(tmp_path / "results" / "wf" / "summary" / "kv_steps.parquet").to_pandas()
    assert set(kv_steps["precision"]) == {"fp32", "bf16"} and len(kv_steps) == 12
    assert 'id="kv-cache"' in report.read_text()
    lens = pq.read_table(tmp_path / "results" / "wf" / "summary" / "precision_layers.parquet").to_pandas()
    assert set(lens["a"]) == {"bf16"} and lens["layer"].nunique() == 2

    # fp32 with and without the cache agree token for token on this model.
    fp32 = next(p for p in pairs if p["axis"] == "cache" and p["context"].startswith("fp32"))
    assert fp32["n_diverged"] == 0 and fp32["max_abs_dlogit"] < 1e-4

    # Nothing to do when nothing changed.
    nothing = snakemake(tmp_path, config, "-n")
    assert "Nothing to be done" in nothing.stdout + nothing.stderr

    # Adding a model schedules only that model's jobs, plus aggregation and report.
    config = write_config(tmp_path, {"tiny-llama": MODEL_A, "tiny-mistral": MODEL_B})
    jobs = scheduled_jobs(snakemake(tmp_path, config, "-n").stdout)
    counts = Counter(rule for rule, _ in jobs)
    assert counts == {"prepare_model": 1, "check_prompts": 1, "generate": 6, "compare": 5, "probe_kv_cache": 1,
                      "probe_precision": 1, "summarize": 1,
                      "report": 1, "all": 1}
    outputs = [out for rule, out in jobs if rule in ("prepare_model", "check_prompts", "generate", "compare",
                                                     "probe_kv_cache", "probe_precision")]
    assert all("tiny-mistral" in out for out in outputs), outputs


@pytest.mark.parametrize("config, expected", [
    ("paper-kv-cache.yaml", {"prepare_model": 3, "check_prompts": 3, "generate": 24, "compare": 18,
                             "probe_kv_cache": 3, "summarize": 1, "report": 1, "all": 1}),
    # 9 models x 4 bare benchmarks and 2 models on the chat-template GSM8K: the cells and
    # pairs counted in test_plan_config; one prompt check per model and benchmark it runs;
    # the precision probe on the 2 models the paper traced x 3 benchmarks.
    ("paper-precision.yaml", {"prepare_model": 9, "check_prompts": 38, "generate": 1044, "compare": 1190,
                              "probe_precision": 6, "summarize": 1, "report": 1, "all": 1}),
])
def test_paper_config_dry_run(tmp_path, config, expected):
    """The paper configs schedule their whole study without a GPU or the hub (dry run)."""
    proc = snakemake(tmp_path, REPO / "config" / config, "-n")
    assert Counter(rule for rule, _ in scheduled_jobs(proc.stdout)) == expected
