"""Live endpoints, for real: vLLM's own OpenAI server (from `.venv-vllm`) and llama.cpp's
server (llama-cpp-python's), each started once for this module on the default's prepared
SmolLM2-135M-Instruct, on 127.0.0.1; faults through a small fault-injecting proxy in front
of the real llama.cpp server. No mock on any success path.

- a vLLM endpoint cell at one request in flight is the vLLM offline cell with the same
  arguments, bitwise (ids and every step's raw logits);
- a Snakemake study of the endpoint under load: concurrency, background load, repeats,
  logprobs off and a transformers reference, each with what the client measured;
- llama.cpp's server decodes greedy with a repetition penalty it does not report: a
  finding naming the steps, checked against the scores it returned;
- faults: retried with bounded backoff then failed naming the request, nothing written;
  a server that is down or serves another model is refused before any job.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import SMOLLM2, run_snakemake, write_yaml
from tokenflip import config as cfg
from tokenflip import storage
from tokenflip.cell import run_cell
from tokenflip.engines import LLAMA_CPP, VLLM, unavailable
from tokenflip.engines.endpoint_client import EndpointError
from tokenflip.jobs import Cell
from tokenflip.plan import cell_job
from tokenflip.serve import Server, free_port, gguf_of, llama_cpp_command, vllm_command, vllm_env

# In CI the environments are built by `make test`: there a missing one is a failure.
pytestmark = pytest.mark.skipif((unavailable(VLLM) or unavailable(LLAMA_CPP)) is not None and not os.environ.get("CI"),
                                reason=f"{unavailable(VLLM) or unavailable(LLAMA_CPP)}")

K = 8
BENCH = {"kind": "onestep", "n": 4, "seed": 0, "shots": 3, "max_new_tokens": 8}
NAME = "smollm2"


@pytest.fixture(scope="module")
def servers(prepared_models, tmp_path_factory):
    """vLLM's server (bf16, raw logits, no prefix cache: what the offline cell runs) and
    llama.cpp's, both up for the whole module."""
    model_dir = prepared_models("smollm2")
    logs = tmp_path_factory.mktemp("servers")
    llama_port, vllm_port = free_port(), free_port()
    llama = Server(llama_cpp_command(gguf_of(SMOLLM2), llama_port, NAME), f"http://127.0.0.1:{llama_port}/v1", NAME,
                   logs / "llama.log").start(timeout=300)
    try:
        vllm = Server(vllm_command(model_dir, vllm_port, NAME, "bf16", max_logprobs=K,
                                   extra=("--no-enable-prefix-caching", "--max-model-len", "2048")),
                      f"http://127.0.0.1:{vllm_port}/v1", NAME, logs / "vllm.log", vllm_env()).start(timeout=900)
    except BaseException:
        llama.stop()
        raise
    yield {"vllm": vllm.url, "llama": llama.url, "model_dir": model_dir, "logs": logs}
    vllm.stop()
    llama.stop()


def _config(servers, **endpoints) -> dict:
    study = {
        "run": "endpoint",
        "models": {"smollm2": SMOLLM2},
        "benchmarks": {"steps": dict(BENCH)},
        "generation": {"record_top_k": K, "device": "cpu"},
        "endpoints": {"served": {"url": servers["vllm"], "model": NAME, "server": "vllm", "scores": "raw_logits"},
                      "llama": {"url": servers["llama"], "model": NAME, "server": "llama.cpp", "retries": 4},
                      **endpoints},
        "loads": {"busy": {"requests": 2, "prompt_tokens": 64, "max_tokens": 16}},
        "grids": [{"precision": ["bf16"], "cache": ["on"], "batch_size": [1], "engine": ["served"]}],
        "comparisons": [],
    }
    return cfg.validate(study, source="endpoint.yaml", check_data=False)


def _cell(config, servers, tmp_path, engine: str, **axes):
    cell = Cell("smollm2", "steps", "bf16", "on", 1, "greedy", "none", engine=engine, **axes)
    path = tmp_path / f"{cell.id.rsplit('/', 1)[-1]}.parquet"
    run_cell(cell_job(config, cell), servers["model_dir"], path, progress=False)
    return storage.read_cell(path)


# --- Token level: the endpoint cell is the engine's own output --------------------------

def test_a_vllm_endpoint_cell_is_the_offline_vllm_cell_bitwise(servers, tmp_path):
    """At one request in flight, vLLM over HTTP (prompts as ids, ids and raw logits back)
    gives the offline engine's tokens and every step's top-k raw logits, bit for bit."""
    config = _config(servers)
    online, online_meta = _cell(config, servers, tmp_path, "served")
    offline, offline_meta = _cell(config, servers, tmp_path, "vllm", concurrency="1")
    assert online_meta["engine"]["prompts_as"] == "ids" and online_meta["engine"]["ids_from"] == ["server"]
    assert online_meta["engine"]["scores"] == "raw_logits"
    assert online_meta["engine"]["server"]["version"]["version"] == "0.32.0"
    assert online_meta["engine"]["server"]["system_fingerprints"][0].startswith("vllm-0.32.0")
    assert online_meta["traffic"]["most_in_flight"] == 1
    for column in ("prompt_ids", "token_ids", "top_ids"):
        assert online.column(column).to_pylist() == offline.column(column).to_pylist(), column
    a = np.asarray(online.column("top_logits").to_pylist(), dtype=object)
    b = np.asarray(offline.column("top_logits").to_pylist(), dtype=object)
    for row_a, row_b in zip(a, b):
        assert np.array_equal(np.asarray(row_a, dtype=np.float32), np.asarray(row_b, dtype=np.float32))
    assert online_meta["token_stream_sha256"] == offline_meta["token_stream_sha256"]
    assert online_meta["logits_sha256"] == offline_meta["logits_sha256"]


# --- What a server did that no client sees --------------------------------------------

def test_llama_cpp_servers_repetition_penalty_is_a_finding_naming_its_steps(servers, tmp_path):
    """llama-cpp-python's server applies `repeat_penalty` 1.1 after the logprobs it reports:
    at temperature 0 it picks tokens below its own top score. Each such step is named, and
    each named step is one where the chosen token's score is below the top one."""
    config = _config(servers)
    # Arithmetic prompts: the penalty acts within 32 tokens (at steps 19-32 of every prompt
    # on this server; the word problems need longer completions).
    config["benchmarks"]["steps"] = {"kind": "arithmetic", "n": 2, "seed": 0, "max_new_tokens": 32, "stop": []}
    config = cfg.validate(config, source="endpoint.yaml", check_data=False)
    table, meta = _cell(config, servers, tmp_path, "llama")
    found = meta["findings"]["not_top_choice"]
    assert found["prompts"] >= 1, found
    assert meta["engine"]["ids_from"] == ["text"] and meta["findings"]["ids_not_spelling_text"] == []
    # Exactly the steps where the chosen token is not the first of the scores it returned
    # (best first), in every prompt.
    for row in table.to_pylist():
        below = [step for step, (token, top) in enumerate(zip(row["token_ids"], row["top_ids"])) if token != top[0]]
        assert found["steps"].get(row["prompt_id"], []) == below, row["prompt_id"]


# --- Faults: retried, then failed naming the request; nothing written ---------------------

@pytest.fixture
def proxy(servers):
    from fault_proxy import FaultProxy

    p = FaultProxy(servers["llama"].rsplit("/v1", 1)[0])
    yield p
    p.close()


def test_transient_faults_are_retried_and_the_cell_is_whole(servers, proxy, tmp_path):
    config = _config(servers, faulty={"url": proxy.url, "model": NAME, "server": "llama.cpp", "retries": 4})
    proxy.script = [("status", 503), ("status", 429, 0), "malformed", "drop"]
    table, meta = _cell(config, servers, tmp_path, "faulty")
    assert table.num_rows == BENCH["n"]
    assert meta["traffic"]["attempts"] == BENCH["n"] + 4
    clean, _ = _cell(config, servers, tmp_path, "llama")
    assert table.column("token_ids").to_pylist() == clean.column("token_ids").to_pylist()


@pytest.mark.parametrize("script,retries,timeout,message", [
    ([("status", 503)] * 3, 2, 300, "failed 3 time(s) (1 + retries 2); last: status 503"),
    ([("status", 400)], 4, 300, "answered 400"),
    (["drop"] * 2, 1, 300, "connection failed"),
    ([("delay", 3)], 0, 1, "no answer within"),
])
def test_a_fault_that_persists_fails_the_cell_naming_the_request(servers, proxy, tmp_path, script, retries, timeout,
                                                                 message):
    config = _config(servers, faulty={"url": proxy.url, "model": NAME, "server": "llama.cpp", "retries": retries,
                                      "timeout_s": timeout})
    proxy.script = list(script)
    cell = Cell("smollm2", "steps", "bf16", "on", 1, "greedy", "none", engine="faulty")
    out = tmp_path / "cell.parquet"
    with pytest.raises(EndpointError) as err:
        run_cell(cell_job(config, cell), servers["model_dir"], out, progress=False)
    assert message in str(err.value) and "endpoint 'faulty', prompt " in str(err.value) and proxy.url in str(err.value)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_server_that_is_down_or_serves_another_model_is_refused_before_any_job(servers, tmp_path):
    from tokenflip.engines.endpoint_server import problem

    down = f"http://127.0.0.1:{free_port()}/v1"
    assert "nothing answers at " + down + "/models" in problem("prod", {"url": down, "model": NAME})
    other = problem("prod", {"url": servers["llama"], "model": "llama-70b"})
    assert f"does not serve model 'llama-70b': {servers['llama']}/models lists ['smollm2']" in other
    study = _config(servers)
    study["endpoints"]["served"]["url"] = down
    (tmp_path / "config.yaml").write_text(json.dumps(study))
    proc = run_snakemake(tmp_path, tmp_path / "config.yaml", check=False, timeout=600)
    assert proc.returncode != 0
    assert f"endpoint 'served' ({down}): nothing answers" in proc.stdout + proc.stderr
    assert not (tmp_path / "results" / "endpoint" / "cells").exists()


# --- A study of the endpoint under load, through Snakemake ------------------------------

STUDY_GRIDS = [
    {"precision": ["bf16"], "cache": ["on"], "batch_size": [1], "engine": ["served"],
     "concurrency": ["default", 4], "repeat": ["default", 2]},
    {"precision": ["bf16"], "cache": ["on"], "batch_size": [1], "engine": ["served"], "load": ["busy"]},
    {"precision": ["bf16"], "cache": ["on"], "batch_size": [1], "engine": ["served"], "logprobs": ["off"]},
    {"precision": ["bf16"], "cache": ["on"], "batch_size": [1], "engine": ["transformers", "llama"]},
]
STUDY_COMPARISONS = [
    {"axis": "concurrency", "a": "default", "b": 4}, {"axis": "repeat", "a": "default", "b": 2},
    {"axis": "load", "a": "none", "b": "busy"}, {"axis": "logprobs", "a": "on", "b": "off"},
    {"axis": "engine", "a": "transformers", "b": "served"}, {"axis": "engine", "a": "transformers", "b": "llama"},
]


@pytest.fixture(scope="module")
def study(servers, tmp_path_factory):
    root = tmp_path_factory.mktemp("endpoint-study")
    config = copy.deepcopy(_config(servers))
    config = {key: config[key] for key in ("run", "models", "benchmarks", "generation", "endpoints", "loads")}
    config["benchmarks"]["steps"]["n"] = 8
    config.update(grids=STUDY_GRIDS, comparisons=STUDY_COMPARISONS)
    # The module's prepared model, where the pipeline keeps it (prepared once per session).
    shutil.copytree(servers["model_dir"], root / "resources" / "models" / "smollm2")
    run_snakemake(root, write_yaml(root / "config.yaml", config), timeout=1800)
    import pandas as pd

    pairs = pd.read_parquet(root / "results" / "endpoint" / "summary" / "pairs.parquet")
    return root, pairs


def _meta(root, name):
    return storage.read_cell(root / "results" / "endpoint" / "cells" / "smollm2" / "steps" / f"{name}.parquet")[1]


def test_the_client_holds_the_load_it_claims(study):
    root, _ = study
    busy = _meta(root, "bf16-on-bs1-greedy-none-engine=served-concurrency=4")["traffic"]
    assert busy["most_in_flight"] == 4 and busy["mean_in_flight"] > 3.0, busy
    assert busy["background"]["most_in_flight"] == 0
    loaded = _meta(root, "bf16-on-bs1-greedy-none-engine=served-load=busy")["traffic"]
    assert loaded["most_in_flight"] == 1 and loaded["background"]["most_in_flight"] == 2
    assert loaded["background"]["mean_in_flight"] > 1.5 and loaded["background_requests"] >= 2
    # the trace is what the summary was computed from: (seconds, own, background)
    assert max(own for _, own, _ in busy["trace"]) == 4


def test_every_comparison_of_the_study_is_made_and_logprobs_are_never_compared_with_nothing(study):
    root, pairs = study
    assert set(pairs["axis"]) == {"concurrency", "repeat", "load", "logprobs", "engine"}
    assert (pairs["status"] == "done").all(), pairs[["pair_id", "status", "error"]]
    off = pairs[pairs["axis"] == "logprobs"].iloc[0]
    assert np.isnan(off["max_abs_dlogit"])  # one side has no scores: no logit figure
    engine = pairs[pairs["axis"] == "engine"].iloc[0]
    assert not np.isnan(engine["max_abs_dlogit"])  # raw logits on both sides
    meta = _meta(root, "bf16-on-bs1-greedy-none-engine=served-logprobs=off")
    assert meta["engine"]["scores"] == "none" and "logprobs" not in meta["engine"]["request"]


def test_the_report_shows_the_endpoint_comparisons_side_by_side(study):
    root, _ = study
    html = (root / "reports" / "endpoint" / "index.html").read_text()
    for words in ("requests in flight", "background load", "logprobs requested", "served"):
        assert words in html, words
