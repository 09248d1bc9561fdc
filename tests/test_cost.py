"""`tokenflip plan --cost`: the price of a study before its first GPU job, on inputs whose
figures are counted by hand."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO
from tokenflip.cost import Device, cell_cost, size_in_name
from tokenflip.jobs import Cell


def _cell(cache="on", batch_size=1, precision="bf16"):
    return Cell("m", "b", precision, cache, batch_size, "greedy", "none")


def test_cache_on_prefills_once_then_one_position_a_step():
    # 3 prompts of 10 tokens, 4 new tokens: per prompt the prefill (10) and 3 steps of 1.
    cost = cell_cost(_cell("on"), 3, 10, 4, 1e9, Device())
    assert (cost.prompts, cost.generated_tokens, cost.positions, cost.passes) == (3, 12, 39, 12)
    assert cost.weight_bytes == 12 * 1e9 * 2


def test_cache_off_reprocesses_the_whole_sequence_every_step():
    # Per prompt 10 + 11 + 12 + 13 = 46 positions: quadratic in the generation.
    assert cell_cost(_cell("off"), 3, 10, 4, 1e9, Device()).positions == 3 * 46
    long = cell_cost(_cell("off"), 1, 10, 256, 1e9, Device()).positions
    assert long == 256 * 10 + 256 * 255 / 2


def test_batches_pad_to_their_longest_prompt_and_read_the_weights_once_per_pass():
    # 3 prompts in batches of 2: two batches, each 2 rows x (10 + 3) positions.
    cost = cell_cost(_cell("on", batch_size=2), 3, 10, 4, 1e9, Device())
    assert (cost.positions, cost.passes, cost.weight_bytes) == (52, 8, 8 * 1e9 * 2)


def test_a_pass_costs_its_roofline():
    device = Device(bandwidth_gbs=2000, tflops=150)
    # 1B parameters in bf16: 2 GB read at 2,000 GB/s = 1 ms; 10 positions need 2e10 FLOPs = 0.13 ms.
    assert device.pass_seconds(1e9, "bf16", 10) == pytest.approx(1e-3)
    # 1,000 positions need 2e12 FLOPs: 13.3 ms of compute, more than the 1 ms of reading.
    assert device.pass_seconds(1e9, "bf16", 1000) == pytest.approx(2e12 / 150e12)
    # fp32 reads twice the bytes and multiplies at an eighth of the rate.
    assert device.pass_seconds(1e9, "fp32", 1) == pytest.approx(2e-3)
    assert device.pass_seconds(1e9, "fp32", 1000) == pytest.approx(8 * 2e12 / 150e12)


def test_a_measured_decode_rate_scales_with_the_bytes_a_model_reads():
    device = Device(tokens_per_second={7e9: 35.0, 1.1e9: 140.0})
    assert device.pass_seconds(7e9, "bf16", 1) == pytest.approx(1 / 35)
    assert device.pass_seconds(14e9, "bf16", 1) == pytest.approx(2 / 35)  # nearest: 7B, twice its bytes
    assert device.pass_seconds(1.1e9, "fp32", 1) == pytest.approx(2 / 140)  # fp32: twice the bytes


def test_the_whole_cell_time_is_the_sum_of_its_passes():
    device = Device(bandwidth_gbs=2000, tflops=150)
    cost = cell_cost(_cell("on"), 1, 1000, 3, 1e9, device)
    assert cost.seconds == pytest.approx(2e12 / 150e12 + 2 * 1e-3)


@pytest.mark.parametrize("name,params", [("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 1.1e9),
                                         ("Qwen/Qwen2.5-3B-Instruct", 3e9), ("meta-llama/Llama-2-7b-hf", 7e9),
                                         ("allenai/OLMoE-1B-7B-0924", 7e9), ("SmolLM2-135M-Instruct.Q4_1.gguf", 135e6),
                                         ("mistralai/Mistral-7B-v0.3", 7e9), ("meta-llama/Llama-3.2-3B-Instruct", 3e9),
                                         ("gpt2", None)])
def test_sizes_are_read_from_model_names(name, params):
    assert size_in_name(name) == (pytest.approx(params) if params else None)


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenflip", "plan", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_the_default_costs_what_its_config_says(tmp_path):
    proc = _plan("--config", str(REPO / "config" / "config.yaml"), "--cost", "--json", "--root", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    cost = json.loads(proc.stdout)
    # 10 cells on onestep (12 prompts) and 4 on onestep_kv (4 prompts), 32 new tokens each.
    assert cost["rules"] == {"prepare_model": 1, "check_prompts": 2, "generate": 14, "compare": 13, "probe": 2,
                             "summarize": 1, "report": 1}
    assert cost["generate"]["prompts"] == 10 * 12 + 4 * 4
    assert cost["generate"]["generated_tokens"] == (10 * 12 + 4 * 4) * 32
    assert cost["sources"]["parameters"]["smollm2-135m"] == {"parameters": 135e6, "from": "size in its name"}
    assert cost["sources"]["prompt_tokens"]["smollm2-135m/onestep"]["from"] == "estimated at 4 characters a token"
    assert cost["unknown"] == []


def test_the_paper_configs_are_priced_without_reaching_the_hub():
    proc = _plan("--config", str(REPO / "config" / "paper-kv-cache.yaml"), "--cost")
    assert proc.returncode == 0, proc.stderr
    assert "hub data is not read when planning" in proc.stdout and "+?" in proc.stdout
    given = _plan("--config", str(REPO / "config" / "paper-kv-cache.yaml"), "--cost", "--json",
                  "--prompt-tokens", "gsm8k=141")
    cost = json.loads(given.stdout)
    # 3 models x 8 cells x 1,319 prompts x 256 new tokens.
    assert cost["generate"]["generated_tokens"] == 24 * 1319 * 256
    assert cost["unknown"] == [] and cost["generate"]["seconds"] > 0


@pytest.mark.parametrize("args,message", [(("--prompt-tokens", "nope=10"), "does not define: ['nope']"),
                                          (("--prompt-tokens", "gsm8k"), "expected BENCHMARK=TOKENS"),
                                          (("--tokens-per-second", "fast=3"), "expected SIZE=TOKENS_PER_SECOND")])
def test_bad_cost_arguments_say_what_is_expected(args, message):
    proc = _plan("--config", str(REPO / "config" / "paper-kv-cache.yaml"), "--cost", *args)
    assert proc.returncode != 0 and message in proc.stderr


def test_llama_cpp_cells_are_counted_apart_and_not_priced(tmp_path):
    """config/engines.yaml: 2 transformers cells on 6 prompts are priced; its 4 llama.cpp cells
    run on the CPU and are only counted."""
    proc = _plan("--config", str(REPO / "config" / "engines.yaml"), "--cost", "--json", "--root", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    cost = json.loads(proc.stdout)
    assert cost["rules"]["generate"] == 6 and cost["generate"]["cells"] == 2
    assert cost["generate"]["prompts"] == 2 * 6 and cost["generate"]["generated_tokens"] == 2 * 6 * 32
    assert cost["cpu_cells"] == {"llama.cpp": 4}
    text = _plan("--config", str(REPO / "config" / "engines.yaml"), "--cost", "--root", str(tmp_path)).stdout
    assert "not priced: 4 llama.cpp cell(s), which run on the CPU" in text
