"""Prompt formats: chat template with or without the system turn, or bare text for base
checkpoints (arXiv 2609.26621 §2 and App. VI), checked against each model's tokenizer
before any generation job."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SHARED_DATA, run_snakemake, tiny_study, write_yaml
from tokenflip.models.prepare import load_tokenizer, sha256_file
from tokenflip.run.benchmarks import build_benchmark
from tokenflip.run.runtime import PromptFormatError, check_prompts, encode_prompt

REFUSES_SYSTEM = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                  "{% endif %}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
                  "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def tokenizer_variant(prepared: Path, root: Path, template: str | None) -> Path:
    """A prepared model directory whose tokenizer has another chat template (or none)."""
    out = root / f"variant-{'none' if template is None else len(template)}"
    shutil.copytree(prepared, out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if template is not None:
        (out / "chat_template.jinja").write_text(template)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    manifest = json.loads((out / "model.json").read_text())  # prepared so on purpose: it records its files
    manifest["files"] = {p.name: sha256_file(p) for p in out.iterdir() if p.is_file() and p.name != "model.json"}
    (out / "model.json").write_text(json.dumps(manifest))
    return out


@pytest.fixture(scope="module")
def variants(prepared_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    base = prepared_models("llama")   # the SmolLM2 tokenizer, with its chat template
    return {"chat": base, "no_template": tokenizer_variant(base, root, None),
            "refuses_system": tokenizer_variant(base, root, REFUSES_SYSTEM)}


def bench(**style):
    return build_benchmark("arith", {"kind": "arithmetic", "n": 3, **style})


def test_chat_format_with_and_without_the_system_turn(variants):
    tokenizer = load_tokenizer(variants["chat"])
    item = bench().items()[0]
    with_system = tokenizer.decode(encode_prompt(tokenizer, bench(), item))
    without = tokenizer.decode(encode_prompt(tokenizer, bench(system_prompt=False), item))
    assert "Solve the math word problem step by step" in with_system
    assert "Solve the math word problem" not in without and item.question in without
    assert without.rstrip().endswith("assistant")   # the generation prompt is there


def test_bare_format_is_plain_text_with_the_tokenizers_special_tokens(variants):
    tokenizer = load_tokenizer(variants["no_template"])
    b = bench(format="bare", system_prompt=False)
    item = b.items()[0]
    ids = encode_prompt(tokenizer, b, item)
    assert ids == tokenizer(f"Question: {item.question}\nAnswer:")["input_ids"]
    assert "<|im_start|>" not in tokenizer.decode(ids)


def test_a_format_the_tokenizer_cannot_take_is_refused_with_what_to_change(variants):
    with pytest.raises(PromptFormatError, match="tokenizer has no chat template .*use format: bare"):
        check_prompts(load_tokenizer(variants["no_template"]), bench())
    with pytest.raises(PromptFormatError, match="System role not supported.*try system_prompt: false"):
        check_prompts(load_tokenizer(variants["refuses_system"]), bench())
    ok = check_prompts(load_tokenizer(variants["refuses_system"]), bench(system_prompt=False))
    assert ok["prompts"] == 3 and ok["prompt_style"] == {"format": "chat", "system_prompt": False}


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="needs ../shared/data")
def test_bare_prompts_of_the_papers_benchmarks(gsm8k_files):
    humaneval = build_benchmark("he", {"kind": "humaneval", "n": 1, "format": "bare"})
    item = humaneval.items()[0]
    assert humaneval.bare_text(item) == item.question   # the model continues the function
    mbpp = build_benchmark("mb", {"kind": "mbpp", "n": 1, "format": "bare",
                                  "source": {"path": str(SHARED_DATA / "mbpp" / "sanitized-mbpp.json")}})
    text = mbpp.bare_text(mbpp.items()[0])
    assert text.count("[BEGIN]") == 4 and text.count("[DONE]") == 3 and text.endswith("[BEGIN]\n")
    gsm = build_benchmark("g", {"kind": "gsm8k", "n": 1, "prompt": "fewshot", "shots": 2, "format": "bare",
                                "system_prompt": False,
                                "source": {"path": str(gsm8k_files.eval)}, "exemplars": {"path": str(gsm8k_files.pool)}})
    text = gsm.bare_text(gsm.items()[0])
    assert text.count("Question: ") == 3 and text.endswith("Answer:") and "####" in text


def test_the_pipeline_checks_prompts_before_any_generation_job(variants, tmp_path):
    """A model whose tokenizer has no chat template, with a chat-format benchmark: the run
    stops at check_prompts, naming the benchmark and the remedy; no generate job starts."""
    workdir = tmp_path / "run"
    shutil.copytree(variants["no_template"], workdir / "resources" / "models" / "tiny")
    config = tiny_study()
    config["benchmarks"] = {"arith_a": config["benchmarks"]["arith_a"]}
    config.pop("probes")
    path = write_yaml(tmp_path / "study.yaml", config)
    proc = run_snakemake(workdir, path, check=False)
    assert proc.returncode != 0
    log = (workdir / "logs/inc/check_prompts/tiny/arith_a.log").read_text()
    assert "benchmark 'arith_a': format 'chat', but the tokenizer has no chat template" in log
    assert not (workdir / "logs/inc/generate").exists() and not (workdir / "results/inc/cells").exists()
    config["benchmarks"]["arith_a"]["format"] = "bare"
    path = write_yaml(tmp_path / "study.yaml", config)
    dry = run_snakemake(workdir, path, "-n")
    assert "check_prompts" in dry.stdout and "generate" in dry.stdout
    check = subprocess.run([sys.executable, "-m", "tokenflip", "check-prompts", "--benchmark", "arith_a", "--spec",
                            json.dumps({"kind": "arithmetic", "n": 2, "format": "bare"}), "--model-dir",
                            str(workdir / "resources/models/tiny"), "--out", str(tmp_path / "c.json")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert json.loads((tmp_path / "c.json").read_text())["prompt_style"]["format"] == "bare"
