"""An endpoint entry that would record a password, send another variable's value as its key,
or let `extra_body` override what a cell's name stands for is refused before any job,
naming the key; the entries users write (a key variable of their own, a server's own
fields such as llama.cpp's repeat_penalty) pass."""

from __future__ import annotations

import pytest

from conftest import tiny_study
from tokenflip.study import config as cfg


def study(**entry) -> dict:
    s = tiny_study()
    s["endpoints"] = {"prod": {"url": "http://127.0.0.1:9/v1", "model": "m", **entry}}
    s["grids"] = [{"engine": ["prod"], "precision": ["fp32"], "cache": ["on"], "batch_size": [1]}]
    s["comparisons"], s["probes"] = [], {}
    return s


def problems(**entry) -> str:
    with pytest.raises(cfg.ConfigError) as caught:
        cfg.validate(study(**entry), check_data=False)
    return str(caught.value)


@pytest.mark.parametrize("url", ["http://alice:s3cret@10.0.0.5:8000/v1", "https://token@api.example.com/v1"])
def test_a_url_with_credentials_is_refused_without_repeating_them(url):
    said = problems(url=url)
    assert "endpoints.prod.url: it holds a user name or password" in said and "api_key_env" in said
    assert "s3cret" not in said and "alice" not in said and "token@" not in said


@pytest.mark.parametrize("field, value", [("temperature", 1.5), ("model", "other"), ("max_tokens", 100000),
                                          ("prompt", "ignore the benchmark"), ("n", 4), ("stream", True),
                                          ("logprobs", 0), ("seed", 7)])
def test_extra_body_cannot_set_what_the_cells_name_owns(field, value):
    said = problems(extra_body={field: value, "repeat_penalty": 1.0})
    assert f"endpoints.prod.extra_body: ['{field}'] are set by each cell's own settings" in said


@pytest.mark.parametrize("name", ["PATH", "HOME", "HF_TOKEN", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY",
                                  "MY_SETTINGS"])
def test_a_key_variable_that_holds_no_key_for_this_server_is_refused(name):
    said = problems(api_key_env=name)
    assert f"endpoints.prod.api_key_env: ${name} is not a key for this server" in said
    assert "127.0.0.1" in said and "PROD_API_KEY" in said


def test_the_entries_users_write_pass():
    for entry in ({"api_key_env": "PROD_API_KEY", "extra_body": {"repeat_penalty": 1.0}},
                  {"api_key_env": "OPENAI_API_KEY"}, {"url": "https://api.example.com:8443/v1"}):
        config = cfg.validate(study(**entry), check_data=False)
        assert config["endpoints"]["prod"]["model"] == "m"


def test_each_server_kind_a_config_may_name_has_one_profile_that_every_request_follows():
    """The schema's `server:` values are the profiles' names; what a request carries beyond
    OpenAI's API comes from its server's profile alone (ids asked of vLLM and SGLang,
    llama.cpp's repetition penalty asked off), and every entry of an unnamed kind is sent
    OpenAI's API as written."""
    from tokenflip.models.servers import SERVERS, server
    from tokenflip.run.engines.endpoint.engine import SERVER_KINDS, request_fields

    schema = cfg.schema()["properties"]["endpoints"]["additionalProperties"]["properties"]["server"]["enum"]
    assert list(SERVER_KINDS) == schema == list(SERVERS)
    greedy = {"strategy": "greedy"}
    asked = {kind: request_fields({"model": "m", "api": "completions", "server": kind}, greedy, 8, 2, True, [], [2])
             for kind in SERVER_KINDS}
    openai = asked["openai"]
    assert openai == {"model": "m", "max_tokens": 8, "temperature": 0.0, "logprobs": 2}
    assert asked["vllm"] == {**openai, "return_token_ids": True, "return_tokens_as_token_ids": True,
                             "stop_token_ids": [2]}
    assert asked["sglang"] == {**openai, "return_token_ids": True, "stop_token_ids": [2]}
    assert asked["llama.cpp"] == {**openai, "repeat_penalty": 1.0}
    assert asked["tgi"] == asked["ollama"] == openai
    assert server(None) is server("a-server-tokenflip-does-not-know") is SERVERS["openai"]
    # the chat API asks for logprobs in its own fields
    chat = request_fields({"model": "m", "api": "chat", "server": "vllm"}, greedy, 8, 2, True, [], [2])
    assert (chat["logprobs"], chat["top_logprobs"]) == (True, 2)
