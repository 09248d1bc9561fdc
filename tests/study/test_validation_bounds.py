"""Validation is the contract of the job: every value the schema accepts is one a job can
run. One class per test: axis values in one form, integers that are integers, strings a
tokenizer and a file can take, bounds from the model and the machine (each named),
a probe's cache form checked as a grid's, and benchmark data checked for meaning and read
within a cap."""

from __future__ import annotations

import gzip
import json

import pytest

from conftest import SHARED_DATA, tiny_study
from tokenflip.run.benchmarks import BenchmarkError, build_benchmark, sources
from tokenflip.study import config as cfg
from tokenflip.study import limits as bounds
from tokenflip.study.plan import expand_cells, expand_pairs


def _refused(study, *patterns):
    with pytest.raises(cfg.ConfigError) as info:
        cfg.validate(study)
    for pattern in patterns:
        assert pattern in str(info.value), str(info.value)
    return str(info.value)


@pytest.mark.parametrize(("axis", "grid_values", "a", "b"), [
    ("batch_size", [1, 2], 1, "1"),
    ("threads", [1, 2], 1, "1"),
    ("threads", [1, 2], "2", 2),
    ("repeat", ["default", 2], 2, "2"),
    ("prefill_chunk", ["default", 4], "4", 4),
])
def test_an_integer_axis_takes_integers_in_comparisons_as_in_grids(axis, grid_values, a, b):
    """1 and "1" are one value: a comparison side takes what the grid takes for its axis,
    so the string is refused naming the key, and no comparison can pair a cell with itself."""
    study = tiny_study()
    study["grids"][0][axis] = grid_values
    study["comparisons"] = [{"axis": axis, "a": a, "b": b}]
    side = "a" if isinstance(a, str) else "b"
    _refused(study, f"comparisons.0.{side}: {(a if side == 'a' else b)!r} is not of type 'integer'")


def test_every_planned_pair_is_two_cells():
    study = tiny_study()
    study["grids"][0].update(batch_size=[1, 2], threads=[1, 2], repeat=["default", 2])
    study["comparisons"] = [{"axis": "batch_size", "a": 1, "b": 2}, {"axis": "threads", "a": 1, "b": 2},
                            {"axis": "repeat", "a": "default", "b": 2}]
    config = cfg.validate(study)
    pairs = expand_pairs(config, expand_cells(config))
    assert pairs and all(pair.a != pair.b for pair in pairs)


@pytest.mark.parametrize(("place", "value"), [
    (("generation", "max_new_tokens"), 6.0),
    (("benchmarks", "arith_a", "max_new_tokens"), 6.0),
    (("benchmarks", "arith_a", "n"), 2.0),
    (("seed",), 1.0),
])
def test_integers_are_integers(place, value):
    study = tiny_study()
    target = study
    for key in place[:-1]:
        target = target.setdefault(key, {})
    target[place[-1]] = value
    _refused(study, f"{'.'.join(place)}: {value!r} is not an integer")


@pytest.mark.parametrize("where", ["stop", "key", "run", "title"])
def test_strings_are_encodable(where):
    """A lone surrogate (YAML and JSON both read "\\ud800" into one) reaches no tokenizer or file."""
    study = tiny_study()
    bad = "Q\ud800:"
    if where == "stop":
        study["benchmarks"]["arith_a"]["stop"] = [bad]
        key = "benchmarks.arith_a.stop.0"
    elif where == "key":
        study["benchmarks"][bad] = study["benchmarks"].pop("arith_a")
        key = "benchmarks: key"  # the key itself: "benchmarks: key 'Q\ud800:' holds ..."
    elif where == "run":
        study["run"] = bad
        key = "run"
    else:
        study["report"] = {"title": bad}
        key = "report.title"
    _refused(study, f"{key}{' ' if key.endswith('key') else ': '}'Q\\ud800:' holds '\\ud800' at position 1")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_numbers_are_finite(value):
    """NaN compares false with every bound, so `temperature: .nan` would pass `minimum`."""
    study = tiny_study()
    study["decoding"] = {"hot": {"strategy": "sample", "temperature": value}}
    _refused(study, f"decoding.hot.temperature: {value!r} is not a finite number")


def test_a_temperature_that_overflows_fp32_logits_is_refused():
    study = tiny_study()
    study["decoding"] = {"greedy": {"strategy": "greedy"}, "cold": {"strategy": "sample", "temperature": 1e-300}}
    _refused(study, "decoding.cold.temperature: 1e-300 is below the minimum 1e-06")
    study["decoding"]["cold"]["temperature"] = 1e-6
    cfg.validate(study, check_data=False)


def test_a_nul_character_reaches_no_file_name():
    study = tiny_study()
    study["benchmarks"]["g"] = {"kind": "gsm8k", "source": {"path": "data\0.jsonl"}}
    _refused(study, "benchmarks.g.source.path: 'data\\x00.jsonl' holds a NUL character at position 4")


def test_a_yaml_file_with_a_lone_surrogate_is_refused(tmp_path):
    study = tiny_study()
    path = tmp_path / "c.yaml"
    text = json.dumps(study).replace('"arith_a": {', '"arith_a": {"stop": ["\\ud800"], ', 1)
    path.write_text(text)
    with pytest.raises(cfg.ConfigError, match=r"benchmarks\.arith_a\.stop\.0: .*lone surrogate"):
        cfg.load(path, check_data=False)


@pytest.mark.parametrize("key", ["seed", "model seed", "benchmark seed"])
def test_seeds_are_within_what_torch_takes(key):
    study = tiny_study()
    if key == "seed":
        study["seed"], where = 2**70, "seed"
    elif key == "model seed":
        study["models"]["tiny"]["seed"], where = 2**64, "models.tiny.seed"
    else:
        study["benchmarks"]["arith_b"]["seed"], where = 2**63, "benchmarks.arith_b.seed"
    _refused(study, f"{where}: ", "is above the maximum 9223372036854775807", "torch.manual_seed")
    if key == "seed":
        study["seed"] = 2**63 - 1
        assert cfg.validate(study)["seed"] == 2**63 - 1


@pytest.mark.parametrize(("key", "tokens"), [("benchmarks.arith_a.max_new_tokens", 1024),
                                            ("generation.max_new_tokens", 10**9),
                                            ("probes.kv_cache.max_new_tokens", 5000)])
def test_a_generation_longer_than_the_models_context_is_refused(key, tokens):
    """The random Llama has 1024 positions: a static cache, llama.cpp's n_ctx and the model's
    positions are all sized prompt + max_new_tokens."""
    study = tiny_study()
    if key.startswith("generation"):
        del study["benchmarks"]["arith_a"]["max_new_tokens"]
        study["generation"]["max_new_tokens"] = tokens
    elif key.startswith("probes"):
        study["probes"]["kv_cache"]["max_new_tokens"] = tokens
    else:
        study["benchmarks"]["arith_a"]["max_new_tokens"] = tokens
    _refused(study, f"{key}: {tokens} new tokens", "context of 1024 positions (max_position_embeddings")
    study["models"]["tiny"]["overrides"] = {"max_position_embeddings": tokens + 64}
    cfg.validate(study, check_data=False)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"num_hidden_layers": 10**6}, "1000000 layers of hidden_size 64 make"),
    ({"hidden_size": 2**20, "intermediate_size": 2**20}, "GiB of fp32 weights"),
    ({"num_attention_heads": 3}, "hidden_size 64 is not a multiple of num_attention_heads 3"),
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ({"num_hidden_layers": 2.0}, "2.0 is not an integer"),
])
def test_a_random_model_must_be_one_this_machine_can_build(overrides, message):
    study = tiny_study()
    study["models"]["tiny"]["overrides"] = overrides
    text = _refused(study, "models.tiny.overrides", message)
    if "GiB" in message:
        assert f"{bounds.machine_memory_bytes() / 2**30:.1f} GiB of memory" in text


def test_a_probes_cache_form_is_refused_where_a_grids_would_be(monkeypatch):
    """int8 needs a quantization backend; whether or not it is installed here, the probe's
    `forms` and a grid's kv_dtype get the same verdict and the same reason."""
    from tokenflip.run import caches

    monkeypatch.setattr(caches, "kv_dtype_unavailable",
                        lambda kv: None if kv == "default" else f"kv_dtype {kv}: no backend here")
    study = tiny_study()
    study["probes"]["kv_cache"]["forms"] = ["kv_dtype=int8"]
    _refused(study, "probes.kv_cache.forms: 'kv_dtype=int8': kv_dtype int8: no backend here")
    grid = tiny_study()
    grid["grids"].append({"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "kv_dtype": ["int8"]})
    _refused(grid, "grids.1: kv_dtype int8: no backend here")


def test_a_probes_cache_form_follows_this_installation():
    from tokenflip.run.caches import kv_dtype_unavailable

    study = tiny_study()
    study["probes"]["kv_cache"]["forms"] = ["kv_dtype=int8"]
    reason = kv_dtype_unavailable("int8")
    if reason:
        _refused(study, f"probes.kv_cache.forms: 'kv_dtype=int8': {reason}")
    else:
        cfg.validate(study, check_data=False)


# --- benchmark data, checked for meaning ---------------------------------------------------------

def _mbpp_file(tmp_path, **change):
    records = json.loads((SHARED_DATA / "mbpp" / "sanitized-mbpp.json").read_text())
    index = next(i for i, r in enumerate(records) if r["task_id"] == 11)
    records[index].update(change)
    path = tmp_path / "mbpp.json"
    path.write_text(json.dumps(records))
    return path, index


@pytest.mark.parametrize(("tests", "message"), [
    (["pass"], "test_list[0] 'pass' holds no assert that reads the solution (any program would pass)"),
    (["assert True"], "holds no assert that reads the solution"),
    (["x = remove_Occ('hello', 'l')"], "holds no assert that reads the solution"),
    (["assert remove_Occ('hello','l') == 'heo'", "assert (1 ==", ], "test_list[1] 'assert (1 ==' does not parse"),
])
def test_mbpp_tests_that_cannot_decide_are_refused_naming_file_and_record(tmp_path, tests, message):
    path, index = _mbpp_file(tmp_path, test_list=tests)
    bench = build_benchmark("m", {"kind": "mbpp", "source": {"path": str(path)}, "shots": 0})
    with pytest.raises(BenchmarkError) as info:
        bench.items()
    assert f"record {index} (task_id 11) of {path}" in str(info.value) and message in str(info.value)


def test_mbpp_setup_code_that_does_not_parse_is_refused(tmp_path):
    path, index = _mbpp_file(tmp_path, test_setup_code="def (")
    with pytest.raises(BenchmarkError, match=rf"record {index} \(task_id 11\) of {path}: its test setup 'def \(' "
                                             rf"do not parse"):
        build_benchmark("m", {"kind": "mbpp", "source": {"path": str(path)}, "shots": 0}).items()


@pytest.mark.parametrize(("test", "message"), [
    ("def check(candidate):\n    pass\n", "holds no assert that reads the solution"),
    ("def check(candidate):\n    assert candidate(1) ==\n", "does not parse"),
    ("def helper(candidate):\n    assert candidate(1) == 2\n", r"defines no check\(candidate\)"),
    (None, r"calls check\('below zero'\), which is no Python name"),
])
def test_humaneval_tests_that_cannot_decide_are_refused(tmp_path, test, message):
    lines = gzip.decompress((SHARED_DATA / "humaneval" / "HumanEval.jsonl.gz").read_bytes()).decode().splitlines()
    record = json.loads(lines[3])
    if test is None:
        record["entry_point"] = "below zero"
    else:
        record["test"] = test
    path = tmp_path / "he.jsonl"
    path.write_text("\n".join([lines[0], json.dumps(record)]) + "\n")
    with pytest.raises(BenchmarkError, match=rf"record 1 \(HumanEval/3\) of {path}: its test {message}"):
        build_benchmark("h", {"kind": "humaneval", "source": {"path": str(path)}}).items()


@pytest.mark.parametrize(("field", "value"), [("answer", 18), ("answer", ["#### 18"]), ("question", None)])
def test_a_gsm8k_record_that_is_not_text_is_named(tmp_path, field, value):
    lines = (SHARED_DATA / "gsm8k" / "test.jsonl").read_text().splitlines()[:3]
    record = json.loads(lines[2])
    record[field] = value
    path = tmp_path / "g.jsonl"
    path.write_text("\n".join(lines[:2] + [json.dumps(record)]) + "\n")
    with pytest.raises(BenchmarkError, match=rf"record 2 of {path}: {field} must be a string, got "):
        build_benchmark("g", {"kind": "gsm8k", "source": {"path": str(path)}}).items()


def test_a_math500_answer_that_is_a_number_is_read_as_text(tmp_path):
    lines = (SHARED_DATA / "math500" / "test.jsonl").read_text().splitlines()[:2]
    record = json.loads(lines[1])
    record["problem"] = 7
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join([lines[0], json.dumps(record)]) + "\n")
    with pytest.raises(BenchmarkError, match=r"item 1 \(math500-.*\): its question must be a string, got int"):
        build_benchmark("m", {"kind": "math500", "source": {"path": str(path)}}).items()


def test_a_record_with_a_lone_surrogate_is_refused_naming_file_and_record(tmp_path):
    lines = (SHARED_DATA / "gsm8k" / "test.jsonl").read_text().splitlines()[:2]
    path = tmp_path / "g.jsonl"
    path.write_text(lines[0] + "\n" + lines[1].replace('"question": "', '"question": "\\ud83d ', 1) + "\n")
    with pytest.raises(BenchmarkError, match=rf"record 1 of {path}: question: .*lone surrogate"):
        build_benchmark("g", {"kind": "gsm8k", "source": {"path": str(path)}}).items()


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl", ".parquet"])
def test_reading_a_data_file_is_capped(tmp_path, suffix):
    """A small gzip (or Parquet) file that inflates past the cap is refused after reading at
    most the cap, never all of it: the error names the file and the limit."""
    path = tmp_path / f"bomb{suffix}"
    size = sources.MAX_DATA_BYTES + 1024
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        column = pa.array([f"{i:06d}" + " " * 2**20 for i in range(size // 2**20 + 1)])
        pq.write_table(pa.table({"question": column}), path, compression="zstd", use_dictionary=False)
        assert path.stat().st_size < 2**20
    elif suffix.endswith(".gz"):
        with gzip.open(path, "wb", compresslevel=9) as fh:
            for _ in range(size // 2**20 + 1):
                fh.write(b" " * 2**20)
        assert path.stat().st_size < 2**20
    else:
        with path.open("wb") as fh:
            fh.truncate(size)
    with pytest.raises(BenchmarkError, match=rf"{path}: holds .*more than the {sources.MAX_DATA_BYTES} \(64 MiB\)"):
        build_benchmark("g", {"kind": "gsm8k", "source": {"path": str(path)}}).items()


def test_the_shipped_data_passes_every_check():
    for kind, spec in [("mbpp", {"source": {"path": str(SHARED_DATA / "mbpp" / "sanitized-mbpp.json")}}),
                       ("mbpp", {"split": "full", "source": {"path": str(SHARED_DATA / "mbpp" / "mbpp.jsonl")}}),
                       ("humaneval", {"source": {"path": str(SHARED_DATA / "humaneval" / "HumanEval.jsonl.gz")}}),
                       ("gsm8k", {"source": {"path": str(SHARED_DATA / "gsm8k" / "test.jsonl")}})]:
        bench = build_benchmark("b", {"kind": kind, **spec})
        assert len(bench.items()) in (257, 500, 164, 1319)


def test_the_longest_prompt_and_its_generation_must_fit_the_prepared_models_context(prepared_models):
    """Before any generation job, check-prompts measures the longest prompt with the model's
    tokenizer: with max_new_tokens it must fit the context the prepared config names."""
    from tokenflip.models.prepare import load_tokenizer
    from tokenflip.run.runtime import PromptFormatError, check_prompts

    model_dir = prepared_models("llama")
    assert bounds.context_length(model_dir) == 1024
    bench = build_benchmark("arith", {"kind": "arithmetic", "n": 3})
    tokenizer = load_tokenizer(model_dir)
    longest = check_prompts(tokenizer, bench)["max_tokens"]
    assert check_prompts(tokenizer, bench, 1024 - longest, 1024)["max_tokens"] == longest
    with pytest.raises(PromptFormatError, match=rf"benchmark 'arith': the longest prompt \({longest} tokens\) and "
                                                rf"max_new_tokens {1025 - longest} need 1025 positions, more than "
                                                rf"the model's context of 1024"):
        check_prompts(tokenizer, bench, 1025 - longest, 1024)


def test_the_check_is_given_the_longest_generation_of_each_model_and_benchmark():
    study = tiny_study()
    study["probes"]["kv_cache"]["max_new_tokens"] = 9
    study["probes"]["kv_cache"]["benchmarks"] = ["arith_a"]
    config = cfg.validate(study, check_data=False)
    assert bounds.longest_generation(config, "tiny", "arith_a") == 9
    assert bounds.longest_generation(config, "tiny", "arith_b") == 6


def test_a_comparison_whose_default_resolves_to_its_other_value_is_refused():
    """threads `default` is the run's `generation.threads`: with 1 there, default vs 1 would
    compare one setting with itself; vs 2 it is a real pair."""
    study = tiny_study()
    study["grids"] = [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "threads": ["default", 1, 2]}]
    study["comparisons"] = [{"axis": "threads", "a": "default", "b": 1}]
    _refused(study, "comparisons.0: threads 'default' vs 1 compares one setting with itself in engine "
                    "'transformers': both run with threads=1")
    study["comparisons"] = [{"axis": "threads", "a": "default", "b": 2}]
    config = cfg.validate(study)
    assert len(expand_pairs(config, expand_cells(config))) == len(config["benchmarks"])
    # A control that another axis makes the same (bf16 vs fp16 under the fp32 oracle) stays a pair.
    study["interventions"] = {"none": {"kind": "none"}, "oracle": {"kind": "fp32_oracle"}}
    study["grids"] = [{"precision": ["bf16", "fp16"], "cache": ["on"], "batch_size": [1], "intervention": ["oracle"]}]
    study["comparisons"] = [{"axis": "precision", "a": "bf16", "b": "fp16"}]
    cfg.validate(study)


def test_vllms_default_requests_in_flight_is_not_a_second_value_of_256():
    from tokenflip.run.engines import unavailable

    if unavailable("vllm"):
        pytest.skip(unavailable("vllm"))
    study = tiny_study()
    study["models"] = {"tiny": {"source": "random", "architecture": "llama", "overrides": {"head_dim": 64}}}
    study["grids"] = [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "engine": ["vllm"],
                       "concurrency": ["default", 256, 8]}]
    study["comparisons"] = [{"axis": "concurrency", "a": "default", "b": 256},
                            {"axis": "concurrency", "a": "default", "b": 8}]
    text = _refused(study, "comparisons.0: concurrency 'default' vs 256 compares one setting with itself in engine "
                           "'vllm': both run with max_num_seqs=256")
    assert "comparisons.1" not in text


def test_a_study_larger_than_its_limits_is_refused_before_a_cell_is_listed():
    """Counted, not listed: a benchmark of 10^9 prompts and a grid of 600,000 cells are
    refused with the figure and the bound; raising the bound in the config lets it plan."""
    study = tiny_study()
    study["benchmarks"] = {"arith": {"kind": "arithmetic", "n": 10**9}}
    study["probes"] = {}
    _refused(study, "benchmarks: 2,000,000,000 prompts to generate over the cells, more than limits.max_prompts "
                    "1,000,000")
    study = tiny_study()
    study["probes"] = {}
    study["benchmarks"] = {"arith": {"kind": "arithmetic", "n": 3}}
    study["models"] = {f"m{i}": {"source": "random", "architecture": "llama"} for i in range(100)}
    study["grids"] = [{"precision": ["fp32", "bf16", "fp16"], "cache": ["on", "off"], "batch_size": list(range(1, 1001))}]
    study["comparisons"] = []
    _refused(study, "grids: 600,000 cells, more than limits.max_cells 10,000")
    study["models"] = {"m0": {"source": "random", "architecture": "llama"}}
    study["grids"][0]["batch_size"] = list(range(1, 2001))
    _refused(study, "grids: 12,000 cells, more than limits.max_cells 10,000")
    study["limits"] = {"max_cells": 12_000}
    config = cfg.validate(study, check_data=False)
    assert len(expand_cells(config)) == 12_000 and config["limits"] == {"max_cells": 12_000, "max_prompts": 1_000_000}
