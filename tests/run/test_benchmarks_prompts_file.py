"""The `prompts` kind: a team's own prompts from JSONL, CSV or Parquet, each error naming the
file and the line, prompts reaching the tokenizer exactly as written, and the four scorers."""

from __future__ import annotations

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import tiny_study
from tokenflip.models.prepare import load_tokenizer
from tokenflip.run.benchmarks import BenchmarkError, PromptsFileBenchmark, build_benchmark, prompts_file, sources
from tokenflip.run.runtime import encode_prompt
from tokenflip.study import config as cfg

SYSTEM = "You are a terse assistant."
CONVERSATION = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Name a prime."},
                {"role": "assistant", "content": "7"},
                {"role": "user", "content": "And one more?"}]
RECORDS = [
    {"id": "ticket-1", "prompt": "Summarise: the printer on floor 3 is jammed.\n", "answer": "jam"},
    {"messages": CONVERSATION, "answer": 11},
    {"prompt": "What is 6 times 7?", "answer": "42"},
]


def write_jsonl(path, records, blank_lines=False):
    lines = [json.dumps(record) for record in records]
    path.write_text(("\n\n" if blank_lines else "\n").join(lines) + "\n", encoding="utf-8")
    return path


def write_csv(path, records):
    columns = [key for key in ("id", "prompt", "messages", "answer") if any(key in r for r in records)]
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for record in records:
            writer.writerow([json.dumps(record[key]) if key == "messages" and key in record else
                             "" if key not in record else str(record[key]) for key in columns])
    return path


def write_parquet(path, records):
    columns = [key for key in ("id", "prompt", "messages", "answer") if any(key in r for r in records)]
    rows = [{key: (str(record[key]) if key == "answer" else record[key]) if key in record else None
             for key in columns} for record in records]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def bench(path, **spec):
    return build_benchmark("mine", {"kind": "prompts", "order": "source", "source": {"path": str(path)}, **spec})


@pytest.fixture(scope="module")
def tokenizer(prepared_models):
    return load_tokenizer(prepared_models("llama"))   # the default model's SmolLM2 tokenizer


# --- formats -------------------------------------------------------------------------------


def test_jsonl_csv_and_parquet_give_the_same_items_and_prompts(tmp_path):
    made = [bench(write_jsonl(tmp_path / "p.jsonl", RECORDS, blank_lines=True)),
            bench(write_csv(tmp_path / "p.csv", RECORDS)),
            bench(write_parquet(tmp_path / "p.parquet", RECORDS))]
    first = made[0].items()
    assert [item.id for item in first] == ["ticket-1", "mine-0001", "mine-0002"]
    assert [item.question for item in first] == [RECORDS[0]["prompt"], "And one more?", RECORDS[2]["prompt"]]
    assert [item.gold for item in first] == ["jam", "11", "42"]
    for other in made[1:]:
        assert other.items() == first
        assert [other.messages(item) for item in first] == [made[0].messages(item) for item in first]
    assert made[0].messages(first[1]) == CONVERSATION
    assert made[2].data_files() == [str(tmp_path / "p.parquet")]
    assert made[2].describe()["source"]["sha256"] == sources.Source(path=tmp_path / "p.parquet").describe()["sha256"]


def test_n_takes_the_first_records_and_a_hub_source_is_read_through_datasets(tmp_path, monkeypatch):
    assert [i.id for i in bench(write_jsonl(tmp_path / "p.jsonl", RECORDS), n=2).items()] == ["ticket-1", "mine-0001"]
    import sys
    import types

    module = types.ModuleType("datasets")
    module.load_dataset = lambda *args, **kwargs: [{"prompt": "hi"}, {"prompt": "hi", "promt": "typo"}]
    monkeypatch.setitem(sys.modules, "datasets", module)
    hub = build_benchmark("mine", {"kind": "prompts", "order": "source", "source": {"hub": "org/traffic", "split": "test"}})
    assert hub.reads_hub and hub.data_files() == []
    with pytest.raises(BenchmarkError, match=r"org/traffic@unpinned \(config None, split 'test'\) row 1: unknown "
                                             r"key 'promt'"):
        hub.items()


# --- prompts reach the tokenizer as written --------------------------------------------------


def test_a_conversation_and_a_text_prompt_are_chat_templated_as_written(tmp_path, tokenizer):
    b = bench(write_jsonl(tmp_path / "p.jsonl", RECORDS))
    text, conversation = b.items()[0], b.items()[1]
    expected = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nName a prime.<|im_end|>\n"
                "<|im_start|>assistant\n7<|im_end|>\n<|im_start|>user\nAnd one more?<|im_end|>\n"
                "<|im_start|>assistant\n")
    assert encode_prompt(tokenizer, b, conversation) == tokenizer(expected, add_special_tokens=False)["input_ids"]
    # The kind adds no system turn of its own (the template's default is the template's).
    assert b.messages(text) == [{"role": "user", "content": RECORDS[0]["prompt"]}]
    as_user = tokenizer.apply_chat_template(b.messages(text), add_generation_prompt=True, tokenize=False)
    assert encode_prompt(tokenizer, b, text) == tokenizer(as_user, add_special_tokens=False)["input_ids"]
    assert f"<|im_start|>user\n{RECORDS[0]['prompt']}<|im_end|>" in as_user
    no_system = bench(tmp_path / "p.jsonl", system_prompt=False)
    assert no_system.chat_messages(conversation) == CONVERSATION[1:]


def test_bare_format_sends_a_text_prompt_verbatim_with_no_default_stop(tmp_path, tokenizer):
    b = bench(write_jsonl(tmp_path / "p.jsonl", RECORDS), format="bare")
    text, conversation = b.items()[0], b.items()[1]
    assert b.bare_text(text) == RECORDS[0]["prompt"]   # trailing newline kept, no "Question:" framing
    assert encode_prompt(tokenizer, b, text) == tokenizer(RECORDS[0]["prompt"])["input_ids"]
    assert b.bare_text(conversation) == (f"{SYSTEM}\n\nQuestion: Name a prime.\nAnswer: 7\n\n"
                                         "Question: And one more?\nAnswer:")   # the base class's framing
    assert b.stop == () and bench(tmp_path / "p.jsonl").stop == ()
    assert "no turn markers" in b.describe()["stop_source"]


# --- errors name the file and the line -------------------------------------------------------

USER = {"role": "user", "content": "hi"}
BAD_RECORDS = [
    ({"promt": "hi"}, r"line 2: unknown key 'promt'"),
    ({"prompt": "hi", "messages": [USER]}, r"line 2: .*exactly one of 'prompt' .* got 'prompt' and 'messages'"),
    ({"id": "x"}, r"line 2: .*exactly one of .* got neither"),
    ({"prompt": "  "}, r"line 2: 'prompt' must be non-empty text"),
    ({"messages": [{"role": "tool", "content": "x"}, USER]},
     r"line 2: 'messages'\[0\]\['role'\] must be one of system, user, assistant, got 'tool'"),
    ({"messages": [USER, {"role": "assistant", "content": "ok"}]}, r"line 2: the last turn must be the user's"),
    ({"messages": [{"role": "user", "content": ""}]}, r"line 2: 'messages'\[0\]\['content'\] must be non-empty"),
    ({"messages": [USER, {"role": "system", "content": "late"}, USER]}, r"line 2: 'messages'\[1\] is a system turn"),
    ({"messages": [{**USER, "name": "bob"}]}, r"line 2: 'messages'\[0\] has unknown key 'name'"),
    ({"messages": []}, r"line 2: 'messages' must be a non-empty list"),
    ({"prompt": "hi", "id": "a"}, r"line 2: id 'a' is already the id of line 1"),
    ({"prompt": "hi", "answer": True}, r"line 2: 'answer' must be text or a number"),
]


@pytest.mark.parametrize(("record", "message"), BAD_RECORDS, ids=[m.split(": ", 1)[1][:30] for _, m in BAD_RECORDS])
def test_a_bad_record_is_named_by_file_and_line(tmp_path, record, message):
    path = write_jsonl(tmp_path / "my.jsonl", [{"id": "a", "prompt": "fine"}, record])
    with pytest.raises(BenchmarkError, match=rf"benchmark 'mine' \(prompts\): .*my\.jsonl {message}"):
        bench(path).items()


def test_csv_lines_count_the_header_and_parquet_names_the_row(tmp_path):
    records = [{"prompt": "fine"}, {"messages": [{"role": "tool", "content": "x"}]}]
    with pytest.raises(BenchmarkError, match=r"my\.csv line 3: 'messages'\[0\]\['role'\] .* got 'tool'"):
        bench(write_csv(tmp_path / "my.csv", records)).items()
    with pytest.raises(BenchmarkError, match=r"my\.parquet row 1: 'messages'\[0\]\['role'\] .* got 'tool'"):
        bench(write_parquet(tmp_path / "my.parquet", records)).items()
    (tmp_path / "notjson.csv").write_text('prompt,messages\n,"[{""role"": ""user""}"\n')
    with pytest.raises(BenchmarkError, match=r"notjson\.csv line 2: 'messages' is text but not valid JSON"):
        bench(tmp_path / "notjson.csv").items()
    (tmp_path / "ragged.csv").write_text("id,prompt\na,hi\nb\n")
    with pytest.raises(BenchmarkError, match=r"ragged\.csv line 3: 1 fields, the header has 2"):
        bench(tmp_path / "ragged.csv").items()


def test_bad_json_and_an_unknown_extension_are_named(tmp_path):
    path = tmp_path / "my.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b",}\n')
    with pytest.raises(BenchmarkError, match=r"my\.jsonl line 3: not valid JSON"):
        bench(path).items()
    (tmp_path / "my.txt").write_text('{"prompt": "a"}\n')
    with pytest.raises(BenchmarkError, match=r"my\.txt: cannot tell the file's format .* \.jsonl, \.json, \.csv, "
                                             r"\.parquet"):
        bench(tmp_path / "my.txt")


def test_source_is_required():
    with pytest.raises(BenchmarkError, match=r"benchmark 'mine' \(prompts\): 'source' is required"):
        build_benchmark("mine", {"kind": "prompts", "order": "source"})


def test_a_scorer_needs_an_answer_in_every_record(tmp_path):
    path = write_jsonl(tmp_path / "my.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "b"}])
    assert bench(path).items()[1].gold == ""   # scorer none: no answer needed
    with pytest.raises(BenchmarkError, match=r"my\.jsonl line 2: no 'answer', which scorer 'exact' needs"):
        bench(path, scorer="exact").items()
    word = write_jsonl(tmp_path / "word.jsonl", [{"prompt": "a", "answer": "forty-two"}])
    with pytest.raises(BenchmarkError, match=r"word\.jsonl line 1: 'answer' 'forty-two' is not a number"):
        bench(word, scorer="numeric").items()


def test_too_many_records_too_long_a_prompt_and_too_large_a_file_are_refused(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "my.jsonl", [{"prompt": "x" * 40}] * 3)
    monkeypatch.setattr(prompts_file, "MAX_RECORDS", 2)
    with pytest.raises(BenchmarkError, match=r"my\.jsonl: holds 3 records, more than the 2 a benchmark file may hold"):
        bench(path).items()
    monkeypatch.setattr(prompts_file, "MAX_RECORDS", 10)
    monkeypatch.setattr(prompts_file, "MAX_PROMPT_CHARS", 39)
    with pytest.raises(BenchmarkError, match=r"my\.jsonl line 1: the prompt holds 40 characters, more than the 39"):
        bench(path).items()
    monkeypatch.setattr(sources, "MAX_DATA_BYTES", 100)
    with pytest.raises(BenchmarkError, match=r"my\.jsonl: holds \d+ bytes, more than the 100"):
        bench(path).items()


# --- scorers -------------------------------------------------------------------------------


def scored(tmp_path, scorer, answer, completion):
    b = bench(write_jsonl(tmp_path / f"{scorer}.jsonl", [{"prompt": "q", "answer": answer}]), scorer=scorer)
    return b.score(b.items()[0], completion)


@pytest.mark.parametrize(("scorer", "answer", "completion", "verdict"), [
    ("exact", "Paris", "  Paris\n", "correct"),
    ("exact", "Paris", "paris", "wrong"),
    ("exact", "Paris", "   ", "no_answer"),
    ("numeric", 42, "Six times seven. The answer is 42.", "correct"),
    ("numeric", "1,000", "#### 1000", "correct"),
    ("numeric", "42", "The answer is 41.", "wrong"),
    ("math", "0.5", "So the result is $\\boxed{\\frac{1}{2}}$.", "correct"),
    ("math", "\\frac{1}{2}", "The final answer is $0.5$", "correct"),
    ("math", "0.5", "$\\boxed{\\frac{1}{3}}$", "wrong"),
])
def test_scorers_on_known_answers(tmp_path, scorer, answer, completion, verdict):
    score = scored(tmp_path, scorer, answer, completion)
    assert score.verdict == verdict and score.correct is (verdict == "correct")


def test_exact_scores_only_the_text_before_the_stop(tmp_path):
    b = bench(write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q", "answer": "Paris"}]), scorer="exact", stop=["\n"])
    assert b.score(b.items()[0], " Paris\nQ: next").verdict == "correct"


def test_scorer_none_measures_no_accuracy(tmp_path):
    b = bench(write_jsonl(tmp_path / "p.jsonl", RECORDS))
    score = b.score(b.items()[0], " The printer is jammed. ")
    assert (score.correct, score.verdict, score.extracted) == (None, "not_scored", "The printer is jammed.")
    assert not b.is_correct(b.items()[0], "jam")
    assert b.describe()["scorer_name"] == "none" and "no accuracy" in b.describe()["scorer"]


# --- a whole study config ------------------------------------------------------------------


def test_a_study_config_with_this_kind_validates_and_a_bad_record_fails_naming_file_and_line(tmp_path):
    path = write_parquet(tmp_path / "traffic.parquet", RECORDS)
    study = tiny_study()
    study["benchmarks"] = {"mine": {"kind": "prompts", "order": "source", "n": 2, "source": {"path": str(path)}}}
    config = cfg.validate(study, source="study.yaml", check_data=True)
    assert config["benchmarks"]["mine"]["scorer"] == "none" and config["benchmarks"]["mine"]["stop"] == []
    assert isinstance(build_benchmark("mine", config["benchmarks"]["mine"]), PromptsFileBenchmark)

    study["benchmarks"]["mine"]["scorer"] = "fuzzy"
    with pytest.raises(cfg.ConfigError, match=r"study\.yaml: benchmarks\.mine\.scorer: 'fuzzy' is not one of"):
        cfg.validate(study, source="study.yaml", check_data=True)
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"prompt": "ok", "promt": "typo"}])
    study["benchmarks"]["mine"] = {"kind": "prompts", "order": "source", "source": {"path": str(bad)}}
    with pytest.raises(cfg.ConfigError, match=r"study\.yaml: benchmarks\.mine: .*bad\.jsonl line 2: unknown key "
                                              r"'promt'"):
        cfg.validate(study, source="study.yaml", check_data=True)
    del study["benchmarks"]["mine"]["source"]
    with pytest.raises(cfg.ConfigError, match=r"benchmarks\.mine: benchmark 'mine' \(prompts\): 'source' is required"):
        cfg.validate(study, source="study.yaml", check_data=True)
