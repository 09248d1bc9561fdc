"""Runs where users run them, with the real Snakemake on tiny models: a crash (kill -9)
in the middle of a cell, a cell that fails under --keep-going, configs that are wrong, and
the same cell run twice."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from html.parser import HTMLParser

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_workflow import scheduled_jobs

from conftest import copy_run, run_snakemake, snakemake_command, tiny_study, write_yaml
from tokenflip.core import storage

AGGREGATION = {"summarize", "report", "all"}


def cell_path(bench: str, name: str, model: str = "tiny") -> str:
    return f"results/inc/cells/{model}/{bench}/{name}.parquet"


def pair_path(bench: str, axis: str, a: str, b: str, context: str, model: str = "tiny") -> str:
    return f"results/inc/pairs/{model}/{bench}/{axis}/{a}_vs_{b}/{context}.parquet"


def scheduled(stdout: str) -> set[tuple[str, str]]:
    """(rule, output) of the scheduled jobs; summarize, report and all by rule name only."""
    jobs = scheduled_jobs(stdout)
    out = {(rule, "" if rule in AGGREGATION else path) for rule, path in jobs}
    assert len(out) == len(jobs), jobs
    return out


# --- Atomic writes ---------------------------------------------------------------------------

def test_a_write_removes_temporaries_a_killed_write_of_the_same_file_left(tmp_path):
    """What a kill -9 during `write_table` leaves (`.name.XXXXXXXX.tmp`) is removed by the
    next write of that file, and nothing that belongs to another file."""
    import pyarrow as pa

    target = tmp_path / "cell.parquet"
    stale = [tmp_path / ".cell.parquet.k9_x1y2z.tmp", tmp_path / ".cell.parquet.abcdefgh.tmp"]
    others = [tmp_path / ".cell.parquet.v2.parquet.abcdefgh.tmp",   # another file's temporary
              tmp_path / ".other.parquet.abcdefgh.tmp", tmp_path / "cell.parquet.bak"]
    for p in stale + others:
        p.write_bytes(b"PAR1 truncated")
    storage.write_table(pa.table({"x": [1, 2]}), target, {"kind": "test"})
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in others)
    assert storage.read_metadata(target)["kind"] == "test"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".cell.parquet.")) == \
        [".cell.parquet.v2.parquet.abcdefgh.tmp"]


# --- kill -9 in the middle of a cell -------------------------------------------------------

def _wait_for_group_exit(pgid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes of group {pgid} survived SIGKILL")


@pytest.mark.slow
def test_kill_9_during_a_cell_then_the_next_run_redoes_only_what_did_not_finish(finished_tiny_study, tmp_path):
    workdir = copy_run(finished_tiny_study.workdir, tmp_path / "run")
    config = tiny_study()
    config["grids"].append({"precision": ["fp32"], "cache": ["on"], "batch_size": [2]})
    config["comparisons"].append({"axis": "batch_size", "a": 1, "b": 2})
    config_path = write_yaml(tmp_path / "config.yaml", config)
    new_cells = {b: cell_path(b, "fp32-on-bs2-greedy-none") for b in ("arith_a", "arith_b")}
    new_pairs = {b: pair_path(b, "batch_size", "1", "2", "fp32-on-x-greedy-none") for b in ("arith_a", "arith_b")}
    logs = {b: workdir / f"logs/inc/generate/tiny/{b}/fp32-on-bs2-greedy-none.log" for b in new_cells}

    # Two new generate jobs run one after the other (one core); crash during the second.
    with (tmp_path / "crashed-run.log").open("w") as log:
        proc = subprocess.Popen(snakemake_command(workdir, config_path, cores=1), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 300
        try:
            while True:
                finished = [b for b, p in new_cells.items() if (workdir / p).exists()]
                running = [b for b in new_cells if logs[b].exists() and not (workdir / new_cells[b]).exists()]
                if len(finished) == 1 and running:
                    os.killpg(proc.pid, signal.SIGKILL)   # snakemake and every job it started
                    break
                assert proc.poll() is None, "snakemake ended before the crash: " + \
                    (tmp_path / "crashed-run.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "no generate job started"
                time.sleep(0.02)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _wait_for_group_exit(proc.pid)
    (killed,) = running
    killed_cell = workdir / new_cells[killed]

    # Nothing that looks complete for the killed cell.
    assert not killed_cell.exists()
    assert not [p for p in killed_cell.parent.iterdir() if p.name.endswith(".parquet") and "bs2" in p.name]
    leftovers = list(killed_cell.parent.glob(f".{killed_cell.name}.*.tmp"))
    if not leftovers:
        # The kill came before the write began (it usually does: the write takes
        # milliseconds). Leave what a kill during the write would leave, a truncated file
        # under the temporary name, so that the run below shows it is cleaned up.
        first = (workdir / new_cells[finished[0]]).read_bytes()
        stale = killed_cell.parent / f".{killed_cell.name}.k9stale0.tmp"
        stale.write_bytes(first[: len(first) // 2])
        leftovers = [stale]
        print(f"killed {killed}: no temporary left by the kill; planted {stale.name}")
    else:
        print(f"killed {killed}: the kill left {[p.name for p in leftovers]}")

    # The next invocation schedules the killed cell and what depends on it (plus a pair
    # job the kill may have interrupted too), and nothing that had finished. Without any
    # profile (so without the profiles' rerun-incomplete), to show it is not needed: the
    # killed job's output does not exist, so Snakemake has nothing incomplete to distrust.
    missing = {p for p in [*new_cells.values(), *new_pairs.values()] if not (workdir / p).exists()}
    dry = run_snakemake(workdir, config_path, "-n", profile=None)
    assert "rerun-incomplete" not in dry.stdout + dry.stderr
    expected = ({("generate", p) for p in missing if "/cells/" in p}
                | {("compare", p) for p in missing if "/pairs/" in p}
                | {(rule, "") for rule in AGGREGATION})
    assert scheduled(dry.stdout) == expected
    assert ("generate", new_cells[finished[0]]) not in expected

    # The crash left Snakemake's lock: the real run refuses until `--unlock`.
    refused = run_snakemake(workdir, config_path, check=False, profile=None)
    assert refused.returncode != 0 and "--unlock" in refused.stdout + refused.stderr
    print(f"after kill -9: dry run {sorted(scheduled(dry.stdout))}; real run refused: LockException, "
          f"needs --unlock; --rerun-incomplete not needed")
    assert not killed_cell.exists()
    run_snakemake(workdir, config_path, "--unlock", profile=None)
    run_snakemake(workdir, config_path, profile=None)
    for p in [*new_cells.values(), *new_pairs.values()]:
        assert (workdir / p).exists(), p
    assert storage.read_metadata(killed_cell)["cell_id"] == f"tiny/{killed}/fp32-on-bs2-greedy-none"
    assert not any(p.exists() for p in leftovers)
    assert not list((workdir / "results").rglob("*.tmp"))
    assert "Nothing to be done" in run_snakemake(workdir, config_path, "-n").stdout


# --- A failing cell under --keep-going -----------------------------------------------------

class _MissingRows(HTMLParser):
    """Text of every `<tr class="missing">` of the report, and its data-pair if any."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[str | None, str]] = []
        self._row: list[str] | None = None
        self._pair = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and "missing" in (attrs.get("class") or "").split():
            self._row, self._pair = [], attrs.get("data-pair")

    def handle_data(self, data):
        if self._row is not None:
            self._row.append(data)

    def handle_endtag(self, tag):
        if tag == "tr" and self._row is not None:
            self.rows.append((self._pair, " ".join(" ".join(self._row).split())))
            self._row = None


@pytest.mark.slow
def test_a_failing_model_still_gives_a_report_listing_its_cells_as_missing(finished_tiny_study, tmp_path):
    workdir = copy_run(finished_tiny_study.workdir, tmp_path / "run")
    summary_dir = workdir / "results" / "inc" / "summary"
    complete = workdir / "reports" / "inc" / "index.html"
    report = workdir / "reports" / "inc" / "partial.html"
    assert summary_dir.is_dir()
    complete_before = complete.read_bytes()
    # Good work for this run too: one finished cell is gone and must be made again.
    redo = workdir / cell_path("arith_a", "fp32-on-bs1-greedy-none")
    redo.unlink()
    # A real failure that no check before the job can see: a negative rms_norm_eps. The model
    # is built and saved fine; every logit of its forward pass is NaN, so its cells fail.
    config = tiny_study()
    config["models"]["broken"] = {"source": "random", "architecture": "llama", "seed": 0,
                                  "overrides": {"rms_norm_eps": -1.0}}
    config_path = write_yaml(tmp_path / "config.yaml", config)
    started = time.time()
    proc = run_snakemake(workdir, config_path, "--keep-going", check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr

    # Every other cell and pair finished; the deleted cell and its pair were made again.
    for bench in ("arith_a", "arith_b"):
        for cache in ("on", "off"):
            assert (workdir / cell_path(bench, f"fp32-{cache}-bs1-greedy-none")).exists()
            assert not (workdir / cell_path(bench, f"fp32-{cache}-bs1-greedy-none", "broken")).exists()
        assert (workdir / pair_path(bench, "cache", "on", "off", "fp32-x-bs1-greedy-none")).exists()
    assert redo.stat().st_mtime > started
    assert (workdir / pair_path("arith_a", "cache", "on", "off", "fp32-x-bs1-greedy-none")).stat().st_mtime > started
    failed_log = (workdir / "logs/inc/generate/broken/arith_a/fp32-on-bs1-greedy-none.log").read_text()
    assert "the logits are not finite" in failed_log

    # The onerror handler rendered the report over what exists ...
    assert "partial report" in out and report.stat().st_mtime > started
    parser = _MissingRows()
    parser.feed(report.read_text())
    missing_text = " | ".join(text for _, text in parser.rows)
    broken_cells = [f"broken/{bench}/fp32-{cache}-bs1-greedy-none" for bench in ("arith_a", "arith_b")
                    for cache in ("on", "off")]
    for cell_id in broken_cells:
        assert f"{cell_id} missing" in missing_text, missing_text
    assert "tiny/" not in missing_text
    html = report.read_text()
    assert "Did not finish" in html and all(c in html.split("Did not finish", 1)[1] for c in broken_cells)
    assert {pair for pair, _ in parser.rows if pair} == {
        f"broken/{bench}/cache/on_vs_off/fp32-x-bs1-greedy-none" for bench in ("arith_a", "arith_b")}
    # ... beside the complete report of the last successful run, never in its place.
    assert complete.read_bytes() == complete_before and "partial" not in complete.read_text()[:2000]
    assert not list((workdir / "results" / "inc").glob(".summary-partial*"))

    # Retrying the same config retries every failed job and the aggregation (the config
    # changed since the summaries were made), with or without a profile: nothing relies
    # on Snakemake's incomplete-output records.
    retry = scheduled(run_snakemake(workdir, config_path, "-n").stdout)
    assert {job for job in retry if "broken" not in job[1]} == {(rule, "") for rule in AGGREGATION}
    assert sorted("probe" if rule.startswith("probe") else rule for rule, _ in retry if rule not in AGGREGATION) \
        == ["compare"] * 2 + ["generate"] * 4 + ["probe"] * 2
    plain = run_snakemake(workdir, config_path, "-n", profile=None)
    assert scheduled(plain.stdout) == retry

    # Fixing the config (here: back to the study of the last successful run, the one the
    # old summaries were recorded for) reruns exactly the aggregation, and the report is
    # complete again.
    fixed = write_yaml(tmp_path / "fixed.yaml", tiny_study())
    fixed_dry = run_snakemake(workdir, fixed, "-n")
    assert scheduled(fixed_dry.stdout) == {(rule, "") for rule in AGGREGATION}, fixed_dry.stdout[-3000:]
    before = time.time()
    run_snakemake(workdir, fixed)
    report = complete
    assert report.stat().st_mtime >= before
    assert not (workdir / "reports" / "inc" / "partial.html").exists()   # superseded
    assert all((summary_dir / name).stat().st_mtime >= before for name in os.listdir(summary_dir))
    parser = _MissingRows()
    parser.feed(report.read_text())
    assert parser.rows == [] and "Did not finish" not in report.read_text()
    cells = pq.read_table(summary_dir / "cells.parquet").to_pylist()
    assert len(cells) == 4 and {c["status"] for c in cells} == {"done"}


# --- Bad configs ---------------------------------------------------------------------------

def _bad(edit):
    config = tiny_study()
    edit(config)
    return config


BAD_CONFIGS = {   # the config, and the one line of error that names the key and the value
    "unknown-precision": (_bad(lambda c: c["grids"][0].update(precision=["fp32", "fp64"])),
                          "grids.0.precision.1: 'fp64' is not one of"),
    "batch-size-0": (_bad(lambda c: c["grids"][0].update(batch_size=[0])),
                     "grids.0.batch_size.0: 0 is below the minimum 1"),
    "unknown-benchmark-kind": (_bad(lambda c: c["benchmarks"]["arith_a"].update(kind="gsm9k")),
                               "benchmarks.arith_a.kind: 'gsm9k' is not one of"),
    "tau-zero": (_bad(lambda c: c.update(interventions={"none": {"kind": "none"},
                                                        "c": {"kind": "fp32_head", "tau": 0}})),
                 "interventions.c.tau: 0 is less than or equal to the minimum of 0"),
    "tau-negative": (_bad(lambda c: c.update(interventions={"none": {"kind": "none"},
                                                            "c": {"kind": "fp32_head", "tau": -0.5}})),
                     "interventions.c.tau: -0.5 is less than or equal to the minimum of 0"),
    "unsafe-label": (_bad(lambda c: c.update(decoding={"greedy": {"strategy": "greedy"},
                                                       "t=0.7/top p": {"strategy": "sample"}})),
                     "decoding: 't=0.7/top p' contains characters that are not allowed in file names"),
    "unsafe-model-name": (_bad(lambda c: c["models"].update({"../tiny": {"source": "random",
                                                                         "architecture": "llama"}})),
                          "models: '../tiny' contains characters that are not allowed in file names"),
    "duplicate-model": (None, "duplicate key 'tiny' at line 5 (first at line 3)"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_a_bad_config_stops_before_any_job_naming_key_and_value(tmp_path, case):
    config, expected = BAD_CONFIGS[case]
    path = tmp_path / "config.yaml"
    if config is None:   # YAML that plain loaders would silently take (the second model wins)
        path.write_text("run: inc\n"
                        "models:\n"
                        "  tiny: {source: random, architecture: llama, seed: 0}\n"
                        "  other: {source: random, architecture: gemma2}\n"
                        "  tiny: {source: random, architecture: mistral}\n"
                        "benchmarks: {arith_a: {kind: arithmetic, n: 2}}\n"
                        "grids: [{precision: [fp32], cache: ['on'], batch_size: [1]}]\n"
                        "comparisons: []\n")
    else:
        write_yaml(path, config)
    workdir = tmp_path / "run"
    workdir.mkdir()
    proc = run_snakemake(workdir, path, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert out.count(expected) == 1, out[-3000:]   # once: one error, before any job
    assert "config.yaml" in out and "Job stats" not in out and "rule " not in out
    for made in ("results", "reports", "logs", "resources"):
        assert not (workdir / made).exists(), made


# --- The same cell twice -------------------------------------------------------------------

@pytest.mark.slow
def test_the_same_cell_run_twice_is_bitwise_identical(finished_tiny_study, tmp_path):
    workdir = copy_run(finished_tiny_study.workdir, tmp_path / "run")
    config_path = write_yaml(tmp_path / "config.yaml", tiny_study())
    target = cell_path("arith_a", "fp32-off-bs1-greedy-none")
    first, first_meta = storage.read_table(workdir / target)
    (workdir / target).unlink()
    dry = run_snakemake(workdir, config_path, "-n", target)
    assert scheduled(dry.stdout) == {("generate", target)}
    run_snakemake(workdir, config_path, target)
    second, second_meta = storage.read_table(workdir / target)

    assert second_meta["token_stream_sha256"] == first_meta["token_stream_sha256"]
    assert second_meta["logits_sha256"] == first_meta["logits_sha256"]
    assert second_meta["wall_seconds"] != first_meta["wall_seconds"]   # it really ran again
    assert second.column("token_ids").to_pylist() == first.column("token_ids").to_pylist()

    def logit_bits(table):
        values = table.column("top_logits").combine_chunks().flatten().flatten()
        return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32).view(np.uint32)

    a, b = logit_bits(first), logit_bits(second)
    assert a.size > 0 and a.shape == b.shape and np.array_equal(a, b)
