"""A plain (non-editable) installation carries everything a run needs besides the
workflow: the config schema, the report template and the sandbox's helper modules."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from conftest import REPO, tiny_study, write_yaml


def test_a_built_wheel_validates_a_config_outside_the_checkout(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(REPO),
                    "-w", str(wheels)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("tokenflip-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"tokenflip/study/schemas/config.schema.yaml", "tokenflip/report/templates/report.html.j2"} <= names
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    good = write_yaml(tmp_path / "good.yaml", tiny_study())
    bad = tiny_study()
    bad["grids"][0]["precision"] = ["fp64"]
    bad = write_yaml(tmp_path / "bad.yaml", bad)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}   # the installed copy, not the checkout's src/
    check = [sys.executable, "-c", "import tokenflip, sys; print(tokenflip.__file__)"]
    where = subprocess.run(check, capture_output=True, text=True, cwd=elsewhere, env=env)
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr
    ok = subprocess.run([sys.executable, "-m", "tokenflip", "plan", "--config", str(good)], capture_output=True,
                        text=True, cwd=elsewhere, env=env)
    assert ok.returncode == 0, ok.stderr
    assert "cell  tiny/arith_a/fp32-on-bs1-greedy-none" in ok.stdout
    refused = subprocess.run([sys.executable, "-m", "tokenflip", "plan", "--config", str(bad)], capture_output=True,
                             text=True, cwd=elsewhere, env=env)
    assert refused.returncode == 1 and "grids.0.precision.0: 'fp64' is not one of" in refused.stderr
