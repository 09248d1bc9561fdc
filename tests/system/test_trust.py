"""A real study is never silently wrong: its jobs are exactly its config's, and stale,
foreign, corrupt, crashed or badly named results and inputs are refused with the file, the
key and the value, before any job runs where that is possible."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_workflow import scheduled_jobs

from conftest import REPO, SHARED_DATA, copy_run, run_snakemake, snakemake_command, tiny_study, write_yaml
from tokenflip.core import storage
from tokenflip.core.layout import RunLayout
from tokenflip.run.benchmarks import BenchmarkError, build_benchmark
from tokenflip.run.probes import PROBES
from tokenflip.study import config as cfg
from tokenflip.study.plan import expand_cells, expand_pairs


def tokenflip(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "tokenflip", *args], capture_output=True, text=True, cwd=cwd,
                          env=env)


def planned_outputs(config: dict) -> set[str]:
    layout = RunLayout(config["run"])
    cells = expand_cells(config)
    return {layout.cell(c.id) for c in cells} | {layout.pair(p.id) for p in expand_pairs(config, cells)}


def dry_run_outputs(workdir: Path, config_path: Path) -> set[str]:
    proc = run_snakemake(workdir, config_path, "-n")
    return {out for rule, out in scheduled_jobs(proc.stdout) if rule in ("generate", "compare")}


# --- 1. A study is exactly its config ----------------------------------------------------------

@pytest.mark.parametrize("name", ["paper-kv-cache.yaml", "paper-precision.yaml", "tiny"])
def test_snakemake_schedules_exactly_the_plan_of_the_given_config(tmp_path, name):
    """--configfile replaces config/config.yaml (whose model is smollm2-135m and whose
    benchmark is `arithmetic`): the dry run's cells and pairs are the plan's, no more."""
    if name == "tiny":
        path = write_yaml(tmp_path / "study.yaml", tiny_study())
    else:
        path = REPO / "config" / name
    config = cfg.load(path)
    workdir = tmp_path / "run"
    workdir.mkdir()
    scheduled = dry_run_outputs(workdir, path)
    assert scheduled == planned_outputs(config)
    assert not any("smollm2-135m" in out or "/arithmetic/" in out for out in scheduled)
    plan = tokenflip("plan", "--config", str(path))
    assert plan.returncode == 0, plan.stderr
    listed = {line.split()[1] for line in plan.stdout.splitlines() if line.startswith(("cell", "pair"))}
    assert {RunLayout(config["run"]).cell(i) for i in listed if i.count("/") == 2} | \
        {RunLayout(config["run"]).pair(i) for i in listed if i.count("/") == 4} == scheduled


# --- 2. Crash leftovers -------------------------------------------------------------------------

def test_a_job_whose_scheduler_died_stops_and_writes_nothing(tmp_path, prepared_models):
    """The scheduler (here a stand-in process) is killed while `tokenflip generate` runs:
    the job stops within a second or two and leaves no cell behind."""
    from tokenflip.core.scheduler import ORPHANED_EXIT, SCHEDULER_VARIABLE, scheduler_token
    from tokenflip.study.plan import cell_job

    config = cfg.validate({**tiny_study(), "benchmarks": {"arith_a": {"kind": "arithmetic", "n": 400,
                                                                        "max_new_tokens": 128}}})
    (cell,) = [c for c in expand_cells(config) if c.cache == "off"]   # slow enough to be caught mid-run
    scheduler = subprocess.Popen(["sleep", "600"])
    out = tmp_path / "cell.parquet"
    env = {**os.environ, SCHEDULER_VARIABLE: scheduler_token(scheduler.pid)}
    job = subprocess.Popen([sys.executable, "-m", "tokenflip", "generate", "--quiet", "--job",
                            cell_job(config, cell).dumps(), "--model-dir", str(prepared_models("llama")),
                            "--out", str(out)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4)
        assert job.poll() is None, job.stderr.read()
        scheduler.kill()
        scheduler.wait()
        killed_at = time.monotonic()
        returncode = job.wait(timeout=30)
        stopped_after = time.monotonic() - killed_at
    finally:
        for proc in (job, scheduler):
            if proc.poll() is None:
                proc.kill()
    assert returncode == ORPHANED_EXIT
    assert stopped_after < 5, stopped_after
    assert "scheduler" in job.stderr.read()
    assert not out.exists() and not list(tmp_path.glob(".cell.parquet.*"))


@pytest.mark.slow
def test_kill_9_of_snakemake_alone_takes_its_running_job_down(finished_tiny_study, tmp_path):
    """Only the snakemake process is killed (not its process group, as a closed terminal or
    an OOM kill would): its running generate job must not live on and write its cell."""
    workdir = copy_run(finished_tiny_study.workdir, tmp_path / "run")
    config = tiny_study()
    config["benchmarks"]["arith_a"].update(n=200, max_new_tokens=64)
    config_path = write_yaml(tmp_path / "config.yaml", config)
    log = workdir / "logs/inc/generate/tiny/arith_a/fp32-off-bs1-greedy-none.log"
    target = workdir / "results/inc/cells/tiny/arith_a/fp32-off-bs1-greedy-none.parquet"
    target.unlink()
    proc = subprocess.Popen(snakemake_command(workdir, config_path, target.relative_to(workdir).as_posix()),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not log.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        time.sleep(3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 20
        while _generate_processes(workdir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _generate_processes(workdir), "a generate job outlived snakemake"
        time.sleep(1)
        assert not target.exists()
    finally:
        for pid in _generate_processes(workdir):
            os.kill(pid, signal.SIGKILL)


def _generate_processes(workdir: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if "tokenflip" in cmdline and "generate" in cmdline and str(workdir) in cmdline + cwd:
            pids.append(int(entry.name))
    return pids


def _summarize(workdir: Path, config_path: Path):
    return tokenflip("summarize", "--config", str(config_path), cwd=workdir)


@pytest.mark.slow
def test_a_cell_made_for_another_config_is_refused_naming_file_field_and_remedy(finished_tiny_study, tmp_path):
    """A cell that appeared with n=2 while the config now asks n=3 (an orphan of a killed
    run, or a file copied in) is never summarised as the config's."""
    workdir = copy_run(finished_tiny_study.workdir, tmp_path / "run")
    config = tiny_study()
    config["benchmarks"]["arith_b"]["n"] = 3
    config_path = write_yaml(tmp_path / "config.yaml", config)
    proc = _summarize(workdir, config_path)
    assert proc.returncode == 1
    stale = "results/inc/cells/tiny/arith_b/fp32-on-bs1-greedy-none.parquet"
    line = next(line for line in proc.stderr.splitlines() if stale in line and "benchmark.n" in line)
    assert "settings.benchmark.n = 2, but the config asks for 3" in line
    assert f"snakemake --forcerun {stale}" in line
    assert "arith_a" not in proc.stderr   # the other benchmark's cells are what the config asks


# --- 3. Names -----------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["models", "benchmarks", "run"])
@pytest.mark.parametrize("name", [".", "..", ".hidden"])
def test_dot_names_are_refused(where, name):
    config = tiny_study()
    if where == "run":
        config["run"] = name
    elif where == "models":
        config["models"][name] = config["models"].pop("tiny")
    else:
        config["benchmarks"][name] = config["benchmarks"].pop("arith_a")
    with pytest.raises(cfg.ConfigError, match="not allowed in file names"):
        cfg.validate(config, source="study.yaml")


def test_prepare_model_never_deletes_outside_its_own_output(tmp_path):
    models = tmp_path / "resources" / "models"
    other = models / "other"
    other.mkdir(parents=True)
    (other / "weights.safetensors").write_text("keep me")
    (tmp_path / "notes.txt").write_text("keep me too")
    spec = json.dumps({"source": "random", "architecture": "llama"})
    for out in ("resources/models/..", "resources/models/.", "resources/models/../models", "resources/models/other",
                "notes.txt"):
        proc = tokenflip("prepare-model", "--spec", spec, "--out", out, cwd=tmp_path)
        assert proc.returncode == 1, (out, proc.stderr)
        assert out in proc.stderr or out.rstrip("/.") in proc.stderr
    assert (other / "weights.safetensors").read_text() == "keep me"
    assert (tmp_path / "notes.txt").read_text() == "keep me too"
    assert sorted(p.name for p in models.iterdir()) == ["other"]


# --- 4, 5. Foreign and corrupt cells ------------------------------------------------------------

@pytest.mark.slow
def test_a_cell_copied_from_another_model_is_refused(finished_tiny_study, tmp_path):
    workdir = copy_run(finished_tiny_study.workdir, tmp_path / "run")
    config = tiny_study()
    config["models"]["twin"] = dict(config["models"]["tiny"])
    config_path = write_yaml(tmp_path / "config.yaml", config)
    src = workdir / "results/inc/cells/tiny/arith_a/fp32-on-bs1-greedy-none.parquet"
    dst = workdir / "results/inc/cells/twin/arith_a/fp32-on-bs1-greedy-none.parquet"
    dst.parent.mkdir(parents=True)
    shutil.copy2(src, dst)
    proc = _summarize(workdir, config_path)
    assert proc.returncode == 1
    assert ("results/inc/cells/twin/arith_a/fp32-on-bs1-greedy-none.parquet: holds cell "
            "'tiny/arith_a/fp32-on-bs1-greedy-none', not 'twin/arith_a/fp32-on-bs1-greedy-none'") in proc.stderr


def _corrupt_first_data_page(path: Path) -> None:
    """Flip bytes inside the file's first column chunk, leaving the footer intact."""
    import pyarrow.parquet as pq

    column = pq.ParquetFile(path).metadata.row_group(0).column(4)   # token_ids
    start = column.data_page_offset + 24
    data = bytearray(path.read_bytes())
    for i in range(start, start + 16):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_corrupt_data_pages_are_an_error_not_identical_or_done(finished_tiny_study, tmp_path):
    run_a = copy_run(finished_tiny_study.workdir, tmp_path / "a")
    run_b = copy_run(finished_tiny_study.workdir, tmp_path / "b")
    target = "results/inc/cells/tiny/arith_a/fp32-off-bs1-greedy-none.parquet"
    _corrupt_first_data_page(run_b / target)
    assert storage.read_metadata(run_b / target)["cell_id"]   # the footer still reads
    diff = tokenflip("diff-runs", str(run_a / "results/inc"), str(run_b / "results/inc"))
    assert diff.returncode == 1, diff.stdout + diff.stderr
    assert target in diff.stderr and "identical  tiny/arith_a/fp32-off" not in diff.stdout
    digest = tokenflip("digest", str(run_b / target))
    assert digest.returncode == 1 and target in digest.stderr
    proc = _summarize(run_b, finished_tiny_study.config)
    assert proc.returncode == 1 and target in proc.stderr


# --- 6, 7. Benchmarks fail at validation, naming the file and the record ------------------------

def _study_with_benchmark(bench: dict) -> dict:
    config = tiny_study()
    config["benchmarks"] = {"b": bench}
    return config


@pytest.mark.parametrize("bench, needle", [
    ({"kind": "arithmetic", "n": 2, "colour": "red"}, "benchmarks.b: unknown key(s) ('colour' was unexpected)"),
    ({"kind": "gsm8k", "source": {"path": "/nonexistent/gsm8k.jsonl"}}, "local file not found: /nonexistent/gsm8k.jsonl"),
    ({"kind": "mbpp", "split": "tset"}, "benchmarks.b.split: 'tset' is not one of ['sanitized', 'full']"),
    ({"kind": "humaneval", "timeout_s": 0}, "benchmarks.b.timeout_s: 0 is less than or equal to the minimum of 0"),
    ({"kind": "gsm8k", "prompt": "chat", "shots": 8}, "'shots' and 'exemplars' apply only with prompt: fewshot"),
    ({"kind": "gsm8k", "source": {"path": "x.jsonl", "hub": "openai/gsm8k"}}, "exactly one of a path, hub keys"),
])
def test_a_bad_benchmark_entry_fails_plan_and_dry_run_before_any_job(tmp_path, bench, needle):
    path = write_yaml(tmp_path / "study.yaml", _study_with_benchmark(bench))
    plan = tokenflip("plan", "--config", str(path))
    assert plan.returncode == 1 and needle in plan.stderr, plan.stderr
    workdir = tmp_path / "run"
    workdir.mkdir()
    dry = run_snakemake(workdir, path, "-n", check=False)
    assert dry.returncode != 0 and needle in dry.stdout + dry.stderr
    assert "Job stats" not in dry.stdout and not (workdir / "resources").exists()


def _gsm8k_lines(n: int) -> list[str]:
    return (SHARED_DATA / "gsm8k" / "test.jsonl").read_text().splitlines()[:n]


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="needs ../shared/data")
def test_bad_benchmark_files_name_the_file_and_the_record(tmp_path):
    good = "\n".join(_gsm8k_lines(5)).encode()
    truncated = tmp_path / "truncated.jsonl.gz"
    truncated.write_bytes(gzip.compress(good)[:-30])
    with pytest.raises(BenchmarkError, match=r"truncated.jsonl.gz \(corrupt or truncated\?\)"):
        build_benchmark("g", {"kind": "gsm8k", "source": {"path": str(truncated)}}).items()
    garbage = tmp_path / "garbage.jsonl.gz"
    garbage.write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(200))
    with pytest.raises(BenchmarkError, match="garbage.jsonl.gz"):
        build_benchmark("g", {"kind": "gsm8k", "source": {"path": str(garbage)}}).items()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(BenchmarkError, match="empty.jsonl: no items"):
        build_benchmark("g", {"kind": "gsm8k", "source": {"path": str(empty)}}).items()
    not_records = tmp_path / "strings.json"
    not_records.write_text(json.dumps(["a question", "another"]))
    with pytest.raises(BenchmarkError, match="record 0 of .*strings.json is not an object"):
        build_benchmark("m", {"kind": "math500", "source": {"path": str(not_records)}}).items()

    human = [json.loads(line) for line in gzip.decompress(
        (SHARED_DATA / "humaneval" / "HumanEval.jsonl.gz").read_bytes()).decode().splitlines()[:3]]
    human[2]["task_id"] = human[0]["task_id"]
    dup = tmp_path / "dup.jsonl"
    dup.write_text("\n".join(json.dumps(r) for r in human))
    with pytest.raises(BenchmarkError, match="records 0 and 2 have the same id 'humaneval-000'"):
        build_benchmark("h", {"kind": "humaneval", "source": {"path": str(dup)}}).items()

    mbpp = json.loads((SHARED_DATA / "mbpp" / "sanitized-mbpp.json").read_text())
    task = next(r for r in mbpp if r["task_id"] == 11)
    for tests, what in (([], "[]"), ("assert f(1) == 2", "'assert f(1) == 2'")):
        path = tmp_path / f"mbpp-{len(tests)}.json"
        path.write_text(json.dumps([{**task, "test_list": tests}]))
        with pytest.raises(BenchmarkError, match=r"task_id 11\) of .*mbpp-\d+.json: test_list must be a non-empty "
                                                 r"list of assert statements"):
            build_benchmark("m", {"kind": "mbpp", "source": {"path": str(path)}, "shots": 0}).items()


# --- 8. Command-line misuse ---------------------------------------------------------------------

@pytest.mark.slow
def test_commands_answer_bad_arguments_with_a_message_not_a_traceback(finished_tiny_study, tmp_path):
    run = finished_tiny_study.workdir
    cell = run / "results/inc/cells/tiny/arith_a/fp32-on-bs1-greedy-none.parquet"
    pair = run / "results/inc/pairs/tiny/arith_a/cache/on_vs_off/fp32-x-bs1-greedy-none.parquet"
    cases = [
        (["compare", str(pair), str(cell), "--out", str(tmp_path / "x.parquet")], "a 'pair' file"),
        (["compare", str(cell), str(cell), "--out", str(tmp_path / "x.parquet")], "differ in nothing"),
        (["generate", "--job", "{}", "--model-dir", str(tmp_path), "--out", str(tmp_path / "c.parquet")],
         "cell job: missing fields ['benchmark', 'cell', 'decoding'"),
        (["generate", "--job", "[1]", "--model-dir", str(tmp_path), "--out", str(tmp_path / "c.parquet")],
         "cell job: expected a JSON object"),
        (["probe", "--job", json.dumps({"probe": "nope"}), "--model-dir", str(tmp_path), "--out-dir", str(tmp_path)],
         "probe job: missing fields"),
        (["digest", str(tmp_path / "nope.parquet")], "nope.parquet: file not found"),
        (["diff-runs", str(tmp_path), str(run / "results/inc")], "no such directory"),
        (["summarize", "--config", str(tmp_path / "nope.yaml")], "nope.yaml: file not found"),
    ]
    for argv, needle in cases:
        proc = tokenflip(*argv)
        assert proc.returncode == 1, (argv, proc.stderr)
        assert needle in proc.stderr and "Traceback" not in proc.stderr, (argv, proc.stderr)
        assert not (tmp_path / "x.parquet").exists() and not (tmp_path / "c.parquet").exists()
    assert tokenflip("generate", "--job", "{not json").returncode == 2


# --- 9. Comparisons that form no pair -----------------------------------------------------------

def test_a_comparison_that_forms_no_pair_is_an_error_naming_it():
    config = tiny_study()
    config["grids"] = [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1]},
                       {"precision": ["bf16"], "cache": ["off"], "batch_size": [1]}]
    config["comparisons"] = [{"axis": "cache", "a": "on", "b": "off"},
                             {"axis": "precision", "a": "fp32", "b": "bf16"}]
    with pytest.raises(cfg.ConfigError) as err:
        cfg.validate(config, source="study.yaml")
    text = str(err.value)
    assert "study.yaml: comparisons.0: cache 'on' vs 'off' forms no pair" in text
    assert "study.yaml: comparisons.1: precision 'fp32' vs 'bf16' forms no pair" in text


@pytest.mark.slow
def test_a_pair_file_from_an_earlier_version_is_summarised_from_its_data(finished_tiny_study, tmp_path):
    """A pair file whose stored summary lacks a figure added since (an upgrade of tokenflip
    reruns no job) is summarised like a new one: the figures come from its per-prompt rows."""
    import pyarrow.parquet as pq

    workdir = copy_run(finished_tiny_study.workdir, tmp_path / "run")
    path = workdir / "results/inc/pairs/tiny/arith_a/cache/on_vs_off/fp32-x-bs1-greedy-none.parquet"
    table, meta = storage.read_table(path)
    meta.pop("schema_version")
    old = {k: v for k, v in meta["summary"].items() if k not in ("median_margin_agreed", "max_abs_length_diff")}
    storage.write_table(table, path, {**meta, "summary": old})
    proc = _summarize(workdir, finished_tiny_study.config)
    assert proc.returncode == 0, proc.stderr
    pairs = pq.read_table(workdir / "results/inc/summary/pairs.parquet").to_pandas().set_index("pair_id")
    row = pairs.loc["tiny/arith_a/cache/on_vs_off/fp32-x-bs1-greedy-none"]
    assert row["max_abs_length_diff"] == 0 and row["median_margin_agreed"] > 0


@pytest.mark.slow
def test_probe_tables_of_an_earlier_probe_version_are_refused_and_rescheduled(finished_tiny_study, tmp_path):
    """A probe table written before the probe's tables changed (its settings carry no
    `version`, or another one) is not summarised, and Snakemake schedules that probe again."""
    workdir = copy_run(finished_tiny_study.workdir, tmp_path / "run")
    path = workdir / "results/inc/probes/tiny/arith_a/kv_cache/patching.parquet"
    table, meta = storage.read_table(path)
    meta.pop("schema_version")
    settings = {k: v for k, v in meta["settings"].items() if k != "version"}
    storage.write_table(table, path, {**meta, "settings": settings})
    proc = _summarize(workdir, finished_tiny_study.config)
    assert proc.returncode == 1
    line = next(line for line in proc.stderr.splitlines() if "kv_cache/patching.parquet" in line)
    version = PROBES["kv_cache"].version
    assert f"settings.version = '<absent>', but the config asks for {version}" in line
    # What Snakemake recorded for those outputs when an earlier tokenflip made them: the
    # job spec without `version`. The current spec differs, so the probe is made again.
    import base64
    for record in (workdir / ".snakemake" / "metadata").iterdir():
        if "/probes/" in base64.b64decode(record.name.replace("@", "/")).decode(errors="replace"):
            data = json.loads(record.read_text())
            data["params"] = [p.replace(f', "version": {version}', "") if isinstance(p, str) else p
                              for p in data["params"]]
            record.write_text(json.dumps(data))
    dry = run_snakemake(workdir, finished_tiny_study.config, "-n")
    assert {rule for rule, _ in scheduled_jobs(dry.stdout)} >= {"probe_kv_cache", "summarize", "report"}
    assert "params have changed" in dry.stdout
