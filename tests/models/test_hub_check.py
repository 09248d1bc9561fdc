"""Hub models checked before the first job; a failed preparation says why on the console;
a partial report does not speak of pairs that never ran. Run for real: this machine has no
network, and HF_HUB_OFFLINE with an empty cache is what a compute node without one sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import snakemake_command, tiny_study, write_yaml

GATED = "meta-llama/Llama-2-7b-hf"


def _hub_study(tmp_path, model: dict) -> dict:
    config = tiny_study()
    config["models"] = {"hubmodel": model}
    config.pop("probes")
    return config


def _snakemake(work, config, *extra, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(snakemake_command(work, config, *extra), capture_output=True, text=True, timeout=600,
                          env=env)


def _offline_env(tmp_path) -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"))


def _hub_problems(tmp_path, env, models_dir="absent") -> list[str]:
    code = ("import json, sys; from tokenflip.models.hub import hub_problems; "
            "print(json.dumps(hub_problems(json.loads(sys.argv[1]), sys.argv[2])))")
    config = {"models": {"hubmodel": {"source": "hf", "id": GATED, "revision": "main"}}}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(config), str(tmp_path / models_dir)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_an_offline_hub_model_without_a_cached_copy_is_refused_before_any_job(tmp_path):
    config = write_yaml(tmp_path / "study.yaml", _hub_study(tmp_path, {"source": "hf", "id": GATED}))
    work = tmp_path / "run"
    env = _offline_env(tmp_path)
    # A dry run still lists the study (planning never reaches the hub) ...
    dry = _snakemake(work, config, "-n", env=env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    # ... a real run stops before its first job, naming the model, the cause and the fix.
    proc = _snakemake(work, config, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"model 'hubmodel' ({GATED})" in out and "HF_HUB_OFFLINE is set" in out
    assert str(tmp_path / "hf-home") in out and "snakemake --until prepare_model" in out
    assert not (work / "logs").exists() and not (work / "resources").exists()


def test_a_prepared_hub_model_is_not_checked(tmp_path):
    env = _offline_env(tmp_path)
    assert len(_hub_problems(tmp_path, env)) == 1
    (tmp_path / "models" / "hubmodel").mkdir(parents=True)
    (tmp_path / "models" / "hubmodel" / "model.json").write_text("{}")
    assert _hub_problems(tmp_path, env, "models") == []


def test_without_network_or_offline_mode_the_cause_and_the_fix_are_named(tmp_path):
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf-home"))
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_TOKEN", None)  # a token with access to the gated repository would leave no problem
    problems = _hub_problems(tmp_path, env)
    # Here the hub cannot be reached; with network, the gated repository needs a token.
    assert len(problems) == 1 and problems[0].startswith(f"model 'hubmodel' ({GATED} at revision 'main')")
    assert ("the hub cannot be reached" in problems[0] and "snakemake --until prepare_model" in problems[0]) or \
        "gated repository" in problems[0], problems[0]


def test_a_failed_preparation_shows_its_cause_and_the_partial_report_no_pair_verdict(tmp_path):
    not_a_checkpoint = tmp_path / "empty-checkpoint"
    not_a_checkpoint.mkdir()
    config = write_yaml(tmp_path / "study.yaml", _hub_study(tmp_path, {"source": "hf", "id": str(not_a_checkpoint)}))
    work = tmp_path / "run"
    proc = _snakemake(work, config, "--keep-going")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "prepare_model hubmodel failed; the end of logs/inc/prepare_model/hubmodel.log:" in out
    assert "tokenflip prepare-model: error:" in out and "config.json" in out
    partial = (work / "reports" / "inc" / "partial.html").read_text()
    assert "No prompt diverged in any pair" not in partial
    assert "No pair has been compared yet (2 missing)" in " ".join(partial.split())


# --- ids the hub cannot have --------------------------------------------------------------------

LONG_ID = "a" * 10_000


@pytest.mark.parametrize("model_id,rule", [
    ("../../etc/passwd", "in the form 'repo_name' or 'namespace/repo_name'"),
    ("--help", "cannot start or end with '-' or '.'"),
    ("https://huggingface.co/org/model", "in the form 'repo_name' or 'namespace/repo_name'"),
    (LONG_ID, "the maximum length is 96"),
    ("org/model--x", "Cannot have -- or .."),
    ("org/model.git", "cannot end by '.git'"),
    ("org/mödel", "alphanumeric chars"),
])
def test_an_id_the_hub_cannot_have_is_refused_naming_the_key_and_the_value(model_id, rule):
    from tokenflip.study import config as cfg

    study = tiny_study()
    study["models"] = {"hubmodel": {"source": "hf", "id": model_id}}
    study.pop("probes")
    with pytest.raises(cfg.ConfigError) as refused:
        cfg.validate(study, source="study.yaml", check_data=False)
    message = str(refused.value)
    assert "study.yaml: models.hubmodel.id: " in message and rule in message, message
    assert repr(model_id[:80]) in message and len(message) < 1000  # the value named, cut to a readable length
    if model_id is LONG_ID:
        assert "(10,000 characters)" in message


@pytest.mark.parametrize("revision, rule", [("../../etc/passwd", "'..'"), ("main\n", "'\\n'"), ("a b", "' '"),
                                            ("-x", "a leading '/', '-' or '.'"), ("v1.lock", "'.lock'")])
def test_a_revision_git_cannot_have_is_refused_before_it_is_blamed_on_the_network(revision, rule):
    from tokenflip.study import config as cfg

    study = tiny_study()
    study["models"] = {"hubmodel": {"source": "hf", "id": "org/model", "revision": revision}}
    study.pop("probes")
    with pytest.raises(cfg.ConfigError) as refused:
        cfg.validate(study, source="study.yaml", check_data=False)
    message = str(refused.value)
    assert f"study.yaml: models.hubmodel.revision: {revision!r} is not a branch, tag or commit name" in message
    assert rule in message and "network" not in message
    for good in ("main", "v1.0", "refs/pr/3", "release/2024-01", "0123456789abcdef0123456789abcdef01234567"):
        study["models"]["hubmodel"]["revision"] = good
        assert cfg.validate(study, check_data=False)["models"]["hubmodel"]["revision"] == good


@pytest.mark.parametrize("model_id", ["meta-llama/Llama-2-7b-hf", "gpt2", "Qwen/Qwen2.5-0.5B-Instruct", "local-dir"])
def test_hub_ids_and_local_directories_are_accepted(tmp_path, model_id):
    from tokenflip.study import config as cfg

    (tmp_path / "local-dir" / "x").mkdir(parents=True)
    if model_id == "local-dir":
        model_id = str(tmp_path / "local-dir" / "x")  # a checkpoint directory is any path
    study = tiny_study()
    study["models"] = {"hubmodel": {"source": "hf", "id": model_id}}
    study.pop("probes")
    assert cfg.validate(study, check_data=False)["models"]["hubmodel"]["id"] == model_id


def test_a_long_id_is_one_line_from_plan_and_no_crash_in_the_pre_run_check(tmp_path):
    from tokenflip.models.hub import is_local_dir

    study = tiny_study()
    study["models"] = {"hubmodel": {"source": "hf", "id": LONG_ID}}
    study.pop("probes")
    path = write_yaml(tmp_path / "study.yaml", study)
    proc = subprocess.run([sys.executable, "-m", "tokenflip", "plan", "--config", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "models.hubmodel.id: 'aaaa" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "File name too long" not in proc.stderr and len(proc.stderr) < 1000
    # The pre-run check itself tells a directory from a hub id without asking the file system
    # about a name no file can have.
    assert not is_local_dir(LONG_ID) and not is_local_dir("a\0b") and is_local_dir(str(tmp_path))
    env = _offline_env(tmp_path)
    code = ("import json, sys; from tokenflip.models.hub import hub_problems; "
            "print(json.dumps(hub_problems(json.loads(sys.argv[1]), sys.argv[2])))")
    config = {"models": {"hubmodel": {"source": "hf", "id": LONG_ID}}}
    check = subprocess.run([sys.executable, "-c", code, json.dumps(config), str(tmp_path / "absent")], env=env,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and "Traceback" not in check.stderr, check.stderr[-2000:]
    assert len(json.loads(check.stdout)) == 1


def test_a_benchmark_whose_hub_dataset_id_the_hub_cannot_have_is_refused():
    from tokenflip.run.benchmarks import BenchmarkError, build_benchmark

    with pytest.raises(BenchmarkError, match=r"source\.hub: '\.\./\.\./x' is not an id the Hugging Face hub can have"):
        build_benchmark("g", {"kind": "gsm8k", "n": 2, "source": {"hub": "../../x", "split": "test"}})
