"""What `tokenflip audit` writes before it runs anything, without a server: each endpoint's
name in the study (from its host and port, never another endpoint's or an engine's, always a
name the config takes), the study's name for the served model, and the study itself (one
grid per knob, the second deployment with its own repeat floor, cold vs warm only where the
server takes a cache salt). And the tokenizer routes' answers as each server writes them."""

from __future__ import annotations

import argparse

import pytest

from tokenflip.cli.audit import endpoint_label, model_name_of, study
from tokenflip.models.servers import token_ids
from tokenflip.study import config as cfg


@pytest.mark.parametrize("url,taken,name", [
    ("http://127.0.0.1:8000/v1", (), "127.0.0.1_8000"),
    ("https://llm.example.com/v1", (), "llm.example.com"),
    ("http://llm-vs-gw:8000/v1", (), "llm_v_s_gw_8000"),  # `_vs_` separates a pair's two values
    ("http://vllm/v1", (), "vllm_server"),  # not the vLLM engine
    ("http://[::1]:8000/v1", (), "__1_8000"),
    ("http://127.0.0.1:8000/v1", ("127.0.0.1_8000",), "127.0.0.1_8000_b"),
    ("http://a-very-long-internal-hostname.region.example.com:8001/v1", (),
     "a_very_long_internal_hostname.r_8001"),  # the port kept where the host is cut
])
def test_an_endpoint_is_named_by_its_host_and_port_as_the_config_takes_names(url, taken, name):
    assert endpoint_label(url, taken) == name
    assert not list(cfg.Validator(cfg.schema()["$defs"]["label"]).iter_errors(name))


@pytest.mark.parametrize("given,name", [
    ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B-Instruct"),
    ("/data/checkpoints/my-llama/", "my-llama"),
    ({"source": "gguf-package", "package": "p", "file": "Model.Q4_K_M.gguf"}, "Model.Q4_K_M.gguf"),
])
def test_the_served_model_is_named_after_its_tokenizer_never_over_the_embedded_models_copy(given, name):
    assert model_name_of(given) == name


def _args(**extra):
    values = dict(run="audit", model_name="m", tokenizer={"source": "hf", "id": "org/m", "tokenizer_only": True},
                  prompts_file=None, scorer=None, benchmark="arithmetic", prompts=None, max_tokens=256, top_k=8,
                  concurrency=8, load=4, precision="bf16", url="http://a:1/v1", model="m", against=None,
                  against_model=None, api="completions")
    return argparse.Namespace(**{**values, **extra})


def _endpoint(url, server):
    return {"url": url, "model": "m", "api": "completions", "server": server, "scores": "logprobs"}


def test_the_audit_study_compares_each_knob_once_and_two_deployments_each_against_its_own_floor():
    endpoints = {"a_1": _endpoint("http://a:1/v1", "vllm"), "b_2": _endpoint("http://b:2/v1", "llama.cpp")}
    config = cfg.validate(study(_args(against="http://b:2/v1"), endpoints, "none"), source="audit", check_data=False)
    assert [(c["axis"], str(c["a"]), str(c["b"])) for c in config["comparisons"]] == [
        ("concurrency", "default", "8"), ("repeat", "default", "2"), ("load", "none", "busy"),
        ("logprobs", "on", "off"), ("server_cache", "cold", "warm"), ("engine", "a_1", "b_2")]
    from tokenflip.study.plan import expand_cells

    names = sorted(c.name for c in expand_cells(config))
    assert names == sorted([
        "bf16-on-bs1-greedy-none-engine=a_1", "bf16-on-bs1-greedy-none-engine=a_1-concurrency=8",
        "bf16-on-bs1-greedy-none-repeat=2-engine=a_1", "bf16-on-bs1-greedy-none-engine=a_1-load=busy",
        "bf16-on-bs1-greedy-none-engine=a_1-logprobs=off", "bf16-on-bs1-greedy-none-engine=a_1-server_cache=cold",
        "bf16-on-bs1-greedy-none-engine=a_1-server_cache=warm", "bf16-on-bs1-greedy-none-engine=b_2",
        "bf16-on-bs1-greedy-none-repeat=2-engine=b_2"])
    # llama.cpp's server takes no cache salt: no cold cell of its own
    alone = cfg.validate(study(_args(), {"b_2": endpoints["b_2"]}, "none"), source="audit", check_data=False)
    assert "server_cache" not in {c["axis"] for c in alone["comparisons"]}


def test_a_reference_is_compared_with_the_first_deployment():
    config = study(_args(tokenizer={"source": "hf", "id": "org/m"}), {"a_1": _endpoint("http://a:1/v1", "vllm")},
                   "transformers")
    assert config["comparisons"][-1] == {"axis": "engine", "a": "transformers", "b": "a_1"}
    assert config["grids"][-1]["engine"] == ["transformers"] and config["generation"]["device"] == "auto"


@pytest.mark.parametrize("answer,ids", [
    ({"tokens": [1, 2, 3], "count": 3, "max_model_len": 2048}, [1, 2, 3]),  # vLLM, SGLang
    ({"tokens": [5, 6]}, [5, 6]),  # llama.cpp's servers
    ([{"id": 7, "text": "a", "start": 0, "stop": 1}, {"id": 8, "text": "b", "start": 1, "stop": 2}], [7, 8]),  # TGI
    ({"tokens": []}, []), ([], []),  # an empty text's: none
    ([1, 2, 3], None), ({"tokens": [2**31]}, None),  # a bare list is no server's answer
    ({"tokens": ["1"]}, None), ({"tokens": [True]}, None), ({"detail": "Not Found"}, None), ("text", None),
])
def test_each_servers_tokenize_answer_is_read_and_anything_else_is_none(answer, ids):
    assert token_ids(answer) == ids


def _gate_args(**extra):
    values = dict(server=None, against=None, reference=None, gate=0.05, prompts=None, prompts_file=None,
                  budget=None, go_on=False)
    return argparse.Namespace(**{**values, **extra})


def test_an_audit_gate_says_what_its_budget_can_decide_and_refuses_one_that_cannot(capsys):
    from tokenflip.analysis.decision import prompts_needed
    from tokenflip.cli.audit_gate import check_budget, families

    args = _gate_args()
    assert families(args) == (5, 6)  # concurrency, load, logprobs, cold vs warm, the reference; and one floor
    need = prompts_needed(0.0, 0.0, "gate", bound=0.05, margin=0.05, intervals=6, judged=5)
    assert check_budget(args) == -(-2 * need // 16) * 16  # twice what a perfect deployment needs, in blocks
    said = capsys.readouterr().err
    assert f"at least {need} prompts to show ≤ 5% above the noise floor on a deployment that never parts" in said
    with pytest.raises(cfg.ConfigError, match=rf"--prompts 32 cannot decide the gate at 0.05: .* needs {need} "
                                              rf"prompts .* or --go-on"):
        check_budget(_gate_args(prompts=32))
    assert check_budget(_gate_args(prompts=32, go_on=True)) == 32


def test_an_audit_whose_cell_could_not_be_measured_exits_4_naming_it(tmp_path, monkeypatch, capsys):
    """The scheduler's own code never reaches CI: a failed run is exit 4, each cell missing named
    with the last line of its job's log (a key in it masked)."""
    from tokenflip.cli.audit_gate import finish
    from tokenflip.core.layout import RunLayout
    from tokenflip.study.plan import expand_cells

    monkeypatch.chdir(tmp_path)
    endpoints = {"a_1": _endpoint("http://a:1/v1", "vllm")}
    config = cfg.validate(study(_args(), endpoints, "none"), source="audit", check_data=False)
    cells = expand_cells(config)
    log = tmp_path / RunLayout(config["run"]).log("generate", cells[0].id)
    log.parent.mkdir(parents=True)
    log.write_text("loading\ntokenflip generate: error: endpoint 'a_1': http://a:1/v1 answered 500 with "
                   "Authorization: Bearer sk-live-0123456789abcdef\n")
    with pytest.raises(SystemExit) as exit_:
        finish(config, argparse.Namespace(gate=None), 1)
    assert exit_.value.code == 4
    said = capsys.readouterr().err
    assert f"cell {cells[0].id} could not be measured: tokenflip generate: error: endpoint 'a_1'" in said
    assert "0123456789abcdef" not in said and len(said.splitlines()) == len(cells)
    assert f"cell {cells[1].id} could not be measured: its job did not run" in said


def test_an_audit_gate_takes_as_many_built_in_prompts_as_its_rounds_may(capsys):
    from tokenflip.cli.audit_gate import check_budget, with_gate
    from tokenflip.study.rounds import block_ends

    args = _args(gate=0.05, prompts=None, prompts_file=None, budget="10 min", go_on=False, server=None,
                 reference="none")
    most = check_budget(args)
    endpoints = {"a_1": _endpoint("http://a:1/v1", "vllm")}
    config = cfg.validate(with_gate(study(args, endpoints, "none"), args, most), source="audit", check_data=False)
    assert block_ends(config, "arithmetic")[-1] == most and block_ends(config, "arithmetic")[0] == 16
    assert config["rounds"] == {"max_prompts": most, "budget": "10 min"} and config["gate"] == {"max_divergence": 0.05}
