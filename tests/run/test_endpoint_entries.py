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
