"""Live endpoints, for real: llama.cpp's server (llama-cpp-python's), started once for this
module on the default's GGUF, on 127.0.0.1; faults through a small fault-injecting proxy in
front of it. No mock on any success path. (vLLM's own OpenAI server is audited in
test_vllm.py, beside the offline cells it must equal.)

- llama.cpp's server decodes greedy with a repetition penalty it does not report: a
  finding naming the steps, checked against the scores it returned;
- faults: retried with bounded backoff then failed naming the request, nothing written;
  a server that is down or serves another model is refused before any job;
- `tokenflip audit` of that server, end to end through Snakemake.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import SMOLLM2, run_snakemake
from tokenflip.core import storage
from tokenflip.core.specs import Cell
from tokenflip.run.cell import run_cell
from tokenflip.run.engines import LLAMA_CPP, unavailable
from tokenflip.run.engines.endpoint.client import EndpointError
from tokenflip.run.engines.local_servers import Server, free_port, gguf_of, llama_cpp_command
from tokenflip.study import config as cfg
from tokenflip.study.plan import cell_job

# In CI the environment is built by `make test`: there a missing one is a failure.
pytestmark = pytest.mark.skipif(unavailable(LLAMA_CPP) is not None and not os.environ.get("CI"),
                                reason=f"{unavailable(LLAMA_CPP)}")

K = 8
BENCH = {"kind": "onestep", "n": 4, "seed": 0, "shots": 3, "max_new_tokens": 8}
# What a fault needs: the prompts its check reads (one; two where an answer is judged
# against the others), each short, so that each case is a few seconds of the server's time.
def short_bench(n: int = 1) -> dict:
    return {"steps": {"kind": "onestep", "n": n, "seed": 0, "shots": 0, "max_new_tokens": 8}}
NAME = "smollm2"
SECOND_KEY = "second-deployment-key"


@pytest.fixture(scope="module")
def servers(prepared_models, tmp_path_factory):
    """llama.cpp's server on the GGUF the prepared model comes from, up for the module, and a
    second deployment of it on two threads behind a key (what `audit --against` compares it
    with), started as `tokenflip serve llama.cpp --api-key-env` starts it."""
    model_dir = prepared_models("smollm2")
    logs = tmp_path_factory.mktemp("servers")
    started = []
    try:
        for key, threads, env in (("llama", 1, {}), ("llama_two_threads", 2, {"API_KEY": SECOND_KEY})):
            port = free_port()
            started.append(Server(llama_cpp_command(gguf_of(SMOLLM2), port, NAME, threads=threads),
                                  f"http://127.0.0.1:{port}/v1", NAME, logs / f"{key}.log", env,
                                  api_key=env.get("API_KEY")).start(timeout=300))
        yield {"llama": started[0].url, "llama_two_threads": started[1].url, "model_dir": model_dir}
    finally:
        for server in started:
            server.stop()


def _config(servers, benchmarks=None, **endpoints) -> dict:
    study = {
        "run": "endpoint",
        "models": {"smollm2": SMOLLM2},
        "benchmarks": benchmarks or {"steps": dict(BENCH)},
        "generation": {"record_top_k": K, "device": "cpu"},
        "endpoints": {"llama": {"url": servers["llama"], "model": NAME, "server": "llama.cpp", "retries": 4},
                      **endpoints},
        "loads": {"busy": {"requests": 2, "prompt_tokens": 64, "max_tokens": 16}},
        "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "engine": ["llama"]}],
        "comparisons": [],
    }
    return cfg.validate(study, source="endpoint.yaml", check_data=False)


def _cell(config, servers, tmp_path, engine: str, **axes):
    cell = Cell("smollm2", "steps", "fp32", "on", 1, "greedy", "none", engine=engine, **axes)
    path = tmp_path / f"{cell.id.rsplit('/', 1)[-1]}.parquet"
    run_cell(cell_job(config, cell), servers["model_dir"], path, progress=False)
    return storage.read_cell(path)


# --- What a server did that no client sees --------------------------------------------

def test_llama_cpp_servers_repetition_penalty_is_asked_off_and_where_asked_for_is_a_finding(servers, tmp_path):
    """llama-cpp-python's server applies `repeat_penalty` 1.1 after the logprobs it reports:
    at temperature 0 it picks tokens below its own top score. tokenflip asks it for none, and
    then the server chooses its top token at every step; asked for it (`extra_body`), each
    step it chose otherwise is named, and each named step is one where the chosen token's score
    is below the top one."""
    config = _config(servers, penalised={"url": servers["llama"], "model": NAME, "server": "llama.cpp",
                                         "extra_body": {"repeat_penalty": 1.1}})
    # Arithmetic prompts: the penalty acts within 32 tokens (at steps 19-32 of every prompt
    # on this server; the word problems need longer completions).
    config["benchmarks"]["steps"] = {"kind": "arithmetic", "n": 2, "seed": 0, "max_new_tokens": 32, "stop": []}
    config = cfg.validate(config, source="endpoint.yaml", check_data=False)
    _, neutral = _cell(config, servers, tmp_path, "llama")
    assert neutral["engine"]["request"]["repeat_penalty"] == 1.0
    assert neutral["findings"]["not_top_choice"]["prompts"] == 0, neutral["findings"]["not_top_choice"]
    table, meta = _cell(config, servers, tmp_path, "penalised")
    assert meta["engine"]["request"]["repeat_penalty"] == 1.1
    found = meta["findings"]["not_top_choice"]
    assert found["prompts"] >= 1, found
    assert meta["engine"]["ids_from"] == ["text"] and meta["findings"]["ids_not_spelling_text"] == []
    # Exactly the steps where the chosen token is not the first of the scores it returned
    # (best first), in every prompt.
    for row in table.to_pylist():
        below = [step for step, (token, top) in enumerate(zip(row["token_ids"], row["top_ids"])) if token != top[0]]
        assert found["steps"].get(row["prompt_id"], []) == below, row["prompt_id"]
    # Against tokenflip's own loop on the same weights, a parting where the server chose below
    # its top is labelled `unexplained` (read from its ranks: its logprobs hold no logit
    # magnitude), any other is an exact tie or has no comparable logits.
    from tokenflip.analysis.compare import compare_files
    from tokenflip.core.specs import Pair

    cells = {e: Cell("smollm2", "steps", "fp32", "on", 1, "greedy", "none", engine=e)
             for e in ("transformers", "penalised")}
    _cell(config, servers, tmp_path, "transformers")
    paths = {e: tmp_path / f"{c.id.rsplit('/', 1)[-1]}.parquet" for e, c in cells.items()}
    compare_files(Pair("engine", cells["transformers"], cells["penalised"]), paths["transformers"],
                  paths["penalised"], tmp_path / "pair.parquet")
    served = {r["prompt_id"]: r for r in table.to_pylist()}
    parted = [r for r in storage.read_table(tmp_path / "pair.parquet")[0].to_pylist() if not r["identical"]]
    assert parted
    for row in parted:
        step, mine = row["first_div_step"], served[row["prompt_id"]]
        chose_below = step < len(mine["token_ids"]) and mine["token_ids"][step] != mine["top_ids"][step][0]
        assert (row["cause"] == "unexplained") == chose_below, row
        assert row["cause"] in ("unexplained", "exact tie", "no logits", "ended"), row
    # The verdict over such a cell names the server's default beside its own words, unchanged.
    from tokenflip.analysis.summary import with_server_defaults

    ids = {e: c.id for e, c in cells.items()}
    words = "changes outputs: 2 of 2 prompts parted"
    (row,) = with_server_defaults([{"cell_a": ids["transformers"], "cell_b": ids["penalised"], "verdict_words": words}],
                                  {ids["transformers"]: {}, ids["penalised"]: meta, "neutral": neutral})
    assert row["server_defaults"] == (f"{ids['penalised']} (llama.cpp) chose a token below its own top score at "
                                      f"temperature 0 in {found['prompts']} of 2 prompts")
    assert row["verdict_words"].startswith(words + " — server defaults differ: " + row["server_defaults"])
    (plain,) = with_server_defaults([{"cell_a": ids["transformers"], "cell_b": "neutral", "verdict_words": words}],
                                    {"neutral": neutral})
    assert plain["server_defaults"] is None and plain["verdict_words"] == words
    # on this server both arithmetic prompts part at step 19, where the penalty first acts
    assert any(r["cause"] == "unexplained" for r in parted)


# --- Faults: retried, then failed naming the request; nothing written ---------------------

@pytest.fixture
def proxy(servers):
    from fault_proxy import FaultProxy

    p = FaultProxy(servers["llama"].rsplit("/v1", 1)[0])
    yield p
    p.close()


def test_transient_faults_are_retried_and_the_cell_is_whole(servers, proxy, tmp_path):
    config = _config(servers, short_bench(4), faulty={"url": proxy.url, "model": NAME, "server": "llama.cpp",
                                                      "retries": 4})
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
    cell = Cell("smollm2", "steps", "fp32", "on", 1, "greedy", "none", engine="faulty")
    out = tmp_path / "cell.parquet"
    with pytest.raises(EndpointError) as err:
        run_cell(cell_job(config, cell), servers["model_dir"], out, progress=False)
    assert message in str(err.value) and "endpoint 'faulty', prompt " in str(err.value) and proxy.url in str(err.value)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _choice(answer):
    return answer["choices"][0]


def _set(path, value):
    """A rewrite that sets one field of the first choice (`path`: keys under it)."""
    def rewrite(answer):
        target = _choice(answer)
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value(target.get(path[-1])) if callable(value) else value
        return answer
    return rewrite


HOSTILE_ANSWERS = {
    "an id beyond the vocabulary": (_set(["token_ids"], [65535]), "token id 65535 at step 0, not an integer of "
                                                                  "the vocabulary (0 to 49151)"),
    "an id of 10^12": (_set(["token_ids"], [10 ** 12]), "token id 1000000000000 at step 0"),
    "a negative id": (_set(["token_ids"], [-5]), "token id -5 at step 0"),
    "an id as a string": (_set(["token_ids"], ["5"]), "token id '5' at step 0"),
    "an id as a float": (_set(["token_ids"], [1.5]), "token id 1.5 at step 0"),
    "an id as true": (_set(["token_ids"], [True]), "token id True at step 0"),
    "more tokens than asked": (_set(["token_ids"], [5] * 9), "9 tokens to a request for at most 8"),
    "choice index 1": (_set(["index"], 1), "choice index 1 to a request for choice 0"),
    "two choices": (lambda a: {**a, "choices": [_choice(a), _choice(a)]}, "2 choices to a request for one"),
    "another model": (lambda a: {**a, "model": "other-model"}, "as model 'other-model', not the 'smollm2' asked for"),
    "a lone surrogate": (_set(["text"], "\ud800"), "a lone surrogate"),
    "a text too long": (_set(["text"], "a" * 9000), "a string of 9,000 characters (at most 8,192)"),
    "a logprob as text": (_set(["logprobs", "token_logprobs"], lambda v: ["x", *v[1:]]), "step 0's logprob 'x'"),
    "too many alternatives": (_set(["logprobs", "top_logprobs"],
                                   lambda v: [{f"t{i}": -1.0 for i in range(K + 2)}, *v[1:]]),
                              f"{K + 2} alternatives at step 0 to a request for {K}"),
    "malformed logprobs": (_set(["logprobs"], "x"), "logprobs that are not an object"),
}


# Answers that are well-formed each on their own but say what no generation can (a stop
# with no token; scores asked for and none sent), and a server that echoes the key it was
# sent: one line naming the request, nothing written, the key in no message.
def _stopped_without_tokens(answer):
    choice = _choice(answer)
    choice.update(token_ids=[], text="", finish_reason="stop", logprobs=None)
    return answer


QUIET_HOSTILE_ANSWERS = {
    "ids_empty_stop": (("rewrite", _stopped_without_tokens), "stopped with no token"),
    "lp_missing": (("rewrite", _set(["logprobs"], None)), "answered no logprobs, which the cell asked for"),
    "echo_auth": ("echo-auth", "the API key it was sent"),
}


@pytest.mark.parametrize("case", list(QUIET_HOSTILE_ANSWERS))
def test_a_quietly_hostile_answer_is_refused_in_one_line(servers, proxy, tmp_path, monkeypatch, case):
    fault, message = QUIET_HOSTILE_ANSWERS[case]
    key = "sk-tfcanary-8f1d2c9e7a6b5d4c3b2a"
    monkeypatch.setenv("FAULTY_API_KEY", key)
    config = _config(servers, short_bench(2), faulty={"url": proxy.url, "model": NAME, "server": "llama.cpp",
                                                      "retries": 0, "api_key_env": "FAULTY_API_KEY"})
    proxy.script = [fault]
    cell = Cell("smollm2", "steps", "fp32", "on", 1, "greedy", "none", engine="faulty")
    out = tmp_path / "cell.parquet"
    with pytest.raises(EndpointError) as err:
        run_cell(cell_job(config, cell), servers["model_dir"], out, progress=False)
    said = str(err.value)
    assert message in said and "endpoint 'faulty', prompt " in said and "\n" not in said, said
    assert "tfcanary" not in said and not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", list(HOSTILE_ANSWERS))
def test_an_answer_no_server_should_give_fails_the_cell_naming_the_request(servers, proxy, tmp_path, case):
    rewrite, message = HOSTILE_ANSWERS[case]
    config = _config(servers, short_bench(), faulty={"url": proxy.url, "model": NAME, "server": "llama.cpp",
                                                     "retries": 0})
    proxy.script = [("rewrite", rewrite)]
    cell = Cell("smollm2", "steps", "fp32", "on", 1, "greedy", "none", engine="faulty")
    out = tmp_path / "cell.parquet"
    with pytest.raises(EndpointError) as err:
        run_cell(cell_job(config, cell), servers["model_dir"], out, progress=False)
    said = str(err.value)
    assert message in said and "endpoint 'faulty', prompt " in said and f"{proxy.url} answered " in said, said
    assert said.endswith("nothing of this cell is recorded") and "\n" not in said
    assert not out.exists() and list(tmp_path.iterdir()) == []


# The bound each case tests decides it alone: a byte bound gets a time bound no loaded
# machine reaches first (60 s), the time bound a body that never ends.
@pytest.mark.parametrize("fault, timeout, message", [
    (("trickle", 0.5), 2, "no answer within timeout_s 2 (the whole answer, not each read)"),
    (("huge", 200 << 20), 60, "answered too much: the answer grew past 1,572,864 bytes"),
    (("gzip", 200 << 20), 60, "answered too much: the answer grew past 1,572,864 bytes"),
    (("redirect", "http://127.0.0.1:9/v1/completions"), 2, "answered 307, a redirect to 'http://127.0.0.1:9/v1/"),
])
def test_a_request_is_bounded_in_time_and_bytes_and_never_redirected(servers, proxy, tmp_path, fault, timeout,
                                                                      message):
    import resource
    import time

    config = _config(servers, faulty={"url": proxy.url, "model": NAME, "server": "llama.cpp", "retries": 0,
                                      "timeout_s": timeout})
    proxy.script = [fault]
    cell = Cell("smollm2", "steps", "fp32", "on", 1, "greedy", "none", engine="faulty")
    out = tmp_path / "cell.parquet"
    rss, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    with pytest.raises(EndpointError) as err:
        run_cell(cell_job(config, cell), servers["model_dir"], out, progress=False)
    assert time.perf_counter() - start < 120
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 300 * 1024  # KiB: 200 MB never held
    assert message in str(err.value) and proxy.url in str(err.value) and "prompt " in str(err.value), str(err.value)
    assert not out.exists()


def _without(key):
    def rewrite(answer):
        answer["choices"][0].pop(key)
        return answer
    return rewrite


CHAT_HOSTILE_ANSWERS = {
    "a choice without its message": (_without("message"), "a chat choice without its message"),
    "a lone surrogate in the message": (_set(["message", "content"], "\ud800"), "a lone surrogate"),
    "steps that are no list": (_set(["logprobs", "content"], "x"), "logprobs.content that is not a list of steps"),
    "alternatives that are no tokens": (_set(["logprobs", "content"], lambda v: [{**v[0], "top_logprobs": "x"}]),
                                        "a step's top_logprobs that are not a list of tokens"),
    "more steps than asked": (_set(["logprobs", "content"], lambda v: v[:1] * 9), "9 steps to a request for at most 8"),
}


@pytest.mark.parametrize("case", list(CHAT_HOSTILE_ANSWERS))
def test_a_chat_answer_no_server_should_give_fails_the_cell_naming_the_request(servers, proxy, tmp_path_factory,
                                                                               case):
    """The chat API's answers are checked as the completions API's are: each fault one line
    naming the endpoint, the prompt and the URL, and no cell written."""
    rewrite, message = CHAT_HOSTILE_ANSWERS[case]
    prompts = tmp_path_factory.mktemp("chat-prompts") / "traffic.jsonl"
    prompts.write_text(json.dumps({"id": "capital", "messages": [{"role": "user", "content": "Capital of France?"}]})
                       + "\n")
    config = _config(servers, faulty={"url": proxy.url, "model": NAME, "server": "llama.cpp", "retries": 0,
                                      "api": "chat"},
                     benchmarks={"traffic": {"kind": "prompts", "source": {"path": str(prompts)}, "max_new_tokens": 8}})
    proxy.script = [("rewrite", rewrite)]
    cell = Cell("smollm2", "traffic", "fp32", "on", 1, "greedy", "none", engine="faulty")
    out = tmp_path_factory.mktemp("chat-cell") / "cell.parquet"
    with pytest.raises(EndpointError) as err:
        run_cell(cell_job(config, cell), servers["model_dir"], out, progress=False)
    said = str(err.value)
    assert message in said and "endpoint 'faulty', prompt " in said and f"{proxy.url} answered " in said, said
    assert said.endswith("nothing of this cell is recorded") and "\n" not in said
    assert proxy.posts == 1 and not out.exists() and list(out.parent.iterdir()) == []


@pytest.mark.parametrize("fault, timeout, message", [
    (("trickle", 0.5), 2, "did not finish its answer within 2 s in all"),
    (("slow-headers", 0.5), 2, "did not finish its answer within 2 s in all"),
    (("huge", 200 << 20), 60, "answered more than 4,194,304 bytes: cut off"),
    (("gzip", 200 << 20), 60, "answered more than 4,194,304 bytes: cut off"),
    (("redirect", "http://127.0.0.1:9/extras/tokenize"), 2, "answered 307, a redirect to 'http://127.0.0.1:9/extras/"),
    (("rewrite", lambda answer: {"tokens": [-5, 1]}), 2, "answered no token ids for "),
    (("rewrite", lambda answer: {"tokens": [10 ** 12]}), 2, "answered no token ids for "),
    (("rewrite", lambda answer: {"tokens": ["5"]}), 2, "answered no token ids for "),
    (("rewrite", lambda answer: answer["tokens"]), 2, "answered no token ids for "),  # a bare list
])
def test_a_servers_tokenizer_routes_are_bounded_and_their_ids_checked(servers, proxy, fault, timeout, message):
    """`source: server` asks the server's tokenize routes: each answer within its time, bytes
    and origin, its ids integers of a vocabulary, else refused in words naming the route."""
    import resource
    import time

    from tokenflip.models.served_tokenizer import ServedTokenizerError, connect

    proxy.on = {"/extras/tokenize": fault}
    rss, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    with pytest.raises(ServedTokenizerError) as err:
        connect({"url": proxy.url, "model": NAME, "server": "llama.cpp", "timeout_s": timeout})
    assert time.perf_counter() - start < 120
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 300 * 1024  # KiB: 200 MB never held
    said = str(err.value)
    assert f"{proxy.url.rsplit('/v1', 1)[0]}/extras/tokenize" in said and message in said and "\n" not in said, said


@pytest.mark.parametrize("route, rewrite, message", [
    ("/extras/tokenize", lambda answer: {"tokens": [1, 2, 3]}, "do not decode back to it"),
    ("/extras/detokenize", lambda answer: {"text": "something else"}, "do not decode back to it"),
    ("/extras/tokenize", lambda answer: {"tokens": [2 ** 31 - 1]}, "answered id 2147483647 for 'Name a prime "
                                                                    "number.', past the 49,152 tokens"),
])
def test_a_served_tokenizer_is_checked_on_every_prompt_it_encodes(servers, proxy, route, rewrite, message):
    """A server whose tokenize or detokenize route answers otherwise for a prompt than for the
    probe texts it was prepared from: the prompt is refused, naming the route."""
    from tokenflip.models.served_tokenizer import ServedTokenizer, ServedTokenizerError, connect

    prepared = connect({"url": servers["llama"], "model": NAME, "server": "llama.cpp"})
    info = {**prepared.info, "vocab_size": 49152}
    honest = ServedTokenizer({"url": proxy.url, "model": NAME, "server": "llama.cpp"}, info)
    assert honest.encode("Name a prime number.", False) == prepared.encode("Name a prime number.", False)
    proxy.on = {route: ("rewrite", rewrite)}
    served = ServedTokenizer({"url": proxy.url, "model": NAME, "server": "llama.cpp"}, info)
    with pytest.raises(ServedTokenizerError) as err:
        served.encode("Name a prime number.", False)
    said = str(err.value)
    assert message in said and "/extras/tokenize" in said and "\n" not in said, said


def test_a_model_list_past_its_bounds_is_nothing_answering_before_any_job(servers, proxy):
    from tokenflip.run.engines.endpoint.server import problem

    spec = {"url": proxy.url, "model": NAME, "server": "llama.cpp"}
    proxy.on = {"/v1/models": ("gzip", 200 << 20)}
    assert problem("faulty", spec) == (f"endpoint 'faulty' ({proxy.url}): nothing answers at {proxy.url}/models "
                                       f"(BoundedHTTPError: '{proxy.url}/models answered more than 4,194,304 bytes: "
                                       f"cut off')")
    proxy.on = {"/v1/models": ("redirect", "http://127.0.0.1:9/v1/models")}
    assert "answered 307, a redirect to 'http://127.0.0.1:9/v1/models': not followed" in problem("faulty", spec)


def test_a_server_that_is_down_or_serves_another_model_is_refused_before_any_job(servers, tmp_path):
    from tokenflip.run.engines.endpoint.server import problem

    down = f"http://127.0.0.1:{free_port()}/v1"
    assert "nothing answers at " + down + "/models" in problem("prod", {"url": down, "model": NAME})
    other = problem("prod", {"url": servers["llama"], "model": "llama-70b"})
    assert f"does not serve model 'llama-70b': {servers['llama']}/models lists 'smollm2'" in other
    study = _config(servers)
    study["endpoints"]["llama"]["url"] = down
    (tmp_path / "config.yaml").write_text(json.dumps(study))
    proc = run_snakemake(tmp_path, tmp_path / "config.yaml", check=False, timeout=600)
    assert proc.returncode != 0
    assert f"endpoint 'llama' ({down}): nothing answers" in proc.stdout + proc.stderr
    assert not (tmp_path / "results" / "endpoint" / "cells").exists()


# --- Whose tokenizer: refused before any job when it is not the served model's ------------

def test_a_tokenizer_that_is_not_the_served_models_is_refused_naming_both(servers, proxy, tmp_path):
    """The server's own ids of the probe text (llama-cpp-python's /extras/tokenize) against
    the local ones; behind a proxy without tokenize routes, the tokens it returns against the
    local vocabulary. The embedded tokenizer passes both, another family's fails both."""
    from conftest import local_tokenizer
    from tokenflip.run.engines.endpoint.server import tokenizer_of
    from tokenflip.run.engines.endpoint.tokenizer import mismatch

    embedded = tokenizer_of(SMOLLM2, str(servers["model_dir"]))
    other = tokenizer_of({"source": "hf", "id": str(local_tokenizer(tmp_path / "other"))})
    spec = {"url": servers["llama"], "model": NAME, "server": "llama.cpp"}
    assert mismatch(spec, embedded, "model 'smollm2'", "prod") is None
    refused = mismatch(spec, other, "model 'other' (a BPE of 400 ids)", "prod")
    assert refused.startswith(f"endpoint 'prod' ({servers['llama']}, model {NAME!r}) does not use the tokenizer of "
                              f"model 'other' (a BPE of 400 ids): the probe text ")
    assert f"at {servers['llama'].rsplit('/v1', 1)[0]}/extras/tokenize but [" in refused and "--tokenizer" in refused

    proxy.missing = {"/extras/tokenize", "/tokenize"}
    behind = {"url": proxy.url, "model": NAME, "server": "openai", "timeout_s": 60, "retries": 0}
    assert mismatch(behind, embedded, "model 'smollm2'", "gateway") is None
    refused = mismatch(behind, other, "model 'other'", "gateway")
    assert f"endpoint 'gateway' ({proxy.url}, model {NAME!r}) does not use the tokenizer of model 'other': " in refused
    assert "tokens it returned are no token of model 'other'" in refused and "no tokenize route answered" in refused


def test_an_endpoint_cell_of_a_tokenizer_only_model_records_its_digests(servers, tmp_path):
    """The served model's tokenizer without its weights: the cell's tokens are those of the
    fully prepared model, and it records the same tokenizer digest, no weights digest."""
    from tokenflip.models.prepare import prepare, read_manifest

    only = tmp_path / "models" / "smollm2"
    prepare({**SMOLLM2, "tokenizer_only": True}, only)
    assert not list(only.glob("*.safetensors"))
    config = _config(servers)
    config["models"]["smollm2"] = {**SMOLLM2, "tokenizer_only": True}
    config = cfg.validate(config, source="endpoint.yaml", check_data=False)
    cell = Cell("smollm2", "steps", "fp32", "on", 1, "greedy", "none", engine="llama")
    run_cell(cell_job(config, cell), only, tmp_path / "only.parquet", progress=False)
    table, meta = storage.read_cell(tmp_path / "only.parquet")
    full, _ = _cell(_config(servers), servers, tmp_path, "llama")
    assert table.column("token_ids").to_pylist() == full.column("token_ids").to_pylist()
    assert meta["model"]["tokenizer_only"] is True and meta["model"]["weights_sha256"] is None
    assert meta["model"]["tokenizer_sha256"] == read_manifest(servers["model_dir"])["tokenizer_sha256"]


def test_the_servers_own_tokenizer_is_the_embedded_one_over_http(servers, proxy, tmp_path):
    """`source: server`: llama-cpp-python's /extras/tokenize and /extras/detokenize stand for
    the served model's tokenizer. Its ids are the embedded tokenizer's on texts of several
    scripts, and decode back to them; a token's id comes from its text; the end-of-sequence
    token is the one the entry states (the server names none); a server without a route
    back from ids to text is refused, naming each route it tried."""
    from tokenflip.models.served_tokenizer import ServedTokenizerError, connect
    from tokenflip.run.engines.endpoint.server import tokenizer_of

    embedded = tokenizer_of(SMOLLM2, str(servers["model_dir"]))
    served = connect({"url": servers["llama"], "model": NAME, "server": "llama.cpp"}, eos_token="<|im_end|>")
    for text in ("Hello world", "  two leading spaces", "Zürich 東京 🙂 — naïve", "def f(x):\n\treturn x ** 2",
                 "12,345.678", "<|im_end|> after a special token"):
        ids = served.encode(text, add_special_tokens=False)
        assert ids == embedded(text, add_special_tokens=False)["input_ids"], text
        assert served.decode(ids, skip_special_tokens=True) == embedded.decode(ids, skip_special_tokens=True), text
    assert served.id_of_text(" the") == 260 and served.id_of_text("Zürich") == -1  # one token; three
    assert (served.eos_token_id, served.info["eos_from"]) == (2, "the model entry's eos_token")
    assert embedded.eos_token_id == 2
    assert served.info["family"] == "llama-cpp-python" and served.chat_template is None  # no chat route for a client
    assert connect({"url": servers["llama"], "model": NAME, "server": "llama.cpp"}).eos_token_id is None

    proxy.missing = {"/extras/detokenize", "/detokenize"}
    with pytest.raises(ServedTokenizerError) as err:
        connect({"url": proxy.url, "model": NAME, "server": "llama.cpp"})
    assert f"the server at {proxy.url} offers no tokenizer tokenflip can use (" in str(err.value)
    assert f"{proxy.url.rsplit('/v1', 1)[0]}/extras/tokenize: " in str(err.value) and "--tokenizer" in str(err.value)


def test_a_model_prepared_from_the_servers_tokenizer_decodes_as_the_embedded_one(servers, tmp_path):
    """A model of `source: server` is prepared with no file of the model (its server's routes,
    end-of-sequence id and the digest of its ids of fixed probe texts); its endpoint cell
    is the embedded tokenizer's, token for token, and records where its tokenizer came
    from. A chat benchmark it cannot render is refused before any job; a server whose ids
    changed since the preparation is refused at the cell."""
    from tokenflip.models.prepare import prepare
    from tokenflip.run.engines.endpoint.server import endpoint_problems

    config = _config(servers)
    config["benchmarks"]["steps"]["format"] = "bare"  # rendered here: llama-cpp-python renders chat only itself
    config = cfg.validate(config, source="endpoint.yaml", check_data=False)
    served = {**config, "models": {"smollm2": {"source": "server", "endpoint": "llama", "eos_token": "<|im_end|>"}}}
    served = cfg.validate(served, source="endpoint.yaml", check_data=False)
    assert served["models"]["smollm2"]["served_by"] == {"url": servers["llama"], "model": NAME, "server": "llama.cpp"}
    out = tmp_path / "models" / "smollm2"
    manifest = prepare(served["models"]["smollm2"], out)
    assert sorted(p.name for p in out.iterdir()) == ["generation_config.json", "model.json", "served_tokenizer.json"]
    assert manifest["weights_sha256"] is None and manifest["tokenizer_only"] is True
    assert manifest["tokenizer_from"] == f"the server at {servers['llama']} (llama-cpp-python routes)"

    cell = Cell("smollm2", "steps", "fp32", "on", 1, "greedy", "none", engine="llama")
    run_cell(cell_job(served, cell), out, tmp_path / "served.parquet", progress=False)
    run_cell(cell_job(config, cell), servers["model_dir"], tmp_path / "local.parquet", progress=False)
    (table, meta), (local, _) = (storage.read_cell(tmp_path / f"{name}.parquet") for name in ("served", "local"))
    for column in ("prompt_ids", "token_ids", "top_ids", "text"):
        assert table.column(column).to_pylist() == local.column(column).to_pylist(), column
    assert meta["model"]["tokenizer_sha256"] == manifest["tokenizer_sha256"]
    assert meta["engine"]["tokenizer"] == "the server's own, over HTTP" and meta["eos_token_ids"] == [2]

    chat = cfg.validate({**served, "benchmarks": {"steps": dict(BENCH)}}, source="endpoint.yaml", check_data=False)
    assert any("renders no chat prompt for a client, so benchmark(s) ['steps'] (format chat) cannot be sent as "
               "completions; use `api: chat`" in p for p in endpoint_problems(chat, [cell], lambda m: str(out)))

    changed = json.loads((out / "served_tokenizer.json").read_text())
    changed["info"]["probe_sha256"] = "0" * 64
    from tokenflip.models.served_tokenizer import ServedTokenizer, ServedTokenizerError

    with pytest.raises(ServedTokenizerError, match="its tokenizer is not the one prepared from it .* the server "
                                                   "changed; prepare the model again"):
        ServedTokenizer(changed["spec"], changed["info"]).check()


# --- One command: tokenflip audit ------------------------------------------------------

def test_audit_refuses_a_tokenizer_that_is_not_the_served_models_before_any_job(servers, tmp_path):
    from conftest import local_tokenizer

    other = local_tokenizer(tmp_path / "tiny-llama")
    proc = subprocess.run([sys.executable, "-m", "tokenflip", "audit", servers["llama"], "--model", NAME,
                           "--tokenizer", str(other), "--model-name", "tiny-llama"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 4, proc.stderr[-2000:]  # a deployment that cannot be measured as asked
    assert (f"does not use the tokenizer of model 'tiny-llama' ({other}): the probe text") in proc.stderr
    assert not (tmp_path / "audit-audit.yaml").exists() and not (tmp_path / "results").exists()


def test_audit_of_a_server_whose_scores_are_no_numbers_ends_in_one_line_before_any_job(servers, proxy, tmp_path):
    """What `tokenflip audit` asks a server before it writes the study (what it is, what its
    scores are) is checked as a cell's answers are: one line naming the URL."""
    proxy.script = [("rewrite", _set(["logprobs", "top_logprobs"], lambda v: [{"x": "high"} for _ in v]))]
    proc = subprocess.run([sys.executable, "-m", "tokenflip", "audit", proxy.url, "--model", NAME, "--server",
                           "llama.cpp"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (f"tokenflip audit: error: the probe request: {proxy.url} answered top_logprobs that are not "
                    f"finite numbers: \"[{{'x': 'high'}}, {{'x': 'high'}}]\""), last
    assert not (tmp_path / "audit-audit.yaml").exists() and not (tmp_path / "results").exists()


def test_tokenflip_audit_of_a_teams_chat_traffic_on_two_llama_cpp_deployments(servers, tmp_path):
    """`tokenflip audit URL --model NAME --against URL_B --api chat --prompts-file F` asks each
    server what it is, writes the study (each endpoint named by its host and port), runs it
    through Snakemake and prints the report: every record of the file (conversations and text
    prompts, through the server's own chat template) answered, its text in the report, a
    verdict for each comparison, and the steps where a server did not choose its own top token."""
    prompts = tmp_path / "traffic.jsonl"
    records = [{"id": "greeting", "prompt": "Say hello to a new colleague in one sentence."},
               {"id": "capital", "prompt": "What is the capital of France?", "answer": "Paris"},
               {"id": "support", "messages": [
                   {"role": "system", "content": "You are a terse support agent."},
                   {"role": "user", "content": "My order has not arrived."},
                   {"role": "assistant", "content": "Which order number?"},
                   {"role": "user", "content": "Order 1234, placed last Monday."}]},
               {"id": "sum", "messages": [{"role": "user", "content": "What is 17 + 25? Answer with the number."}]}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    first, second = (f"127.0.0.1_{servers[k].rsplit(':', 1)[1].split('/')[0]}" for k in ("llama", "llama_two_threads"))
    argv = [sys.executable, "-m", "tokenflip", "audit", servers["llama"], "--model", NAME, "--against",
            servers["llama_two_threads"], "--api", "chat", "--prompts-file", str(prompts), "--tokenizer", "server",
            "--max-tokens", "16", "--concurrency", "2", "--load", "1", "--reference", "none", "--precision", "fp32",
            "--run", "audited"]
    # The second deployment asks for a key: refused naming the option that gives it, before any
    # job, as a deployment that cannot be measured (exit 4).
    refused = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 4 and f"{servers['llama_two_threads']}/models answered 401" in refused.stderr
    assert "name the variable that holds it with --api-key-env" in refused.stderr
    assert not (tmp_path / "results").exists()
    keyed, env = [*argv, "--against-key-env", "SECOND_KEY", "--gate", "0.5"], {**os.environ, "SECOND_KEY": SECOND_KEY}
    # Four prompts cannot show even a deployment that never parts within 50% of its floor: said
    # before any request, and refused as a usage error unless told to go on.
    short = subprocess.run(keyed, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert short.returncode == 2 and "--gate 0.5: at least 12 prompts to show ≤ 50% above the noise floor on a " \
        "deployment that never parts (5 comparisons judged, 7 intervals at once); this audit takes at most 4 a " \
        "comparison" in short.stderr, short.stderr
    assert f"{prompts}'s 4 records cannot decide the gate at 0.5" in short.stderr and not (tmp_path / "results").exists()
    proc = subprocess.run([*keyed, "--go-on"], cwd=tmp_path, capture_output=True, text=True, timeout=1800, env=env)
    # Undecided at four prompts: inconclusive (3), as the gate says of the run's own summary.
    assert proc.returncode == 3, proc.stderr[-3000:]
    again = subprocess.run([sys.executable, "-m", "tokenflip", "gate", "results/audited"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 3 and "at --max-divergence 50.0%" in again.stderr, again.stderr
    assert f"{servers['llama']} is llama.cpp (logprobs), named {first!r} in the study" in proc.stderr
    assert f"{servers['llama_two_threads']} is llama.cpp (logprobs), named {second!r}" in proc.stderr
    assert "its prefix cache is not compared cold vs warm: server 'llama.cpp' takes no cache_salt" in proc.stderr
    assert (f"prompts encoded with model 'smollm2' (the tokenizer of the server at {servers['llama']}); reference: "
            f"none (the deployment against itself only)") in proc.stderr
    report = tmp_path / "reports" / "audited" / "index.html"
    assert f"report: {report}" in proc.stdout

    written = cfg.read_yaml(tmp_path / "audit-audited.yaml")
    assert written["benchmarks"] == {"traffic": {"kind": "prompts", "source": {"path": str(prompts)},
                                                 "max_new_tokens": 16}}
    assert (written["gate"], written["rounds"], written["blocks"]) == ({"max_divergence": 0.5}, {"max_prompts": 4},
                                                                       {"first": 4})
    assert written["endpoints"][first] == {"url": servers["llama"], "model": NAME, "api": "chat",
                                           "server": "llama.cpp", "scores": "logprobs"}
    assert written["endpoints"][second] == {"url": servers["llama_two_threads"], "model": NAME, "api": "chat",
                                            "server": "llama.cpp", "scores": "logprobs", "api_key_env": "SECOND_KEY"}
    assert SECOND_KEY not in (tmp_path / "audit-audited.yaml").read_text()
    assert {(c["axis"], str(c["a"]), str(c["b"])) for c in written["comparisons"]} == {
        ("concurrency", "default", "2"), ("repeat", "default", "2"), ("load", "none", "busy"),
        ("logprobs", "on", "off"), ("engine", first, second)}

    cells = sorted((tmp_path / "results" / "audited" / "cells" / "smollm2" / "traffic").glob("*.parquet"))
    assert len(cells) == 7  # 5 of the first deployment (one per knob), 2 of the second (its floor)
    table, meta = storage.read_cell(cells[0])
    assert sorted(table.column("prompt_id").to_pylist()) == ["capital", "greeting", "sum", "support"]
    assert meta["engine"]["prompts_as"] == "messages" and meta["engine"]["chat_template"] == "the server's"
    # The first server's tokenizer, asked over HTTP; no file of the model here.
    assert written["models"] == {"smollm2": {"source": "server", "endpoint": first}}
    assert meta["engine"]["tokenizer"] == "the server's own, over HTTP" and meta["model"]["weights_sha256"] is None
    assert meta["model"]["tokenizer_from"] == f"the server at {servers['llama']} (llama-cpp-python routes)"
    assert meta["engine"]["prompt_ids"].startswith("not known (the server renders its chat template")
    assert sorted(p.name for p in (tmp_path / "resources" / "models" / "smollm2").glob("[!.]*")) == [
        "generation_config.json", "model.json", "served_tokenizer.json"]
    # Each knob once; each deployment's repeat floor; the two deployments on their first and
    # on their second runs.
    pairs = storage.read_table(tmp_path / "results" / "audited" / "summary" / "pairs.parquet")[0].to_pylist()
    assert sorted((p["axis"], p["a"], p["b"]) for p in pairs) == sorted([
        ("concurrency", "default", "2"), ("load", "none", "busy"), ("logprobs", "on", "off"),
        ("repeat", "default", "2"), ("repeat", "default", "2"), ("engine", first, second),
        ("engine", first, second)])
    assert all(p["status"] == "done" and p["verdict"] for p in pairs), pairs

    html = report.read_text()
    assert f"engine: {first} vs {second}" in html
    assert "Order 1234, placed last Monday." in html and "What is 17 + 25?" in html  # "Your prompts"
    assert "the server chose a token below its own top score at temperature 0 (" not in html  # asked neutral
    assert "none here (tokenizer only: the weights are the server's)" in html


def test_without_a_tokenizer_the_audit_takes_the_embedded_one_only_where_the_server_tokenizes_alike(servers):
    from types import SimpleNamespace

    from tokenflip.cli.audit import DEFAULT_TOKENIZER, tokenizer_entry

    endpoints = {"prod": {"url": servers["llama"], "model": NAME, "server": "llama.cpp"}}
    args = SimpleNamespace(tokenizer=None, model_name=None, model=NAME, reference=None)
    assert tokenizer_entry(args, endpoints) == (DEFAULT_TOKENIZER, "the embedded SmolLM2-135M-Instruct")
    args.tokenizer = "server"
    assert tokenizer_entry(args, endpoints) == ({"source": "server", "endpoint": "prod"},
                                                f"model 'smollm2' (the tokenizer of the server at {servers['llama']})")


def test_a_cold_cell_is_refused_for_a_server_that_takes_no_cache_salt(servers):
    """Only a server that takes `cache_salt` can be asked to reuse nothing cached; elsewhere a
    cold cell is refused at validation, naming the server kind and what to compare instead."""
    study = _config(servers)
    study["grids"] = [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "engine": ["llama"],
                       "server_cache": ["cold", "warm"]}]
    with pytest.raises(cfg.ConfigError) as err:
        cfg.validate(study, source="endpoint.yaml", check_data=False)
    assert ("endpoint 'llama' with server_cache 'cold': server 'llama.cpp' takes no cache_salt, so a request "
            "cannot be kept from its prefix cache (compare warm with as_is)") in str(err.value)
    study["grids"][0]["server_cache"] = ["as_is", "warm"]
    assert cfg.validate(study, source="endpoint.yaml", check_data=False)


def _ci_recipe() -> str:
    """The CI job of docs/endpoints.md, as written there."""
    from conftest import REPO

    text = (REPO / "docs" / "endpoints.md").read_text()
    after = text.split("After a deploy, in a GitHub Actions or GitLab CI job", 1)[1]
    return after.split("```bash\n", 1)[1].split("```", 1)[0]


def test_the_documented_ci_recipe_runs_from_the_built_wheel_outside_the_checkout(servers, tmp_path):
    """The wheel is built from the package alone and installed apart from the checkout; the
    recipe's own lines run in another directory against a real llama.cpp server behind a key.
    The audit runs the workflow shipped in the wheel, decides in rounds at the gate, exits with
    the gate's code (what `tokenflip gate` says of its summary) and leaves the JUnit file and
    the report where the recipe says."""
    import shutil

    from conftest import REPO

    build = tmp_path / "build"
    shutil.copytree(REPO / "src", build / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, build / name)
    job, venv, shims = tmp_path / "ci-job", tmp_path / "venv", tmp_path / "shims"
    for folder in (job, shims):
        folder.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                    str(job), str(build)], check=True, timeout=600, capture_output=True)
    wheel = next(job.glob("tokenflip-*.whl"))
    import sysconfig
    import zipfile
    from pathlib import Path

    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert {"tokenflip/workflow/Snakefile", "tokenflip/workflow/rules/generate.smk",
            "tokenflip/workflow/profiles/default/config.yaml"} <= shipped
    # A fresh virtual environment, as a CI image makes one. Its dependencies are the test
    # environment's, read from its site-packages as a plain path (no .pth of it runs, so the
    # checkout's editable install is not on the path); `pip` of the recipe installs the wheel
    # into the fresh environment offline, its dependencies being there already.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600, capture_output=True)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], check=True, capture_output=True, text=True).stdout.strip())
    (site / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (shims / "pip").write_text(f'#!/bin/sh\nshift\nexec {venv}/bin/python -m pip install --quiet --no-deps '
                               f'--no-index "$@"\n')
    (shims / "pip").chmod(0o755)
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
           "PATH": f"{shims}:{venv / 'bin'}:{os.environ['PATH']}", "ENDPOINT_URL": servers["llama_two_threads"],
           "MODEL": NAME, "ENDPOINT_KEY": SECOND_KEY, "GATE": "0.9", "PROMPTS": "4", "MAX_TOKENS": "8"}
    proc = subprocess.run(["bash", "-c", _ci_recipe()], cwd=job, env=env, capture_output=True, text=True,
                          timeout=1800)
    python = str(venv / "bin" / "python")
    where = subprocess.run([python, "-c", "import tokenflip; print(tokenflip.__file__)"], cwd=job, env=env,
                           capture_output=True, text=True).stdout
    assert where.startswith(str(site)), where
    assert (venv / "bin" / "tokenflip").is_file()  # the console script the recipe ran
    assert f"Snakefile: {site}/tokenflip/workflow/Snakefile" in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert proc.returncode in (0, 1, 3), proc.stderr[-3000:]
    gate = subprocess.run([python, "-m", "tokenflip", "gate", "results/deploy-check"], cwd=job, env=env,
                          capture_output=True, text=True, timeout=600)
    assert gate.returncode == proc.returncode, gate.stderr
    assert (job / "results" / "deploy-check" / "gate.junit.xml").is_file()
    assert (job / "reports" / "deploy-check" / "index.html").is_file()
    assert SECOND_KEY not in proc.stdout + proc.stderr
