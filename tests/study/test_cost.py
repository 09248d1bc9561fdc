"""`tokenflip plan --cost`: the price of a study before its first GPU job, on inputs whose
figures are counted by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from tokenflip.models.size import PUBLISHED_CONFIGS, ModelSize, head_size, model_size, size_in_name
from tokenflip.study.cost.model import (
    CalibrationFileError,
    CpuCalibration,
    Device,
    batch_positions,
    generation_seconds,
    gpu_overhead_from,
    intervention_work,
    probe_seconds,
)

ONE_B = ModelSize(1e9, 1e9, None, None, "test")  # no layers: the roofline alone


def _positions(prompts, p, t, rows=1, cache=True):
    return -(-prompts // rows) * sum(batch_positions(p, rows, t, cache))


def test_cache_on_prefills_once_then_one_position_a_step():
    # 3 prompts of 10 tokens, 4 new tokens: per prompt the prefill (10) and 3 steps of 1.
    assert batch_positions(10, 1, 4, True) == [10, 1, 1, 1]
    assert _positions(3, 10, 4) == 39


def test_cache_off_reprocesses_the_whole_sequence_every_step():
    # Per prompt 10 + 11 + 12 + 13 = 46 positions: quadratic in the generation.
    assert _positions(3, 10, 4, cache=False) == 3 * 46
    assert _positions(1, 10, 256, cache=False) == 256 * 10 + 256 * 255 / 2


def test_batches_pad_to_their_longest_prompt():
    # 3 prompts in batches of 2: two batches, each 2 rows x (10 + 3) positions.
    assert _positions(3, 10, 4, rows=2) == 52


def test_a_pass_costs_the_larger_of_its_roofline_and_the_step_overhead():
    device = Device(bandwidth_gbs=2000, tflops=150)
    # 1B parameters in bf16: 2 GB read at 2,000 GB/s = 1 ms; 10 positions need 2e10 FLOPs = 0.13 ms.
    assert device.pass_seconds("m", ONE_B, "bf16", 10) == pytest.approx(1e-3)
    # 1,000 positions need 2e12 FLOPs: 13.3 ms of compute, more than the 1 ms of reading.
    assert device.pass_seconds("m", ONE_B, "bf16", 1000) == pytest.approx(2e12 / 150e12)
    # fp32 reads twice the bytes and multiplies at an eighth of the rate.
    assert device.pass_seconds("m", ONE_B, "fp32", 1) == pytest.approx(2e-3)
    assert device.pass_seconds("m", ONE_B, "fp32", 1000) == pytest.approx(8 * 2e12 / 150e12)
    # 32 layers at 1 ms each: a launch-bound step takes 32 ms, not the roofline's 1 ms.
    layered = ModelSize(1e9, 1e9, 32, None, "test")
    assert device.pass_seconds("m", layered, "bf16", 1, rows=1) == pytest.approx(32 * 1.0e-3)
    assert device.pass_seconds("m", layered, "bf16", 8, rows=8) == pytest.approx(32 * 1.1e-3)
    assert device.pass_seconds("m", layered, "bf16", 3, rows=3) == pytest.approx(32 * 1.05e-3)  # bs4's entry


def test_a_mixture_of_experts_reads_and_computes_its_active_parameters():
    olmoe = model_size("olmoe", {"source": "hf", "id": "allenai/OLMoE-1B-7B-0924"}, REPO / "absent")
    # 64 experts, 8 per token: 6.9B stored, 1.3B per token.
    assert olmoe.total == pytest.approx(6.92e9, rel=0.01) and olmoe.active == pytest.approx(1.28e9, rel=0.01)
    assert olmoe.layers == 16 and olmoe.source == "its published configuration (not downloaded)"
    device = Device()
    assert device.pass_seconds("m", olmoe, "bf16", 1) == pytest.approx(max(olmoe.active * 2 / 2000e9, 16 * 1e-3))
    gemma = model_size("g", {"source": "hf", "id": "google/gemma-2-2b"}, REPO / "absent")
    assert gemma.total == pytest.approx(2.61e9, rel=0.01)  # not the 2.0B of its name
    assert {"source": "hf", "id": "google/gemma-2-2b"}["id"] in PUBLISHED_CONFIGS
    # gemma-2 sets its own head size (256, where 2304 / 8 heads would be 288); Llama-2 does not.
    assert head_size(PUBLISHED_CONFIGS["google/gemma-2-2b"]) == 256
    assert head_size(PUBLISHED_CONFIGS["meta-llama/Llama-2-7b-hf"]) == 4096 // 32


def test_a_model_without_a_configuration_falls_back_to_its_name_and_says_so():
    size = model_size("x", {"source": "hf", "id": "someone/Unknown-13B"}, REPO / "absent")
    assert size.total == 13e9 and size.layers is None and "size in its name" in size.source


def test_a_prepared_models_configuration_comes_first(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(
        {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": False}))
    size = model_size("m", {"source": "hf", "id": "meta-llama/Llama-2-7b-hf"}, tmp_path)
    # embeddings and head 2 x 64,000; per layer q,o 2 x 4,096, k,v 2 x 2,048, MLP 3 x 8,192, norms 2 x 64; final norm.
    assert size.total == 2 * 64000 + 3 * (2 * 4096 + 2 * 2048 + 3 * 8192 + 2 * 64) + 64
    assert size.layers == 3 and size.head == 64000 and size.source == "prepared model's config"


def _counting_device(a=1.0, b=0.0):
    """A calibrated device whose pass costs `a` + `b` per position, in every precision."""
    return Device(cpu=CpuCalibration(passes={("m", p): (a, b) for p in ("fp32", "bf16", "fp16")}))


def test_interventions_are_priced_by_what_they_compute():
    assert intervention_work({"kind": "none"}, "bf16") == (["bf16"], False)
    assert intervention_work({"kind": "global_fp32"}, "bf16") == (["fp32"], False)
    assert intervention_work({"kind": "fp32_oracle"}, "fp16") == (["fp32"], False)
    assert intervention_work({"kind": "consensus", "precisions": ["bf16", "fp16"]}, "bf16") == (["bf16", "fp16"], False)
    assert intervention_work({"kind": "compose", "of": [{"kind": "fp8_weights"}, {"kind": "fp32_head"}]},
                             "bf16") == (["bf16"], True)
    size = ModelSize(1e9, 1e9, 4, 1e8, "test")
    device = Device(cpu=CpuCalibration(passes={("m", "bf16"): (0.0, 1.0), ("m", "fp32"): (0.0, 2.0),
                                               ("m", "fp16"): (0.0, 1.0)}))
    plain = generation_seconds(device, "m", size, "bf16", True, 1, 1, 10, 4, {"kind": "none"})
    assert plain == 13  # 13 positions at 1 s
    # Consensus runs every pass in both precisions; the FP32 head adds a tenth of an fp32 position a step.
    assert generation_seconds(device, "m", size, "bf16", True, 1, 1, 10, 4, {"kind": "consensus"}) == 26
    assert generation_seconds(device, "m", size, "bf16", True, 1, 1, 10, 4,
                              {"kind": "fp32_head", "gated": False}) == pytest.approx(13 + 4 * 0.2)
    assert generation_seconds(device, "m", size, "bf16", True, 1, 1, 10, 4, {"kind": "global_fp32"}) == 26


def test_probes_are_priced_by_the_passes_they_run():
    size = ModelSize(1e9, 1e9, 2, None, "test")
    device = _counting_device()  # one second a pass: the cost counts passes
    # kv_cache, per prompt and precision: 4 cached + 4 uncached replay passes; per patch step
    # the cache before step 2 (2 passes), the step recomputed (1) and 2 x 2 + 3 patched steps.
    kv = probe_seconds(device, "m", size, "kv_cache", {"prompts": 2, "precisions": ["fp16"], "patch_steps": 1,
                                                       "forms": ["prefill_chunk=16"]}, 10, 4)
    assert kv == 2 * (8 + (2 + 1 + 7) + 4)
    # precision, per prompt and pair: a cached replay in each precision, and per flip in each
    # the cache before the flip (2 passes) and layers + 3 grafted steps.
    prec = probe_seconds(device, "m", size, "precision", {"prompts": 1, "pairs": [["bf16", "fp16"]], "flips": 1},
                         10, 4)
    assert prec == 2 * 4 + 2 * (2 + 5)


def _gpu_check(tmp_path, **perf):
    path = tmp_path / "gpu-check.json"
    path.write_text(json.dumps({"environment": {"gpu": {"name": "NVIDIA H200"}}, "parts": {"perf": {
        "layers": 16, "checks": [{"name": "decode_vs_generate", "figures": perf}]}}}))
    return path


def test_the_step_overhead_is_taken_from_a_saved_gpu_check(tmp_path):
    path = _gpu_check(tmp_path, bs1={"tok_s_wall": {"decode": 50.0}}, bs8={"tok_s_wall": {"decode": 320.0}})
    table, source = gpu_overhead_from(str(path))
    # bs1: 20 ms a step over 16 layers; bs8: 8 / 320 s = 25 ms a step.
    assert table == {1: pytest.approx(0.02 / 16), 8: pytest.approx(0.025 / 16)}
    assert "NVIDIA H200" in source
    (tmp_path / "table.json").write_text(json.dumps({"overhead_per_layer_ms": {"1": 0.5}, "source": "mine"}))
    assert gpu_overhead_from(str(tmp_path / "table.json")) == ({1: 0.0005}, "mine")
    (tmp_path / "bad.json").write_text(json.dumps({"parts": {}}))
    with pytest.raises(CalibrationFileError, match="--calibration .*bad.json: neither overhead_per_layer_ms"):
        gpu_overhead_from(str(tmp_path / "bad.json"))


@pytest.mark.parametrize("name,params", [("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 1.1e9),
                                         ("Qwen/Qwen2.5-3B-Instruct", 3e9), ("meta-llama/Llama-2-7b-hf", 7e9),
                                         ("allenai/OLMoE-1B-7B-0924", 7e9), ("SmolLM2-135M-Instruct.Q4_1.gguf", 135e6),
                                         ("gpt2", None)])
def test_sizes_are_read_from_model_names_as_a_last_resort(name, params):
    assert size_in_name(name) == (pytest.approx(params) if params else None)


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokenflip", "plan", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_the_default_costs_what_its_config_says(tmp_path):
    proc = _plan("--config", str(REPO / "config" / "config.yaml"), "--cost", "--json", "--root", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    cost = json.loads(proc.stdout)
    # 4 cells on onestep (the reference, FP8 E5M2, chunked prefill, the reference again), each at
    # most its rounds' maximum of 72 prompts, 32 new tokens each; its 3 pairs; no probe.
    assert cost["rules"] == {"prepare_model": 1, "check_prompts": 1, "generate": 4, "compare": 3, "probe": 0,
                             "summarize": 1, "report": 1}
    assert cost["generate"]["prompts"] == 4 * 72
    assert cost["generate"]["generated_tokens"] == 4 * 72 * 32


def test_the_jobs_of_one_load_setting_pay_its_load_once_where_loads_are_shared(tmp_path):
    """The default's 4 cells load one model in one setting (fp32, default attention): with
    shared loads (a run here) the load is paid once, each other job its start alone; with
    sharing off (TOKENFLIP_SHARE_LOADS=0, a cluster job) every job pays it, 3 loads more of
    134,515,008 fp32 parameters at the GPU's load rate."""
    args = ("--config", str(REPO / "config" / "config.yaml"), "--cost", "--json", "--root", str(tmp_path))
    shared = json.loads(_plan(*args).stdout)
    env = {**os.environ, "TOKENFLIP_SHARE_LOADS": "0"}
    apart = json.loads(subprocess.run([sys.executable, "-m", "tokenflip", "plan", *args], capture_output=True,
                                      text=True, timeout=300, cwd=REPO, env=env).stdout)
    assert shared["loads"] == {"shared": True, "loads": 1} and apart["loads"] == {"shared": False, "loads": 4}
    load = 134515008 * 4 / (shared["device"]["load_gbs"] * 1e9)
    assert apart["total_seconds"] - shared["total_seconds"] == pytest.approx(3 * load)
    assert sorted(apart["per_cell"].values())[0] - sorted(shared["per_cell"].values())[0] == pytest.approx(load)
    text = _plan(*args[:-3], "--root", str(tmp_path)).stdout
    assert "model loads for the 4 transformers cells: 1 (the cells of one load setting share a warm process" in text


def test_the_tour_costs_what_its_config_says(tmp_path):
    proc = _plan("--config", str(REPO / "config" / "tour.yaml"), "--cost", "--json", "--root", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    cost = json.loads(proc.stdout)
    # 14 cells on onestep (at most 12 prompts, its rounds' maximum: 10, and 4 run again for the
    # noise floor) and 6 on onestep_kv (4 prompts: 4, and 2 run again), 32 new tokens each.
    assert cost["rules"] == {"prepare_model": 1, "check_prompts": 2, "generate": 20, "compare": 23, "probe": 2,
                             "summarize": 1, "report": 1}
    assert cost["generate"]["prompts"] == 14 * 12 + 6 * 4
    assert cost["generate"]["generated_tokens"] == (14 * 12 + 6 * 4) * 32
    size = cost["sources"]["parameters"]["smollm2-135m"]
    assert (size["parameters"], size["layers"], size["from"]) == (134515008, 30, "the GGUF file's metadata")
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
                                          (("--calibration", "/absent/gpu-check.json"),
                                           "--calibration /absent/gpu-check.json: file not found")])
def test_bad_cost_arguments_say_what_is_expected(args, message):
    proc = _plan("--config", str(REPO / "config" / "paper-kv-cache.yaml"), "--cost", *args)
    assert proc.returncode != 0 and message in proc.stderr


def test_prompt_lengths_are_given_as_the_readme_writes_them_or_one_by_one():
    paper = str(REPO / "config" / "paper-precision.yaml")
    together = _plan("--config", paper, "--cost", "--json", "--prompt-tokens", "gsm8k=910", "mbpp=601")
    apart = _plan("--config", paper, "--cost", "--json", "--prompt-tokens", "gsm8k=910", "--prompt-tokens", "mbpp=601")
    assert together.returncode == 0, together.stderr
    sources = json.loads(together.stdout)["sources"]["prompt_tokens"]
    assert sources["tinyllama-1.1b-chat/gsm8k"] == {"tokens": 910, "from": "given (--prompt-tokens)"}
    assert sources["tinyllama-1.1b-chat/mbpp"] == {"tokens": 601, "from": "given (--prompt-tokens)"}
    assert json.loads(apart.stdout)["total_seconds"] == json.loads(together.stdout)["total_seconds"]


def _tiny_study(tmp_path, model):
    config = {"run": "tiny", "models": {"m": model},
              "benchmarks": {"onestep": {"kind": "onestep", "n": 3, "max_new_tokens": 6}},
              "interventions": {"none": {"kind": "none"}},
              "grids": [{"precision": ["fp32", "bf16"], "cache": ["on", "off"], "batch_size": [1]}],
              "comparisons": [{"axis": "cache", "a": "on", "b": "off"}]}
    path = tmp_path / "tiny.yaml"
    path.write_text(json.dumps(config))
    return path


def test_a_cpu_estimate_times_the_studys_own_model_here(tmp_path):
    path = _tiny_study(tmp_path, {"source": "random", "architecture": "llama", "seed": 0})
    proc = _plan("--config", str(path), "--cost", "--json", "--device", "cpu", "--root", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    cost = json.loads(proc.stdout)
    calibration = cost["device"]["calibration"]
    assert set(calibration["passes"]) == {"m/fp32", "m/bf16"} and calibration["job_start_s"] > 0
    assert calibration["prompt_tokens"]["m/onestep"]["max"] > 10
    assert calibration["length_share"]["m/onestep"] == {"mean": 1.0, "max": 1.0}  # a random model never stops
    assert "m" in calibration["prepare_s"]  # not prepared under --root: prepared (and timed) by the calibration
    assert calibration["cell_job_s"]["m"] > calibration["job_start_s"]  # a real generation job, one token
    cells = cost["per_cell"]
    for p in ("fp32", "bf16"):
        assert cells[f"m/onestep/{p}-off-bs1-greedy-none"] > cells[f"m/onestep/{p}-on-bs1-greedy-none"] > 0
    # every job is priced: 4 cells, 2 pairs, 1 preparation, 1 prompt check, summary, report, scheduler
    assert cost["total_seconds"] == pytest.approx(cost["generate"]["seconds"] + cost["other_jobs_seconds"])
    assert cost["other_jobs_seconds"] >= calibration["job_start_s"] * (1 + 1 + 2 + 3)
    text = _plan("--config", str(path), "--cost", "--device", "cpu", "--root", str(tmp_path)).stdout
    assert "CPU-hours" in text and "this CPU, calibrated" in text


def test_a_cpu_estimate_of_a_hub_model_that_is_not_here_says_how_to_prepare_it(tmp_path):
    path = _tiny_study(tmp_path, {"source": "hf", "id": "meta-llama/Llama-2-7b-hf"})
    proc = _plan("--config", str(path), "--cost", "--device", "cpu", "--root", str(tmp_path))
    assert proc.returncode == 1
    assert "model 'm' (meta-llama/Llama-2-7b-hf) is not prepared" in proc.stderr
    assert "snakemake --until prepare_model" in proc.stderr


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


# --- inputs that are no GPU, no calibration, no prompt --------------------------------------------

def _deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize("content,message", [
    ("", "an empty file"),
    ("5", "a JSON int, not an object"),
    ("[1, 2]", "a JSON list, not an object"),
    (_deep(100_000), "nested deeper than 64 levels"),
    ('{"overhead_per_layer_ms": {}}', "overhead_per_layer_ms must map batch sizes to milliseconds"),
    ('{"overhead_per_layer_ms": 3}', "overhead_per_layer_ms must map batch sizes to milliseconds"),
    ('{"overhead_per_layer_ms": {"1": -1}}', "overhead_per_layer_ms.1: '-1' is not a number of milliseconds"),
    ('{"overhead_per_layer_ms": {"1": 0}}', "overhead_per_layer_ms.1: '0' is not a number of milliseconds"),
    ('{"overhead_per_layer_ms": {"1": NaN}}', "NaN is not a finite number"),
    ('{"overhead_per_layer_ms": {"1": 1e309}}', "1e309 is beyond the largest number a float holds"),
    ('{"overhead_per_layer_ms": {"1": 1e300}}', "overhead_per_layer_ms.1: '1e+300' is not a number of milliseconds"),
    ('{"overhead_per_layer_ms": {"1": true}}', "overhead_per_layer_ms.1: 'true' is not a number of milliseconds"),
    ('{"overhead_per_layer_ms": {"0": 1.0}}', "batch size '0' is not a whole number from 1 to 65536"),
    ('{"overhead_per_layer_ms": {"-8": 1.0}}', "batch size '-8' is not a whole number"),
    ('{"overhead_per_layer_ms": {"' + "9" * 5000 + '": 1.0}}', "(5,000 characters) is not a whole number"),
    ('{"parts": {"perf": {"layers": 0, "checks": [{"name": "decode_vs_generate", '
     '"figures": {"bs1": {"tok_s_wall": {"decode": 50}}}}]}}}', "parts.perf.layers: '0' is not a number of layers"),
    ('{"parts": {"perf": {"layers": 16, "checks": [{"name": "decode_vs_generate", '
     '"figures": {"bs1": {"tok_s_wall": {"decode": 0}}}}]}}}', "bs1.tok_s_wall.decode: '0' is not a positive"),
    ('{"parts": {"perf": {"layers": 16, "checks": [{"name": "decode_vs_generate", '
     '"figures": {"bs1": {"tok_s_wall": {"decode": 1e-9}}}}]}}}', "is not a number of milliseconds"),
    ('{"parts": {"perf": {"layers": 16, "checks": [{"name": "decode_vs_generate", "figures": {}}]}}}',
     "neither overhead_per_layer_ms nor a GPU check's"),
    ('{"parts": {"perf": {"layers": 16, "checks": [{"name": "decode_vs_generate", '
     '"figures": {"bsx": {"tok_s_wall": {"decode": 50}}}}]}}}', "batch size 'x' is not a whole number"),
])
def test_a_calibration_file_that_says_no_step_cost_is_refused_naming_it_and_the_key(tmp_path, content, message):
    path = tmp_path / "calibration.json"
    path.write_text(content)
    with pytest.raises(CalibrationFileError) as refused:
        gpu_overhead_from(str(path))
    assert f"--calibration {path}" in str(refused.value) and message in str(refused.value), str(refused.value)


@pytest.mark.parametrize("path,message", [("/dev/zero", "a device, not a file"), (".", "a directory, not a file"),
                                          ("x" * 10_000, "… (10,000 characters): File name too long")])
def test_a_calibration_that_is_no_file_is_refused_before_it_is_read(path, message):
    with pytest.raises(CalibrationFileError, match="--calibration") as refused:
        gpu_overhead_from(path)
    assert message in str(refused.value) and len(str(refused.value)) < 400


def test_a_calibration_file_larger_than_a_megabyte_is_refused(tmp_path):
    path = tmp_path / "gpu-check.json"
    path.write_text('{"overhead_per_layer_ms": {"1": 1.0}, "padding": "' + "x" * 2**20 + '"}')
    with pytest.raises(CalibrationFileError, match=r"1,048,\d+ bytes, more than the 1,048,576"):
        gpu_overhead_from(str(path))


def _figures(value, where=""):
    """Every number of a priced study, with where it is."""
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _figures(sub, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, sub in enumerate(value):
            yield from _figures(sub, f"{where}.{i}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield where, value


def test_no_cost_figure_is_negative_nan_or_infinite_at_the_bounds_of_every_input(tmp_path):
    """Every input at both ends of what it may be (bandwidth, throughput, a calibration's
    overhead, a prompt's length): every figure priced is a finite number, none negative."""
    import math

    from tokenflip.study import config as cfg
    from tokenflip.study.cost.estimate import price
    from tokenflip.study.cost.model import GPU_BANDWIDTH_GBS, GPU_TFLOPS, MAX_PROMPT_TOKENS, OVERHEAD_PER_LAYER_MS

    config = cfg.load(REPO / "config" / "paper-kv-cache.yaml")
    counted = 0
    for end in (0, 1):
        calibration = tmp_path / f"calibration-{end}.json"
        calibration.write_text(json.dumps({"overhead_per_layer_ms": {"1": OVERHEAD_PER_LAYER_MS[end],
                                                                     "8": OVERHEAD_PER_LAYER_MS[end]}}))
        cost = price(config, "gpu", GPU_BANDWIDTH_GBS[end], GPU_TFLOPS[end], str(calibration), str(tmp_path),
                     {"gsm8k": (1, MAX_PROMPT_TOKENS)[end]})
        figures = list(_figures(cost))
        bad = [(where, x) for where, x in figures if not math.isfinite(x) or x < 0]
        assert not bad, bad
        assert cost["total_seconds"] > 0 and cost["unknown"] == []
        counted += len(figures)
    assert counted > 100


@pytest.mark.parametrize("bandwidth,tflops,tokens", [(0, 150, 10), (2000, 0, 10), (float("nan"), 150, 10),
                                                     (2000, float("inf"), 10), (-1, 150, 10), (2000, 150, 0),
                                                     (2000, 150, float("nan")), (2000, 150, 1e308), (True, 150, 10)])
def test_price_refuses_what_no_gpu_or_prompt_can_be(bandwidth, tflops, tokens):
    from tokenflip.study import config as cfg
    from tokenflip.study.cost.estimate import price
    from tokenflip.study.cost.model import CostInputError

    config = cfg.load(REPO / "config" / "paper-kv-cache.yaml")
    with pytest.raises(CostInputError, match="--bandwidth-gbs|--tflops|--prompt-tokens"):
        price(config, "gpu", bandwidth, tflops, prompt_tokens={"gsm8k": tokens})


def test_a_figure_that_comes_out_negative_or_nan_is_refused_not_printed():
    from tokenflip.study.cost.model import CostInputError, check_figures

    check_figures({"generate": {"seconds": 1.0, "cells": 2}, "per_cell": {"a": None}, "unknown": []})
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(CostInputError, match=r"the figure per_cell\.m/b/c came out as"):
            check_figures({"generate": {"seconds": 1.0}, "per_cell": {"m/b/c": bad}})


@pytest.mark.parametrize("flag,value", [("--bandwidth-gbs", "0"), ("--bandwidth-gbs", "-1"), ("--tflops", "nan"),
                                        ("--tflops", "inf"), ("--bandwidth-gbs", "1e309"),
                                        ("--prompt-tokens", "gsm8k=nan"), ("--prompt-tokens", "gsm8k=-5")])
def test_cost_flags_out_of_range_are_usage_errors_naming_the_flag(flag, value):
    proc = _plan("--config", str(REPO / "config" / "paper-kv-cache.yaml"), "--cost", flag, value)
    assert proc.returncode == 2 and f"argument {flag}: " in proc.stderr and "Traceback" not in proc.stderr
