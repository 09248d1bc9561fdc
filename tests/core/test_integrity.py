"""Every byte a result depends on is checked: every column of every cell, pair, probe and
summary table is covered by a digest recomputed on read; results keep the permissions the
user's umask gives; the CPU's kernels are in the provenance and `diff-runs` names them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import SHARED_DATA, copy_run
from tokenflip.core import provenance, storage
from tokenflip.core.cpu_flags import KERNEL_FLAGS


def tokenflip(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tokenflip", *args], capture_output=True, text=True, cwd=cwd)


def _edit(path: Path, column: str, change) -> None:
    """Rewrite one column of a result file in place, keeping its provenance metadata, as a
    careless or hostile user with pyarrow would."""
    table = pq.read_table(path)
    index = table.column_names.index(column)
    edited = table.set_column(index, table.schema.field(index), change(table.column(column)))
    pq.write_table(edited.replace_schema_metadata(table.schema.metadata), path)


CELL = "results/inc/cells/tiny/arith_a/fp32-on-bs1-greedy-none.parquet"
EDITS = {
    "a cell's correct column": (CELL, "correct",
                                lambda col: pa.array([True] * len(col), type=pa.bool_())),
    "a cell's margins": (CELL, "margin",
                         lambda col: pa.array([[9.0] * len(v) for v in col.to_pylist()], type=col.type)),
    "a cell's text": (CELL, "text", lambda col: pa.array(["#### 1"] * len(col), type=col.type)),
    "a pair's identical column": ("results/inc/pairs/tiny/arith_a/cache/on_vs_off/fp32-x-bs1-greedy-none.parquet",
                                  "identical", lambda col: pc.invert(col)),
}


@pytest.mark.slow
@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_column_is_refused_naming_the_file(finished_tiny_study, tmp_path, edit):
    """Each edit keeps the file's metadata (the token and logits digests still match): the
    table digest over every column catches it, and summarize refuses the file instead of
    reporting an accuracy, margin or divergence that was never computed."""
    workdir = copy_run(finished_tiny_study.workdir, tmp_path / "run")
    target, column, change = EDITS[edit]
    assert (workdir / target).is_file(), sorted(p.name for p in (workdir / target).parent.iterdir())
    _edit(workdir / target, column, change)
    with pytest.raises(storage.StorageError, match="do not match the recorded table_sha256"):
        storage.read_table(workdir / target)
    proc = tokenflip("summarize", "--config", str(finished_tiny_study.config), cwd=workdir)
    assert proc.returncode == 1 and target in proc.stderr and "table_sha256" in proc.stderr, proc.stderr[-2000:]


def test_the_table_digest_covers_every_column_and_survives_a_round_trip(tmp_path):
    table = pa.table({"a": pa.array([1, None, 3], pa.int32()), "b": pa.array([[1.5], [], [2.5, None]]),
                      "c": pa.array(["x", None, "z"]), "d": pa.array([True, False, None]),
                      "e": pa.array([None, None, None])})
    path = tmp_path / "t.parquet"
    storage.write_table(table, path, {"kind": "probe"})
    back, meta = storage.read_table(path)
    assert meta["table_sha256"] == storage.table_digest(table) == storage.table_digest(back)
    digests = {storage.table_digest(table)}
    for name, value in (("a", pa.array([1, 2, 3], pa.int32())), ("b", pa.array([[1.5], [], [2.5, 0.0]])),
                        ("c", pa.array(["x", "", "z"])), ("d", pa.array([True, False, False])),
                        ("e", pa.array([1, None, None], pa.int64()))):
        i = table.column_names.index(name)
        digests.add(storage.table_digest(table.set_column(i, name, value)))
    assert len(digests) == 6  # each single change, even a null for a zero, moves the digest
    pq.write_table(table, path)  # no provenance at all: not a tokenflip result
    with pytest.raises(storage.StorageError, match="no tokenflip provenance"):
        storage.read_table(path)


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_results_get_the_mode_the_umask_gives(tmp_path, umask):
    previous = os.umask(umask)
    try:
        storage.write_table(pa.table({"a": [1]}), tmp_path / "t.parquet", {"kind": "probe"})
        storage.write_json(tmp_path / "r.json", {"a": 1})
        plain = tmp_path / "plain"
        plain.write_text("x")
    finally:
        os.umask(previous)
    for name in ("t.parquet", "r.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask == stat.S_IMODE(plain.stat().st_mode)


def test_a_prepared_model_gets_the_mode_the_umask_gives(tmp_path):
    from tokenflip.models.prepare import prepare

    previous = os.umask(0o002)
    try:
        prepare({"source": "random", "architecture": "llama", "seed": 0}, tmp_path / "m")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "m").stat().st_mode) == 0o775
    assert stat.S_IMODE((tmp_path / "m" / "model.json").stat().st_mode) == 0o664


def test_the_cpu_kernels_are_recorded_and_their_differences_named():
    """On whatever CPU runs it (AVX2 only, AVX-512 BF16, AMX): the record holds exactly the
    kernel extensions /proc/cpuinfo lists, and a second device that lacks one this CPU has
    and has one it lacks is told apart in both directions."""
    import torch

    device = provenance.device_info(torch.device("cpu"))
    assert device["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    listed = set(next(line for line in open("/proc/cpuinfo") if line.startswith(("flags", "Features")))
                 .split(":", 1)[1].split())
    assert device["cpu_flags"] == [flag for flag in KERNEL_FLAGS if flag in listed]
    assert "onednn_max_cpu_isa" in device and "threads" in device
    present = device["cpu_flags"][0] if device["cpu_flags"] else None
    absent = next(flag for flag in KERNEL_FLAGS if flag not in device["cpu_flags"])
    other = {**device, "cpu_flags": [f for f in device["cpu_flags"] if f != present] + [absent],
             "onednn_max_cpu_isa": "AVX512_CORE_VNNI"}
    lines = provenance.kernel_differences(device, other)
    cpu_line = next(line for line in lines if line.startswith("cpu_flags:"))
    assert f"{absent} only in b" in cpu_line
    assert present is None or f"{present} only in a" in cpu_line
    assert any(line.startswith("onednn_max_cpu_isa:") for line in lines)
    assert provenance.kernel_differences(device, dict(device)) == []


def test_kernel_differences_on_devices_written_by_hand():
    amx = {"cpu_flags": ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"], "threads": 2}
    avx2 = {"cpu_flags": ["avx2"], "threads": 2}
    assert provenance.kernel_differences(amx, avx2) == ["cpu_flags: amx_bf16 amx_tile avx512_bf16 avx512f only in a"]
    assert provenance.kernel_differences(avx2, {**avx2, "threads": 1}) == ["threads: 2 vs 1"]


@pytest.mark.slow
def test_diff_runs_says_when_two_runs_kernels_could_differ(finished_tiny_study, tmp_path):
    """Two runs with the same tokens, one of them recorded under a oneDNN cap: identical,
    and the capped variable is named as a way the kernels could differ."""
    run_a = copy_run(finished_tiny_study.workdir, tmp_path / "a")
    run_b = copy_run(finished_tiny_study.workdir, tmp_path / "b")
    path = run_b / CELL
    table, meta = storage.read_table(path, kind="cell")
    meta["environment"]["device"]["onednn_max_cpu_isa"] = "AVX512_CORE_VNNI"
    storage.write_table(table, path, {k: v for k, v in meta.items() if k not in ("schema_version", "table_sha256")})
    proc = tokenflip("diff-runs", str(run_a / "results/inc"), str(run_b / "results/inc"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kernels may differ: onednn_max_cpu_isa: None vs 'AVX512_CORE_VNNI' (1 shared cell)" in proc.stdout


# --- Names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("where", "value", "message"), [
    ("run", "rt\n", "not allowed in file names"),
    ("model", "tiny\n", "not allowed in file names"),
    ("benchmark", "b\n", "not allowed in file names"),
    ("decoding", "greedy\n", "not allowed in file names"),
    ("run", "r" * 65, "65 characters long, more than the 64"),
    ("model", "m" * 65, "65 characters long, more than the 64"),
    ("decoding", "g" * 41, "41 characters long, more than the 40"),
    ("intervention", "i" * 41, "41 characters long, more than the 40"),
])
def test_names_that_no_file_can_carry_are_refused_at_validation(where, value, message):
    from conftest import tiny_study
    from tokenflip.study import config as cfg

    study = tiny_study()
    if where == "run":
        study["run"] = value
    elif where == "model":
        study["models"] = {value: study["models"]["tiny"]}
    elif where == "benchmark":
        study["benchmarks"] = {value: study["benchmarks"]["arith_a"]}
    elif where == "decoding":
        study["decoding"] = {value: {"strategy": "greedy"}}
        study["grids"][0]["decoding"] = [value]
    else:
        study["interventions"] = {"none": {"kind": "none"}, value: {"kind": "none"}}
        study["grids"][0]["intervention"] = [value]
    with pytest.raises(cfg.ConfigError, match=message):
        cfg.validate(study)


def test_the_longest_names_allowed_fit_every_file_name_the_layout_builds():
    """Names at their limits and every further axis away from its default: each component of
    every path (with the temporary file's affixes) stays within 255 bytes."""
    from tokenflip.core.layout import RunLayout
    from tokenflip.core.specs import Cell, Pair

    model, bench, label = "m" * 64, "b" * 64, "l" * 40
    cell = Cell(model, bench, "fp16", "off", 1024, label, label, attention="flash_attention_2", threads="1024",
                device="cuda", deterministic="off", repeat="1000")
    other = Cell(model, bench, "fp16", "off", 1024, label, "k" * 40, attention="flash_attention_2",
                 threads="1024", device="cuda", deterministic="off", repeat="1000")
    pair = Pair("intervention", cell, other)
    layout = RunLayout("r" * 64)
    paths = [layout.cell(cell.id), layout.pair(pair.id), layout.log("generate", cell.id),
             layout.log("compare", pair.id), layout.probe_table("precision", model, bench, "grafting"),
             layout.prompt_check(model, bench), layout.model_dir(model)]
    for path in paths:
        for part in Path(path).parts:
            assert len(f".{part}.abcdefgh.tmp".encode()) <= 255, (len(part), part)


# --- Settings that cannot run -------------------------------------------------------------------


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: s.update(probes={"precision": {"pairs": [["fp16", "fp16"]]}}),
     r"probes\.precision\.pairs\.0: .*non-unique"),
    (lambda s: s["models"]["tiny"].update(overrides={"hidden_size": -5}),
     r"models\.tiny\.overrides\.hidden_size: -5 is below the minimum 1"),
    (lambda s: s["models"]["tiny"].update(overrides={"num_hidden_layers": 0}),
     r"models\.tiny\.overrides\.num_hidden_layers: 0 is below the minimum 1"),
    (lambda s: s["models"]["tiny"].update(overrides={"rope_scaling": [1, 2]}),
     r"models\.tiny\.overrides\.rope_scaling"),
])
def test_settings_that_cannot_run_are_refused_at_validation(edit, message):
    from conftest import tiny_study
    from tokenflip.study import config as cfg

    study = tiny_study()
    edit(study)
    with pytest.raises(cfg.ConfigError, match=message):
        cfg.validate(study)


def test_a_random_model_the_library_refuses_is_one_error_line_naming_the_overrides(tmp_path):
    """Sizes the schema accepts but the architecture cannot take (8 heads do not divide a
    hidden size of 12): prepare-model exits with one error line naming them, no traceback."""
    import json

    spec = {"source": "random", "architecture": "llama", "overrides": {"hidden_size": 12, "num_attention_heads": 8,
                                                                       "num_key_value_heads": 3}}
    proc = tokenflip("prepare-model", "--spec", json.dumps(spec), "--out", str(tmp_path / "m"))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokenflip prepare-model: error: random llama model: overrides"), proc.stderr
    assert "hidden_size" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "m").exists()


# --- Inputs ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_edited_data_file_reruns_its_cells_or_is_refused(tmp_path):
    """A local GSM8K file read by a finished study is edited (one gold answer changes): the
    dry run schedules its prompt check and its cells again, and a summary made without
    rerunning refuses the old cells, naming the file."""
    from test_workflow import scheduled_jobs

    from conftest import run_snakemake, tiny_study, write_yaml

    lines = (SHARED_DATA / "gsm8k" / "test.jsonl").read_text(
        encoding="utf-8").splitlines()
    data = tmp_path / "data" / "g.jsonl"
    data.parent.mkdir()
    data.write_text("\n".join(lines[:2]) + "\n", encoding="utf-8")
    study = tiny_study()
    study.update(benchmarks={"g": {"kind": "gsm8k", "n": 2, "max_new_tokens": 3, "format": "bare",
                                   "source": {"path": str(data)}}},
                 grids=[{"precision": ["fp32", "bf16"], "cache": ["on"], "batch_size": [1]}],
                 comparisons=[{"axis": "precision", "a": "fp32", "b": "bf16"}])
    study.pop("probes")
    workdir = tmp_path / "run"
    config = write_yaml(workdir / "config.yaml", study)
    run_snakemake(workdir, config)
    record = lines[0].replace("#### ", "#### 1")
    data.write_text("\n".join([record, lines[1]]) + "\n", encoding="utf-8")
    dry = run_snakemake(workdir, config, "-n")
    rules = [rule for rule, _ in scheduled_jobs(dry.stdout)]
    assert rules.count("check_prompts") == 1 and rules.count("generate") == 2, dry.stdout[-3000:]
    proc = tokenflip("summarize", "--config", str(config), cwd=workdir)
    assert proc.returncode == 1 and "made from another version of its data" in proc.stderr, proc.stderr[-2000:]
    assert str(data) in proc.stderr
