"""Completions as text, and what the report says of them without a browser: both sides of a
diverged prompt split at the first differing token (exactly the tokenizer's decoding of the
stored ids), truncation counted, answerless agreement counted, nothing pooled over engines
or models, settings in words, one colour per condition, a bounded page for 1,000 pairs."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest

from tokenflip.analysis import texts as completions
from tokenflip.report import common, diverged, page, tables


@pytest.fixture(scope="module")
def tokenizer():
    """The tokenizer random models borrow (the default model's, SmolLM2's byte-level BPE)."""
    from tokenflip.models.prepare import RANDOM_TOKENIZER, _load_tokenizer

    return _load_tokenizer(RANDOM_TOKENIZER)


@pytest.fixture(scope="module")
def decode(tokenizer):
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def _partial_byte_tokens(decode) -> list[int]:
    """Token ids that decode to part of a character on their own (byte tokens)."""
    return [i for i in range(400) if "\ufffd" in decode([i])][:4]


@pytest.mark.parametrize("case", ["word", "partial character", "one side ends"])
def test_both_sides_are_exactly_the_tokenizers_decoding(tokenizer, decode, case):
    encode = tokenizer.encode
    shared = encode("Janet's ducks lay 16 eggs per day.")
    if case == "word":
        a, b = shared + encode(" She eats three"), shared + encode(" Every morning she")
    elif case == "partial character":
        bytes_ = _partial_byte_tokens(decode)
        assert len(bytes_) == 4
        a, b = shared + bytes_[:2] + encode(" x"), shared + bytes_[2:] + encode(" y")
    else:
        a, b = shared + encode(" Done"), shared
    step = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    parts = completions.split_at(decode, a, b, step)
    assert parts["prefix"] + parts["token_a"] + parts["rest_a"] == decode(a) == parts["text_a"]
    assert parts["prefix"] + parts["token_b"] + parts["rest_b"] == decode(b) == parts["text_b"]
    assert decode(shared).startswith(parts["prefix"]) and parts["token_a"]
    if case == "word":
        assert parts["prefix"] == decode(shared) and parts["token_a"] != parts["token_b"]
    if case == "one side ends":
        assert parts["token_b"] == "" and parts["rest_b"] == ""


def test_truncation_counts_cut_completions_and_those_without_an_answer():
    table = pa.table({"finish_reason": ["length", "length", "stop", "eos"],
                      "verdict": ["no_answer", "wrong", "no_answer", "right"]})
    assert completions.truncation(table, {"settings": {"max_new_tokens": 48}}) == {
        "n_cut": 2, "n_cut_no_answer": 1, "max_new_tokens": 48}


def test_two_missing_answers_are_counted_apart():
    per_prompt = pd.DataFrame({"verdict_a": ["no_answer", "no_answer", "right", "no_code"],
                               "verdict_b": ["no_answer", "wrong", "right", "no_code"],
                               "same_answer": [True, False, True, True]})
    assert completions.answerless_agreements(per_prompt) == 2


def _pair_row(engine: str, model: str = "m", n_diverged: int = 1, precision: str = "fp32", **extra):
    return {"pair_id": f"{model}/{engine}/{precision}", "axis": "cache", "a": "on", "b": "off", "model": model,
            "benchmark": "gsm8k", "engine": engine, "precision": precision, "decoding": "greedy",
            "batch_size": 1.0, "cache": None, "intervention": "none", "status": "done", "n_prompts": 12,
            "n_diverged": n_diverged, "divergence_rate": n_diverged / 12, "divergence_ci_low": 0.0,
            "divergence_ci_high": 0.4, "n_logit_diff_before_div": 3, "max_abs_dlogit": 0.5, "accuracy_a": 0.5,
            "accuracy_b": 0.5, **extra}


def test_the_kv_table_and_bullets_keep_engines_and_models_apart():
    pairs = pd.DataFrame([_pair_row("transformers", n_diverged=0), _pair_row("llama.cpp", n_diverged=1),
                          _pair_row("transformers", model="random", n_diverged=2)])
    rows = tables.kv_table(pairs)
    assert [(r["model"], r["engine"]) for r in rows] == [("m", "llama.cpp"), ("m", "transformers"),
                                                         ("random", "transformers")]
    groups = tables.kv_claims(rows)["groups"]
    assert [(g["model"], g["engine"], g["precision"], g["diverged"], g["n"]) for g in groups] == [
        ("m", "llama.cpp", "fp32", 1, 12), ("m", "transformers", "fp32", 0, 12), ("random", "transformers", "fp32", 2, 12)]


def test_findings_keep_engines_apart_and_say_when_no_token_changed():
    lines = page._headline(pd.DataFrame([_pair_row("transformers", n_diverged=0),
                                         _pair_row("llama.cpp", n_diverged=2, threads="default")]))
    assert len(lines) == 2
    moved, still = lines
    assert moved.startswith("KV cache on vs off: 2 of 12 prompts diverged")
    assert "inference engine llama.cpp" in moved and "m on gsm8k" in moved and "batch size 1," in moved
    assert "before the first differing token" in moved
    assert still.startswith("KV cache on vs off: 0 of 12") and "no token changed" in still
    assert "before the first" not in still and "1.0" not in " ".join(lines)


def test_settings_read_in_words():
    gated = {"C_gated": {"kind": "fp32_head", "tau": 0.001, "gated": True}}
    assert page.pair_words("kv_dtype", "default", "fp8_e5m2") == (
        "KV cache kept in the compute precision vs KV cache stored in FP8 E5M2 (kv_dtype)")
    assert page.pair_words("prefill_chunk", "default", "16").endswith("prompt prefilled 16 tokens at a time (prefill_chunk)")
    assert page.pair_words("intervention", "none", "C_gated", {"none": {"kind": "none"}, **gated}) == (
        "no intervention vs C_gated (the LM head recomputed in fp32, gated by margin < 0.001) (intervention)")
    # No intervention is known by its kind, whatever the config calls it.
    assert page.pair_words("intervention", "baseline", "C_gated", {"baseline": {"kind": "none"}, **gated}).startswith(
        "no intervention vs C_gated")
    assert page.pair_words("batch_size", 1, 4) == "batch size 1 vs 4"
    assert common.in_words({"precision": "fp32", "cache": "on", "kv_dtype": "fp8_e4m3"}) == (
        "fp32, cache on, KV cache stored in FP8 E4M3")


def test_a_condition_keeps_its_colour_across_figures():
    assert common.palette(["fp16", "fp32"])["fp16"] == common.palette(["bf16", "fp16", "fp32"])["fp16"]
    assert len(set(common.palette(["fp32", "bf16", "fp16", "x", "y"]).values())) == 5


def test_unmeasured_accuracy_is_named_in_the_findings():
    cells = pd.DataFrame([{"cell_id": "m/b/fp32", "status": "done", "n_prompts": 24, "n_cut_no_answer": 24,
                           "max_new_tokens": 48},
                          {"cell_id": "m/b/bf16", "status": "done", "n_prompts": 24, "n_cut_no_answer": 3,
                           "max_new_tokens": 48}])
    unmeasured = page._unmeasured(cells)
    assert unmeasured == {"m/b/fp32": "24 of 24 cut at 48 tokens"}
    assert page._truncation_lines(cells, unmeasured) == [
        "m/b/fp32: 24 of 24 cut at 48 tokens before any answer: accuracy is not measured (raise max_new_tokens)."]


def test_cpu_features_come_from_the_recorded_flags():
    device = {"type": "cpu", "cpu_flags": ["avx2", "fma", "avx512f", "avx512_bf16"]}
    assert page.cpu_features(device) == [("avx2", True), ("avx512_bf16", True), ("avx512_fp16", False),
                                         ("amx", False)]
    assert page.cpu_features({"type": "cuda", "name": "H100"}) == []


def test_a_thousand_pairs_show_a_bounded_number_of_texts():
    topk = json.dumps([["a", 1, 0.5], ["b", 2, 0.4]])
    rows = [{"pair_id": f"p{i:04d}", "prompt_id": f"q{j}", "step": j, "prefix_chars": 1000, "token_a": "a",
             "token_b": "b", "text_a": "x" * 1000 + "a" + "y" * 1000, "text_b": "x" * 1000 + "bz", "token_id_a": 1, "token_id_b": 2, "topk_a": topk,
             "topk_b": topk, "correct_a": True, "correct_b": None, "verdict_a": "right", "verdict_b": "no_answer",
             "finish_a": "eos", "finish_b": "length", "n_tokens_a": 5, "n_tokens_b": 48}
            for i in range(1000) for j in range(5)]
    pairs = pd.DataFrame([_pair_row("transformers", model="m", pair_id=f"p{i:04d}", context=str(i))
                          for i in range(1000)])
    view = diverged.diverged_view(pd.DataFrame(rows), pairs)
    assert len(view["diverged_rows"]) == 5000 and view["diverged_total"] == 5000
    assert list(view["diverged_rows"]["pair_id"][:6]) == ["p0000"] * 5 + ["p0001"]
    assert view["diverged_shown"] == diverged.SHOWN_IN_ALL and len(view["diverged_index"]) == diverged.INDEX_ROWS
    assert len(view["diverged_anchor"]) == 1000
    first = view["diverged_pairs"][0]["shown"][0]
    assert first["prefix_tail"] == "x" * diverged.PREFIX_CHARS and first["prefix_cut"] and first["rest_a_cut"]
    assert first["rest_a_head"] == "y" * diverged.REST_CHARS and first["rest_b_head"] == "z"
    assert [len(g["shown"]) for g in view["diverged_pairs"][:51]] == [3] * 50 + [0]
    assert (first["outcome_a"], first["outcome_b"]) == ("right", "no answer, cut at 48 tokens")
    assert [c["chosen_a"] for c in first["candidates"]] == [True, False]
    assert [c["chosen_b"] for c in first["candidates"]] == [False, True]
    assert not any(c["tied_a"] or c["tied_b"] for c in first["candidates"]) and not first["tie_a"]


def test_an_exact_tie_at_the_parting_step_is_marked_on_its_side():
    """Side a's top two logits are equal (bit for bit, as stored): both are marked tied, the
    third is not; side b's top two differ by 1e-6, which is a margin, not a tie."""
    row = {"pair_id": "p", "prompt_id": "q", "step": 0, "prefix_chars": 0, "token_a": "x", "token_b": "y",
           "text_a": "x", "text_b": "y", "token_id_a": 1, "token_id_b": 2,
           "topk_a": json.dumps([["x", 1, 3.25], ["y", 2, 3.25], ["z", 3, 1.0]]),
           "topk_b": json.dumps([["y", 2, 3.250001], ["x", 1, 3.25], ["z", 3, 1.0]]),
           "correct_a": True, "correct_b": False, "verdict_a": "correct", "verdict_b": "wrong",
           "finish_a": "eos", "finish_b": "eos", "n_tokens_a": 1, "n_tokens_b": 1, "model": "m", "benchmark": "b",
           "axis": "precision", "a": "fp32", "b": "bf16", "margin_a": 0.0, "margin_b": 1e-6, "extracted_a": None,
           "extracted_b": None, "cause": "exact tie", "rejoin_step": None, "same_answer": True}
    view = diverged.diverged_view(pd.DataFrame([row]), pd.DataFrame([_pair_row("transformers", model="m",
                                                                              pair_id="p", context="0")]))
    shown = view["diverged_pairs"][0]["shown"][0]
    assert [c["tied_a"] for c in shown["candidates"]] == [True, True, False]
    assert [c["tied_b"] for c in shown["candidates"]] == [False, False, False]
    assert (shown["tie_a"], shown["tie_b"]) == (True, False)
    html = page._TEMPLATES.get_template("diverged.html.j2").render(**view)
    assert html.count('class="tie-mark"') == 2 and html.count("(an exact tie)") == 1
    assert '<span class="cause" title="a side&#39;s top two logits were equal' in html
    assert "never rejoined" in html and "same final answer" in html


def test_a_rejoin_step_read_back_from_parquet_is_shown_as_it_is():
    """Through Parquet a prompt that never rejoined holds NaN beside one that did (a float
    column): the view says "never rejoined", not step 0; a summary made before the labels
    (no such columns) renders without them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = {"pair_id": "p", "step": 1, "prefix_chars": 0, "token_a": "x", "token_b": "y", "text_a": "x",
            "text_b": "y", "token_id_a": 1, "token_id_b": 2, "topk_a": "[]", "topk_b": "[]", "correct_a": True,
            "correct_b": False, "verdict_a": "correct", "verdict_b": "wrong", "finish_a": "eos", "finish_b": "eos",
            "n_tokens_a": 9, "n_tokens_b": 9, "model": "m", "benchmark": "b", "axis": "precision", "a": "fp32",
            "b": "bf16", "margin_a": 0.5, "margin_b": 0.5, "extracted_a": None, "extracted_b": None}
    rows = [{**base, "prompt_id": "q1", "cause": "drift", "rejoin_step": 3, "same_answer": True},
            {**base, "prompt_id": "q2", "cause": "near-tie", "rejoin_step": None, "same_answer": False}]
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pandas(pd.DataFrame(rows)), buffer)
    frame = pq.read_table(pa.BufferReader(buffer.getvalue())).to_pandas()
    assert frame["rejoin_step"].dtype.kind == "f"  # the case: NaN beside 3.0
    pairs = pd.DataFrame([_pair_row("transformers", model="m", pair_id="p", context="0")])
    html = page._TEMPLATES.get_template("diverged.html.j2").render(**diverged.diverged_view(frame, pairs))
    assert "rejoined at step 3" in html and "never rejoined" in html and "rejoined at step 0" not in html
    assert "final answer differs" in html and "same final answer" in html
    old = frame.drop(columns=["cause", "rejoin_step", "same_answer"])
    html = page._TEMPLATES.get_template("diverged.html.j2").render(**diverged.diverged_view(old, pairs))
    assert "never rejoined" not in html and "rejoined at step" not in html and "parted at step 1" in html
    assert "same final answer" not in html and "final answer differs" not in html


def _cell_file(path, tokens: list[list[int]], decode) -> str:
    import numpy as np

    from tokenflip.core import storage

    records = [{"prompt_index": i, "prompt_id": f"p{i}", "batch_index": i, "prompt_ids": [1], "token_ids": ids,
                "top_ids": np.asarray([[t, t + 1] for t in ids], np.int32),
                "top_logits": np.asarray([[1.0, 0.5]] * len(ids), np.float32), "margin": [0.5] * len(ids),
                "logsumexp": [0.0] * len(ids), "entropy": [0.0] * len(ids), "intervened": [False] * len(ids),
                "n_tokens": len(ids), "finish_reason": "length", "text": decode(ids), "gold": "1", "extracted": None,
                "correct": False, "answer_rule": "none", "verdict": "no_answer", "latency_s": 0.0}
               for i, ids in enumerate(tokens)]
    storage.write_table(storage.cell_table(records, 2), path, {"kind": "cell"})
    return str(path)


def test_without_the_prepared_tokenizer_the_stored_texts_are_shown_unmarked(tokenizer, decode, tmp_path):
    """resources/ removed after the run: the rows keep the texts the cells stored (the same
    tokenizer's decoding, made when they ran) and say that they are not split."""
    from tokenflip.core.specs import Cell, Pair

    a_ids, b_ids = tokenizer.encode("Janet lays 16 eggs"), tokenizer.encode("Janet's ducks lay")
    step = next(i for i, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y)
    cell_a = Cell("m", "b", "fp32", "on", 1, "greedy", "none")
    pair = Pair("precision", cell_a, Cell("m", "b", "bf16", "on", 1, "greedy", "none"))
    prompts = pd.DataFrame({"prompt_id": ["p0"], "first_div_step": [float(step)]})
    paths = _cell_file(tmp_path / "a.parquet", [a_ids], decode), _cell_file(tmp_path / "b.parquet", [b_ids], decode)
    (split,) = completions.pair_diverged(pair, prompts, *paths, decode)
    (unsplit,) = completions.pair_diverged(pair, prompts, *paths, None)
    assert split["text_a"] == unsplit["text_a"] == decode(a_ids) and unsplit["text_b"] == decode(b_ids)
    assert split["prefix_chars"] == len(decode(a_ids[:step])) and unsplit["prefix_chars"] is None
    assert unsplit["token_a"] is None and json.loads(unsplit["topk_a"])[0] == [None, a_ids[step], 1.0]
    assert completions.parts(unsplit) == {"prefix": "", "rest_a": decode(a_ids), "rest_b": decode(b_ids)}
    shown = diverged._shown({**unsplit, "correct_a": False, "correct_b": False, "finish_a": "length",
                             "finish_b": "length"})
    assert shown["unsplit"] and shown["rest_a_head"] == decode(a_ids)[:diverged.REST_CHARS]
