"""Config validation and the cell/pair plan derived from it."""

from __future__ import annotations

import copy
import json

import pytest

from conftest import REPO
from tokenflip.core.layout import RunLayout
from tokenflip.core.specs import CellJob
from tokenflip.study import config as cfg
from tokenflip.study.plan import Cell, Pair, cell_job, expand_cells, expand_pairs

BASE = {
    "run": "t",
    "models": {"m1": {"source": "random", "architecture": "llama"}},
    "benchmarks": {"arith": {"kind": "arithmetic", "n": 3}},
    "grids": [{"precision": ["fp32", "bf16"], "cache": ["on", "off"], "batch_size": [1]},
              {"precision": ["bf16"], "cache": ["on"], "batch_size": [4]}],
    "comparisons": [{"axis": "cache", "a": "on", "b": "off"},
                    {"axis": "precision", "a": "fp32", "b": "bf16"},
                    {"axis": "batch_size", "a": 1, "b": 4}],
}


def valid(**changes):
    c = copy.deepcopy(BASE)
    c.update(changes)
    return cfg.validate(c, source="test.yaml")


def test_defaults_are_filled():
    c = valid()
    assert c["generation"] == {"max_new_tokens": 128, "record_top_k": 16, "device": "auto", "threads": None}
    assert c["decoding"] == {"greedy": {"strategy": "greedy"}}
    assert c["interventions"] == {"none": {"kind": "none"}}


def test_cells_and_pairs():
    c = valid()
    cells = expand_cells(c)
    assert len(cells) == 5
    pairs = expand_pairs(c, cells)
    labels = sorted((p.axis, p.a.name, p.b.name) for p in pairs)
    assert labels == [
        ("batch_size", "bf16-on-bs1-greedy-none", "bf16-on-bs4-greedy-none"),
        ("cache", "bf16-on-bs1-greedy-none", "bf16-off-bs1-greedy-none"),
        ("cache", "fp32-on-bs1-greedy-none", "fp32-off-bs1-greedy-none"),
        ("precision", "fp32-off-bs1-greedy-none", "bf16-off-bs1-greedy-none"),
        ("precision", "fp32-on-bs1-greedy-none", "bf16-on-bs1-greedy-none"),
    ]
    for pair in pairs:
        assert Pair.from_id(pair.id) == pair
        model, bench, axis, ab, context = pair.id.split("/")
        a, b = ab.split("_vs_")
        assert Pair.from_parts(model, bench, axis, a, b, context) == pair


def test_cell_names_round_trip():
    cell = Cell("m", "b", "fp16", "off", 8, "greedy", "none")
    assert RunLayout("r").cell(cell.id) == "results/r/cells/m/b/fp16-off-bs8-greedy-none.parquet"
    assert Cell.from_name("m", "b", cell.name) == cell
    assert Cell.from_dict(json.loads(json.dumps(cell.as_dict()))) == cell


def test_cell_settings_depend_on_their_own_model_and_benchmark_only():
    c = valid()
    cell = expand_cells(c)[0]
    before = cell_job(c, cell).to_json()
    c2 = copy.deepcopy(BASE)
    c2["models"]["m2"] = {"source": "random", "architecture": "mistral"}
    c2["benchmarks"]["other"] = {"kind": "arithmetic", "n": 7}
    c2 = cfg.validate(c2)
    assert cell_job(c2, cell).to_json() == before
    c3 = copy.deepcopy(c2)
    c3["benchmarks"]["other"]["n"] = 9
    assert cell_job(c3, cell).to_json() == before


def test_yaml_booleans_for_cache_mean_on_and_off():
    c = copy.deepcopy(BASE)
    c["grids"][0]["cache"] = [True, False]
    c["comparisons"][0] = {"axis": "cache", "a": True, "b": False}
    assert cfg.validate(c)["grids"][0]["cache"] == ["on", "off"]


@pytest.mark.parametrize("mutate, needle", [
    (lambda c: c["grids"][0].update(precision=["fp8"]), "grids.0.precision.0: 'fp8' is not one of"),
    (lambda c: c["grids"][0].update(batch_size=[0]), "grids.0.batch_size.0: 0 is below the minimum 1"),
    (lambda c: c["benchmarks"]["arith"].update(kind="mmlu"), "benchmarks.arith.kind: 'mmlu' is not one of"),
    (lambda c: c["models"].update({"bad/name": {"source": "random", "architecture": "llama"}}),
     "'bad/name' contains characters that are not allowed"),
    (lambda c: c["comparisons"].append({"axis": "precision", "a": "fp32", "b": "fp16"}),
     "comparisons.3.b: 'fp16' is not a value of axis 'precision'"),
    (lambda c: c["grids"][0].update(decoding=["beam"]), "grids.0.decoding: 'beam' is not defined under 'decoding'"),
    (lambda c: c.update(colour="red"), "unknown key(s) ('colour' was unexpected)"),
    (lambda c: c["models"]["m1"].update(source="ollama"), "models.m1.source: 'ollama' is not one of"),
])
def test_bad_config_names_key_and_value(mutate, needle):
    c = copy.deepcopy(BASE)
    mutate(c)
    with pytest.raises(cfg.ConfigError) as err:
        cfg.validate(c, source="my.yaml")
    assert needle in str(err.value)
    assert "my.yaml" in str(err.value)


def test_duplicate_keys_in_yaml_are_refused(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("run: x\nmodels:\n  a: {source: random, architecture: llama}\n"
                    "  a: {source: random, architecture: mistral}\n")
    with pytest.raises(cfg.ConfigError, match=r"dup.yaml: duplicate key 'a' at line 4 \(first at line 3\)"):
        cfg.read_yaml(path)


# Each shipped config's plan, counted by hand from its grids and comparisons.
#
# config/config.yaml and config/tour.yaml: counted beside their entries below.
# config/paper-kv-cache.yaml: 3 models x 1 benchmark.
#   cells per model: fp16 x {on, off} x 3 decodings = 6, fp32 x {on, off} x greedy = 2; 8 x 3 = 24.
#   pairs per model: cache on/off: fp16 x 3 decodings + fp32 greedy = 4; precision
#          fp32/fp16: greedy on, greedy off = 2 (fp32 has no sampling cells); 6 x 3 = 18
#          (cache 4 x 3 = 12, precision 2 x 3 = 6).
# config/paper-precision.yaml: 6 models x 4 benchmarks = 24 model-benchmark combinations.
#   cells per combination: bf16/fp16 x 8 interventions at bs1 = 16, bf16/fp16 x bs2/4/8 x
#          {none, C_gated} = 12; 28 x 24 = 672.
#   pairs per combination: precision bf16/fp16: every bf16 cell has its fp16 twin = 14;
#          batch size 1/8: bf16/fp16 x {none, C_gated} = 4 (the other interventions have no
#          bs8 cell); 18 x 24 = 432 (precision 14 x 24 = 336, batch size 4 x 24 = 96).
SHIPPED_PLANS = {
    "config.yaml": dict(
        # fp32, cache on, bs4 on onestep: the reference, FP8 E5M2 KV cache, chunked prefill and
        # the reference run again (4); pairs: the two comparisons and the noise floor (3).
        cells=4, pairs={"kv_dtype": 1, "prefill_chunk": 1, "repeat": 1},
        cell_ids=["smollm2-135m/onestep/fp32-on-bs4-greedy-none",
                  "smollm2-135m/onestep/fp32-on-bs4-greedy-none-kv_dtype=fp8_e5m2",
                  "smollm2-135m/onestep/fp32-on-bs4-greedy-none-prefill_chunk=16",
                  "smollm2-135m/onestep/fp32-on-bs4-greedy-none-repeat=2"],
        absent_cell_ids=["smollm2-135m/onestep/fp16-on-bs4-greedy-none",
                         "smollm2-135m/onestep/fp32-on-bs4-greedy-none-kv_dtype=fp8_e4m3"],
        pair_ids=["smollm2-135m/onestep/kv_dtype/default_vs_fp8_e5m2/fp32-on-bs4-greedy-none-kv_dtype=x",
                  "smollm2-135m/onestep/prefill_chunk/default_vs_16/fp32-on-bs4-greedy-none-prefill_chunk=x",
                  "smollm2-135m/onestep/repeat/default_vs_2/fp32-on-bs4-greedy-none-repeat=x"],
        absent_pair_ids=["smollm2-135m/onestep/kv_dtype/default_vs_fp8_e4m3/fp32-on-bs4-greedy-none-kv_dtype=x"]),
    "tour.yaml": dict(
        # onestep_kv (the first 4 prompts): fp32/fp16 x cache on/off at bs1 (4); onestep:
        # the three precisions at bs1 (3) + bf16 at bs4 (1) + bf16/fp16 with C_gated (2) +
        # bf16 eager (1) + fp32 with an FP8 E4M3 and an E5M2 KV cache (2) + fp32 with
        # chunked prefill (1) = 14 cells. Pairs on onestep_kv: cache on/off per precision (2;
        # its precision pairs would count onestep's first 4 prompts twice: the precision
        # comparisons name onestep). On onestep: bf16 vs fp16 with and without C (2), fp32 vs
        # bf16 and fp32 vs fp16 (2); bs1 vs bs4 for bf16 (1); none vs C_gated for bf16 and
        # fp16 (2); default vs eager attention (1); default vs each FP8 cache (2); default vs
        # chunked prefill (1): 13.
        # The noise floors: the cache-on fp32 and fp16 cells of onestep_kv, the three
        # precisions' bs1 cells of onestep and the bf16 cell with C run again (repeat 2): 6
        # cells, 20 in all; their repeat pairs (6), and among the second runs the precision
        # pairs (3 without C) and none vs C in bf16 (1): 23.
        cells=20, pairs={"cache": 2, "precision": 7, "batch_size": 1, "intervention": 3, "attention": 1,
                         "kv_dtype": 2, "prefill_chunk": 1, "repeat": 6},
        cell_ids=["smollm2-135m/onestep_kv/fp16-off-bs1-greedy-none",
                  "smollm2-135m/onestep_kv/fp16-on-bs1-greedy-none",
                  "smollm2-135m/onestep/bf16-on-bs4-greedy-none",
                  "smollm2-135m/onestep/bf16-on-bs1-greedy-none-attention=eager",
                  "smollm2-135m/onestep/bf16-on-bs1-greedy-C_gated",
                  "smollm2-135m/onestep/fp32-on-bs1-greedy-none-kv_dtype=fp8_e4m3",
                  "smollm2-135m/onestep/fp32-on-bs1-greedy-none-kv_dtype=fp8_e5m2",
                  "smollm2-135m/onestep/fp32-on-bs1-greedy-none-prefill_chunk=16",
                  "smollm2-135m/onestep/fp16-on-bs1-greedy-none-repeat=2",
                  "smollm2-135m/onestep_kv/fp32-on-bs1-greedy-none-repeat=2"],
        absent_cell_ids=["smollm2-135m/onestep/fp16-off-bs1-greedy-none",
                         "smollm2-135m/onestep/bf16-on-bs4-greedy-none-repeat=2",
                         "smollm2-135m/onestep_kv/fp16-off-bs1-greedy-none-repeat=2",
                         "smollm2-135m/onestep/fp16-on-bs4-greedy-none",
                         "smollm2-135m/onestep_kv/bf16-off-bs1-greedy-none",
                         "smollm2-135m/onestep_kv/fp16-on-bs4-greedy-none",
                         "smollm2-135m/onestep/bf16-on-bs4-greedy-C_gated"],
        pair_ids=["smollm2-135m/onestep_kv/cache/on_vs_off/fp16-x-bs1-greedy-none",
                  "smollm2-135m/onestep/precision/bf16_vs_fp16/x-on-bs1-greedy-C_gated",
                  "smollm2-135m/onestep/batch_size/1_vs_4/bf16-on-x-greedy-none",
                  "smollm2-135m/onestep/intervention/none_vs_C_gated/bf16-on-bs1-greedy-x",
                  "smollm2-135m/onestep/attention/default_vs_eager/bf16-on-bs1-greedy-none-attention=x",
                  "smollm2-135m/onestep/kv_dtype/default_vs_fp8_e4m3/fp32-on-bs1-greedy-none-kv_dtype=x",
                  "smollm2-135m/onestep/prefill_chunk/default_vs_16/fp32-on-bs1-greedy-none-prefill_chunk=x",
                  "smollm2-135m/onestep/repeat/default_vs_2/fp16-on-bs1-greedy-none-repeat=x",
                  "smollm2-135m/onestep/precision/fp32_vs_fp16/x-on-bs1-greedy-none-repeat=2"],
        absent_pair_ids=["smollm2-135m/onestep/cache/on_vs_off/fp16-x-bs1-greedy-none",
                         "smollm2-135m/onestep_kv/precision/fp32_vs_bf16/x-off-bs1-greedy-none",
                         "smollm2-135m/onestep/intervention/none_vs_C_gated/fp32-on-bs1-greedy-x"]),
    "engines.yaml": dict(
        # transformers fp32 on/off (2) + llama.cpp fp32/fp16 on/off (4); pairs: cache on vs off
        # in each engine and llama.cpp precision (3), transformers vs llama.cpp in fp32 on and
        # off (2), llama.cpp fp32 vs fp16 on and off (2).
        cells=6, pairs={"cache": 3, "engine": 2, "precision": 2},
        cell_ids=["smollm2-135m/onestep/fp16-off-bs1-greedy-none-engine=llama.cpp",
                  "smollm2-135m/onestep/fp32-off-bs1-greedy-none"],
        absent_cell_ids=["smollm2-135m/onestep/fp16-on-bs1-greedy-none",
                         "smollm2-135m/onestep/bf16-on-bs1-greedy-none-engine=llama.cpp"],
        pair_ids=["smollm2-135m/onestep/engine/transformers_vs_llama.cpp/fp32-off-bs1-greedy-none-engine=x",
                  "smollm2-135m/onestep/cache/on_vs_off/fp16-x-bs1-greedy-none-engine=llama.cpp",
                  "smollm2-135m/onestep/precision/fp32_vs_fp16/x-on-bs1-greedy-none-engine=llama.cpp"],
        absent_pair_ids=["smollm2-135m/onestep/engine/transformers_vs_llama.cpp/fp16-on-bs1-greedy-none-engine=x",
                         "smollm2-135m/onestep/precision/fp32_vs_fp16/x-on-bs1-greedy-none"]),
    "endpoint.yaml": dict(
        # the live endpoint one at a time and at 8 in flight, each twice (repeat) (4); with a
        # background load (1); without logprobs (1); transformers (1): 7 cells. Pairs:
        # concurrency default vs 8 at each repeat (2), repeat default vs 2 at each concurrency
        # (2), load, logprobs, transformers vs the endpoint (1 each): 7 pairs.
        cells=7, pairs={"concurrency": 2, "repeat": 2, "load": 1, "logprobs": 1, "engine": 1},
        cell_ids=["smollm2-135m/onestep/fp32-on-bs1-greedy-none",
                  "smollm2-135m/onestep/fp32-on-bs1-greedy-none-repeat=2-engine=local_vllm-concurrency=8",
                  "smollm2-135m/onestep/fp32-on-bs1-greedy-none-engine=local_vllm-load=busy",
                  "smollm2-135m/onestep/fp32-on-bs1-greedy-none-engine=local_vllm-logprobs=off"],
        absent_cell_ids=["smollm2-135m/onestep/fp32-on-bs1-greedy-none-repeat=2-engine=local_vllm-load=busy"],
        pair_ids=["smollm2-135m/onestep/engine/transformers_vs_local_vllm/fp32-on-bs1-greedy-none-engine=x",
                  "smollm2-135m/onestep/load/none_vs_busy/fp32-on-bs1-greedy-none-engine=local_vllm-load=x"],
        absent_pair_ids=[]),
    "vllm.yaml": dict(
        # transformers fp32 and bf16 (2); vLLM fp32 and bf16 at concurrency default and 1 (4),
        # bf16 with a cold and a warm prefix cache (2), with chunked prefill (32, concurrency 1)
        # (1); llama.cpp fp32 (1); and each of the four vLLM concurrency cells run again
        # (repeat 2): 14 cells. Pairs: transformers vs vLLM in fp32 and bf16, llama.cpp vs vLLM
        # in fp32 (3); concurrency 1 vs default in fp32 and bf16, in each run (4); prefix cache
        # off vs cold and off vs on (2); prefill chunk default vs 32 (1); fp32 vs bf16 in
        # transformers, in vLLM at concurrency default and at 1, in each run (5); repeat
        # default vs 2 per vLLM setting (4): 19 pairs.
        cells=14, pairs={"engine": 3, "concurrency": 4, "prefix_cache": 2, "prefill_chunk": 1, "precision": 5,
                         "repeat": 4},
        cell_ids=["smollm2-135m/onestep/fp32-on-bs1-greedy-none",
                  "smollm2-135m/onestep/bf16-on-bs1-greedy-none-engine=vllm-concurrency=1",
                  "smollm2-135m/onestep/bf16-on-bs1-greedy-none-prefix_cache=on-engine=vllm",
                  "smollm2-135m/onestep/bf16-on-bs1-greedy-none-prefill_chunk=32-engine=vllm-concurrency=1",
                  "smollm2-135m/onestep/fp32-on-bs1-greedy-none-repeat=2-engine=vllm-concurrency=1"],
        absent_cell_ids=["smollm2-135m/onestep/fp32-on-bs1-greedy-none-prefix_cache=on-engine=vllm",
                         "smollm2-135m/onestep/bf16-on-bs1-greedy-none-kv_dtype=fp8_e5m2-engine=vllm",
                         "smollm2-135m/onestep/fp32-on-bs1-greedy-none-repeat=2",
                         "smollm2-135m/onestep/bf16-on-bs1-greedy-none-prefill_chunk=32-engine=vllm"],
        pair_ids=["smollm2-135m/onestep/engine/transformers_vs_vllm/bf16-on-bs1-greedy-none-engine=x",
                  "smollm2-135m/onestep/engine/llama.cpp_vs_vllm/fp32-on-bs1-greedy-none-engine=x",
                  "smollm2-135m/onestep/prefix_cache/off_vs_cold/bf16-on-bs1-greedy-none-prefix_cache=x-engine=vllm",
                  "smollm2-135m/onestep/concurrency/1_vs_default/bf16-on-bs1-greedy-none-engine=vllm-concurrency=x",
                  "smollm2-135m/onestep/prefix_cache/off_vs_on/bf16-on-bs1-greedy-none-prefix_cache=x-engine=vllm",
                  "smollm2-135m/onestep/prefill_chunk/default_vs_32/"
                  "bf16-on-bs1-greedy-none-prefill_chunk=x-engine=vllm-concurrency=1",
                  "smollm2-135m/onestep/precision/fp32_vs_bf16/x-on-bs1-greedy-none-engine=vllm-concurrency=1",
                  "smollm2-135m/onestep/repeat/default_vs_2/bf16-on-bs1-greedy-none-repeat=x-engine=vllm-concurrency=1"],
        absent_pair_ids=["smollm2-135m/onestep/engine/transformers_vs_vllm/bf16-on-bs1-greedy-none-engine=x-concurrency=1"]),
    "paper-kv-cache.yaml": dict(
        cells=24, pairs={"cache": 12, "precision": 6},
        cell_ids=["llama2-7b/gsm8k/fp16-off-bs1-topp09-none",
                  "gemma2-2b/gsm8k/fp32-on-bs1-greedy-none",
                  "mistral-7b-v0.3/gsm8k/fp16-on-bs1-temp07-none"],
        absent_cell_ids=["llama2-7b/gsm8k/fp32-on-bs1-temp07-none"],
        pair_ids=["llama2-7b/gsm8k/cache/on_vs_off/fp16-x-bs1-temp07-none",
                  "gemma2-2b/gsm8k/cache/on_vs_off/fp32-x-bs1-greedy-none",
                  "mistral-7b-v0.3/gsm8k/precision/fp32_vs_fp16/x-off-bs1-greedy-none"],
        absent_pair_ids=["llama2-7b/gsm8k/precision/fp32_vs_fp16/x-on-bs1-topp09-none"]),
    "paper-precision.yaml": dict(
        # 9 models x 4 benchmarks = 36 (model, benchmark); per one: 2 precisions x 8
        # interventions at bs1 (16) + 2 x 2 (none, C_gated) x 3 batch sizes (12) = 28 cells,
        # 1,008 in all; plus the repeat=2 copies of bf16/fp16 none bs1 for one model on 4
        # benchmarks (8): 1,016. Pairs per (model, benchmark): precision 8 + 6 = 14 (504),
        # batch size 1 vs 8 for none/C_gated x 2 precisions = 4 (144), intervention none vs
        # C_gated at 4 batch sizes x 2 precisions = 8, vs global_fp32 and fp32_oracle at bs1
        # x 2 = 4 (432); and the repeats: bf16 vs fp16 among the copies (4 more precision
        # pairs: 508) and default vs 2 per precision (8). The testbed grid adds 7 interventions
        # x 2 precisions on TinyLlama/GSM8K (14 cells: 1,030) and their 7 precision pairs (515);
        # C_gated vs fp32_oracle at bs1 adds 2 intervention pairs per (model, benchmark) (504).
        # The §6.1, §8.1 and App. VI arms: strict determinism (bf16, fp16 on TinyLlama/GSM8K:
        # 2 cells, 1 precision pair, 2 deterministic pairs), FlashAttention-2 ({none, C_gated}
        # x 2 precisions: 4 cells, 2 precision, 2 intervention, 4 attention pairs) and the chat
        # template (2 models x 2 precisions x {none, C_gated} on gsm8k_chat: 8 cells, 4
        # precision, 4 intervention pairs): 1,044 cells; precision 522, intervention 510.
        cells=1044, pairs={"precision": 522, "batch_size": 144, "intervention": 510, "repeat": 8,
                           "deterministic": 2, "attention": 4},
        cell_ids=["tinyllama-1.1b-chat/gsm8k/bf16-on-bs1-greedy-fp32_oracle",
                  "r1-distill-qwen-7b/math500/fp16-on-bs8-greedy-C_gated",
                  "qwen2.5-3b-instruct/humaneval/bf16-on-bs2-greedy-none",
                  "olmoe-1b-7b/mbpp/fp16-on-bs1-greedy-C_gated",
                  "tinyllama-1.1b-chat/gsm8k/fp16-on-bs1-greedy-none-repeat=2",
                  "tinyllama-1.1b-chat/gsm8k/bf16-on-bs1-greedy-fp8_emulated_C",
                  "tinyllama-1.1b-chat/gsm8k/fp16-on-bs1-greedy-none-deterministic=on",
                  "tinyllama-1.1b-chat/gsm8k/bf16-on-bs1-greedy-C_gated-attention=flash_attention_2",
                  "qwen2.5-3b-instruct/gsm8k_chat/fp16-on-bs1-greedy-C_gated"],
        absent_cell_ids=["mistral-7b/mbpp/bf16-on-bs4-greedy-sharpen",
                         "tinyllama-1.1b-chat/gsm8k_chat/bf16-on-bs1-greedy-none",
                         "qwen2.5-3b-instruct/gsm8k_chat/bf16-on-bs8-greedy-none",
                         "tinyllama-1.1b-chat/mbpp/bf16-on-bs1-greedy-consensus",
                         "qwen2.5-7b-instruct/gsm8k/fp16-on-bs1-greedy-none-repeat=2"],
        pair_ids=["llama3.2-3b-instruct/mbpp/precision/bf16_vs_fp16/x-on-bs1-greedy-global_fp32",
                  "mistral-7b/gsm8k/precision/bf16_vs_fp16/x-on-bs4-greedy-C_gated",
                  "r1-distill-qwen-1.5b/humaneval/batch_size/1_vs_8/fp16-on-x-greedy-none",
                  "qwen2.5-1.5b-instruct/gsm8k/intervention/none_vs_C_gated/bf16-on-bs8-greedy-x",
                  "tinyllama-1.1b-chat/math500/repeat/default_vs_2/bf16-on-bs1-greedy-none-repeat=x",
                  "tinyllama-1.1b-chat/gsm8k/precision/bf16_vs_fp16/x-on-bs1-greedy-consensus",
                  "olmoe-1b-7b/humaneval/intervention/C_gated_vs_fp32_oracle/fp16-on-bs1-greedy-x",
                  "tinyllama-1.1b-chat/gsm8k/deterministic/default_vs_on/bf16-on-bs1-greedy-none-deterministic=x",
                  "tinyllama-1.1b-chat/gsm8k/precision/bf16_vs_fp16/x-on-bs1-greedy-none-deterministic=on",
                  "tinyllama-1.1b-chat/gsm8k/attention/default_vs_flash_attention_2/fp16-on-bs1-greedy-C_gated-attention=x",
                  "llama3.2-3b-instruct/gsm8k_chat/intervention/none_vs_C_gated/bf16-on-bs1-greedy-x"],
        absent_pair_ids=["mistral-7b/gsm8k/batch_size/1_vs_8/bf16-on-x-greedy-sharpen",
                         "mistral-7b/gsm8k/batch_size/1_vs_4/bf16-on-x-greedy-none",
                         "mistral-7b/gsm8k/intervention/none_vs_global_fp32/bf16-on-bs8-greedy-x"]),
}


def test_every_shipped_config_has_a_hand_counted_plan():
    assert sorted(p.name for p in (REPO / "config").glob("*.yaml")) == sorted(SHIPPED_PLANS)


@pytest.mark.parametrize("name", sorted(SHIPPED_PLANS))
def test_shipped_configs_are_valid(name):
    expected = SHIPPED_PLANS[name]
    c = cfg.load(REPO / "config" / name)
    cells = expand_cells(c)
    pairs = expand_pairs(c, cells)
    assert len(cells) == len({cell.id for cell in cells}) == expected["cells"]
    by_axis: dict[str, int] = {}
    for pair in pairs:
        by_axis[pair.axis] = by_axis.get(pair.axis, 0) + 1
    assert by_axis == expected["pairs"]
    assert len(pairs) == sum(expected["pairs"].values())
    cell_ids, pair_ids = {cell.id for cell in cells}, {pair.id for pair in pairs}
    assert set(expected["cell_ids"]) <= cell_ids
    assert not set(expected["absent_cell_ids"]) & cell_ids
    assert set(expected["pair_ids"]) <= pair_ids
    assert not set(expected["absent_pair_ids"]) & pair_ids


def test_a_probe_can_be_restricted_to_some_models_and_benchmarks():
    c = copy.deepcopy(BASE)
    c["models"]["m2"] = {"source": "random", "architecture": "mistral"}
    c["benchmarks"]["other"] = {"kind": "arithmetic", "n": 2}
    c["probes"] = {"kv_cache": {"prompts": 1, "benchmarks": ["other"]},
                   "precision": {"prompts": 1, "models": ["m2"]}}
    from tokenflip.study.plan import probe_job, probe_targets

    targets = probe_targets(cfg.validate(c))
    assert targets == [("kv_cache", "m1", "other"), ("kv_cache", "m2", "other"),
                       ("precision", "m2", "arith"), ("precision", "m2", "other")]
    assert "benchmarks" not in probe_job(cfg.validate(c), "kv_cache", "m1", "other").options
    c["probes"]["kv_cache"]["benchmarks"] = ["nope"]
    with pytest.raises(cfg.ConfigError, match="probes.kv_cache.benchmarks: 'nope' is not defined under 'benchmarks'"):
        cfg.validate(c)


def test_the_schema_names_every_tiny_architecture():
    from tokenflip.models.prepare import TINY_ARCHITECTURES

    source = cfg.schema()["properties"]["models"]["additionalProperties"]
    assert "olmoe" in json.dumps(source) and all(f'"{arch}"' in json.dumps(source) for arch in TINY_ARCHITECTURES)


def test_the_paper_configs_probe_the_models_the_papers_traced_from_their_diverged_prompts():
    """arXiv 2609.26621 traced TinyLlama (App. II) and Qwen2.5-3B (App. III) on the three
    benchmarks its traceback replicates on; each probe job chooses its prompts from the
    plain BF16-vs-FP16 pair of its model and benchmark. The KV-cache paper's probe explains
    cache on vs off at FP16 and FP32."""
    from tokenflip.study.plan import probe_job, probe_targets

    c = cfg.load(REPO / "config" / "paper-precision.yaml")
    targets = probe_targets(c)
    assert targets == [("precision", m, b) for m in ("tinyllama-1.1b-chat", "qwen2.5-3b-instruct")
                       for b in ("gsm8k", "humaneval", "mbpp")]
    for target in targets:
        assert probe_job(c, *target).explains == [f"{target[1]}/{target[2]}/precision/bf16_vs_fp16/x-on-bs1-greedy-none"]
    kv = cfg.load(REPO / "config" / "paper-kv-cache.yaml")
    assert probe_job(kv, "kv_cache", "gemma2-2b", "gsm8k").explains == [
        "gemma2-2b/gsm8k/cache/on_vs_off/fp16-x-bs1-greedy-none", "gemma2-2b/gsm8k/cache/on_vs_off/fp32-x-bs1-greedy-none"]


def test_a_comparison_can_be_restricted_to_some_models_and_benchmarks():
    """A benchmark whose prompts repeat another's (the default's cache-off arm) is left out
    of a comparison that names the other; a name that is not defined is refused."""
    c = copy.deepcopy(BASE)
    c["benchmarks"]["other"] = {"kind": "arithmetic", "n": 2}
    c["comparisons"] = [{"axis": "cache", "a": "on", "b": "off", "benchmarks": ["other"]}]
    pairs = expand_pairs(cfg.validate(c), expand_cells(cfg.validate(c)))
    assert pairs and {p.a.benchmark for p in pairs} == {"other"}
    c["comparisons"][0]["models"] = ["nope"]
    with pytest.raises(cfg.ConfigError, match=r"comparisons.0.models: 'nope' is not defined under 'models'"):
        cfg.validate(c)
