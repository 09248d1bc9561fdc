"""The report's labels: nothing that differs between two pairs of one axis is pooled under
one label (the engine, vLLM's knobs), heatmap column labels break so that neighbours do not
run together, an axis value reads as a phrase, and an audit's report (live endpoint cells
beside a local reference) says what each number counts and whose it is."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tokenflip.analysis import compare, summary, texts
from tokenflip.analysis.decision import with_decisions
from tokenflip.core import storage
from tokenflip.core.specs import Cell, Pair
from tokenflip.report import diverged, page, tables
from tokenflip.report.common import condition_labels, in_words
from tokenflip.report.overview import _column_label


def _pairs(rows):
    columns = ["axis", "a", "b", "precision", "engine", "concurrency", "repeat"]
    return pd.DataFrame([dict(zip(columns, r)) for r in rows])


def test_pairs_that_differ_in_engine_or_a_vllm_knob_get_their_own_label():
    # config/vllm.yaml's precision and engine pairs, as the summary holds them
    pairs = _pairs([("precision", "fp32", "bf16", None, "transformers", "default", "default"),
                    ("precision", "fp32", "bf16", None, "vllm", "1", "default"),
                    ("precision", "fp32", "bf16", None, "vllm", "default", "default"),
                    ("engine", "transformers", "vllm", "bf16", None, "default", "default"),
                    ("engine", "transformers", "vllm", "fp32", None, "default", "default"),
                    ("engine", "llama.cpp", "vllm", "fp32", None, "default", "default")])
    assert condition_labels(pairs).tolist() == [
        "precision: fp32 vs bf16 · transformers",
        "precision: fp32 vs bf16 · vllm · concurrency 1",
        "precision: fp32 vs bf16 · vllm",
        "engine: transformers vs vllm · bf16",
        "engine: transformers vs vllm · fp32",
        "engine: llama.cpp vs vllm · fp32"]


def test_settings_shared_by_every_pair_of_an_axis_and_repeats_stay_out_of_the_label():
    pairs = _pairs([("cache", "on", "off", "fp16", "transformers", "default", "default"),
                    ("cache", "on", "off", "fp16", "transformers", "default", "2"),
                    ("precision", "bf16", "fp16", None, "transformers", "default", "default")])
    assert condition_labels(pairs).tolist() == ["cache: on vs off", "cache: on vs off", "precision: bf16 vs fp16"]


def test_a_long_column_label_breaks_before_vs_and_no_line_outgrows_its_cell_by_much():
    assert _column_label("engine: transformers vs vllm · fp32") == "engine\ntransformers\nvs vllm\nfp32"
    assert _column_label("kv_dtype: default vs fp8_e5m2") == "kv_dtype\ndefault\nvs fp8_e5m2"
    assert _column_label("prefix_cache: off vs cold") == "prefix_cache\noff vs cold"
    assert _column_label("engine: transformers vs llama.cpp") == "engine\ntransformers\nvs\nllama.cpp"


# --- A live endpoint's report (a tokenflip audit: endpoint cells and a local reference) ---------

def _records(completions: dict[str, list[int]], verdict: str = "no_answer") -> list[dict]:
    return [{"prompt_index": i, "prompt_id": pid, "batch_index": 0, "prompt_ids": [1], "token_ids": ids,
             "top_ids": np.asarray([[t, 9] for t in ids], np.int32),
             "top_logits": np.asarray([[1.0, 0.5]] * len(ids), np.float32), "margin": [0.5] * len(ids),
             "logsumexp": [0.0] * len(ids), "entropy": [0.0] * len(ids), "intervened": [False] * len(ids),
             "n_tokens": len(ids), "finish_reason": "length", "text": "x", "gold": "4", "extracted": None,
             "correct": False if verdict == "no_answer" else None, "answer_rule": "last number", "verdict": verdict,
             "latency_s": 0.0} for i, (pid, ids) in enumerate(completions.items())]


def _meta(cell: Cell) -> dict:
    engine = {"name": "transformers", "attn_implementation": "sdpa"}
    if cell.engine == "srv":
        engine = {"name": "srv", "kind": "endpoint", "server_kind": "vllm", "scores": "logprobs",
                  "ids_from": ["server"],
                  "server": {"model_entry": {"id": "llama", "max_model_len": 4096}, "version": {"version": "0.11.0"},
                             "system_fingerprints": ["fp_a1", "fp_b2"], "headers": {"server": ["uvicorn"]}}}
    return {"environment": {"device": {"name": "cpu0", "type": "cpu"}, "software": {"transformers": "5.24.0"},
                            "determinism": {}},
            "engine": engine, "traffic": {"mean_in_flight": 1.0, "most_in_flight": 1, "attempts": 32,
                                          "background": {"mean_in_flight": 0.0}},
            "wall_seconds": 1.0, "token_stream_sha256": "0" * 64, "logits_sha256": "0" * 64,
            "settings": {"max_new_tokens": 3}, "model": {"spec": {}, "architecture": "Llama", "num_parameters": 1,
                                                         "weights_sha256": "0" * 64,
                                                         "tokenizer_sha256": "0" * 64},
            "benchmark": {"n": 2, "prompt_format": "bare", "scorer": "numeric"}}


@pytest.fixture(scope="module")
def audit_report(tmp_path_factory):
    """The report of an audit's summary, made from small cell tables without a model: a local
    transformers reference, a live endpoint `srv` (one at a time and 2 in flight, run again),
    and a comparison whose cells did not finish; every completion cut before any answer."""
    tmp = tmp_path_factory.mktemp("audit")
    ref = Cell("m", "b", "fp32", "on", 1, "greedy", "none")
    one = Cell("m", "b", "fp32", "on", 1, "greedy", "none", engine="srv")
    two = Cell("m", "b", "fp32", "on", 1, "greedy", "none", engine="srv", concurrency="2")
    again, two_again = (Cell("m", "b", "fp32", "on", 1, "greedy", "none", engine="srv", repeat="2", **kw)
                        for kw in ({}, {"concurrency": "2"}))
    off = Cell("m", "b", "fp32", "on", 1, "greedy", "none", engine="srv", logprobs="off")  # never ran
    same = {"p0": [5, 6, 7], "p1": [5, 6, 8]}
    tables = {c: storage.cell_table(_records(same if c != ref else {"p0": [5, 9, 7], "p1": [5, 6, 8]}), 2)
              for c in (ref, one, two, again, two_again)}
    metas = {c.id: _meta(c) for c in tables}
    paths = {}
    for i, (c, table) in enumerate(tables.items()):
        paths[c.id] = tmp / f"cell{i}.parquet"
        storage.write_table(table, paths[c.id], {"kind": "cell"})
    cells = pd.DataFrame([{"cell_id": c.id, **c.as_dict(), "no_intervention": True,
                           **summary.cell_row(c, t, metas[c.id])} for c, t in tables.items()]
                         + [{"cell_id": off.id, **off.as_dict(), "no_intervention": True, "status": "missing"}])
    pairs, first_div, diverged, outcomes = [], [], [], {}
    for a, b in ((ref, one), (one, two), (one, again), (again, two_again), (one, off)):
        axis = next(k for k, v in a.as_dict().items() if v != b.as_dict()[k])
        pair = Pair(axis, a, b)
        row = summary._pair_base(pair, ("none",))
        if b in tables:
            per_prompt = compare.compare_tables(tables[a], tables[b], 2)
            row.update(status="done", **compare.summarize(per_prompt), machine_a="cpu0", machine_b="cpu0",
                       n_agree_without_answer=texts.answerless_agreements(per_prompt.to_pandas()))
            prompts = per_prompt.to_pandas()
            outcomes.update(summary.paired_outcomes({pair.id: prompts}))
            prompts = prompts[prompts["first_div_step"].notna()]
            first_div += [{"pair_id": pair.id, "label": pair.label, "axis": axis, "context": pair.context,
                           "model": "m", "benchmark": "b", **r} for r in prompts[
                              ["prompt_id", *summary.FIRST_DIV_FIELDS]].to_dict("records")]
            diverged += texts.pair_diverged(pair, prompts, paths[a.id], paths[b.id], None)
        pairs.append(row)
    repeats = pd.DataFrame([{"cell_id": one.id, "run_cell_ids": [one.id, again.id], **one.as_dict(), "runs": 2,
                             "n_prompts": 2, "n_varied": 0, "max_distinct": 1, "mean_distinct": 1.0}])
    frames = {"cells": cells, "pairs": pd.DataFrame(with_decisions(pairs, outcomes, lambda r: [int(r["n_prompts"])])), "repeats": repeats,
              "first_divergence": pd.DataFrame(first_div), "diverged": pd.DataFrame(diverged, columns=texts.COLUMNS),
              "environment": pd.DataFrame(summary.environment_rows(metas), columns=["kind", "name", "json"])}
    folder = tmp / "summary"
    for name, df in frames.items():
        storage.write_table(pa.Table.from_pandas(df, preserve_index=False), folder / f"{name}.parquet",
                            {"kind": "summary"})
    html = page.render(folder, tmp / "report" / "index.html", {"run": "audit"}).read_text()
    return html, tmp / "report" / "tables"


def _text(html: str, start: str, end: str = "</section>") -> str:
    """The text of the page from `start` to `end`, tags removed, whitespace collapsed."""
    part = html[html.index(start):]
    return " ".join(re.sub(r"<[^>]+>", " ", part[:part.index(end)]).split())


def test_the_live_endpoints_table_lists_endpoint_cells_only_with_counts_as_integers(audit_report):
    html, tables = audit_report
    section = _text(html, '<section id="endpoints">')
    assert section.count("engine=srv") == 4 and "greedy-none requests" not in section  # no transformers row
    assert not re.search(r"\bnan\b", section) and "32.0" not in section and "/ 1.0" not in section
    assert "1.00 / 1 0.00 32 logprobs server" in section
    assert "engine=srv" in (tables / "endpoint.csv").read_text()


def test_the_live_endpoints_table_shows_the_servers_model_length_and_fingerprints(audit_report):
    section = _text(audit_report[0], '<section id="endpoints">')
    assert "max_model_len" in section and "llama 4096 fp_a1, fp_b2" in section


def test_an_endpoints_engine_in_the_provenance_is_its_server_not_the_local_library(audit_report):
    engines = _text(audit_report[0], 'id="engine-table"', "</table>")
    assert "transformers transformers 5.24.0" in engines
    assert "srv vllm server 0.11.0 serves llama; max_model_len 4096; fingerprints fp_a1, fp_b2; server uvicorn" \
        in engines
    assert engines.count("5.24.0") == 1


def test_the_header_counts_the_comparisons_the_verdicts_list(audit_report):
    html = audit_report[0]
    header = _text(html, "<header>", "</header>")
    # 5 pairs: 4 comparisons (1 unfinished) and the pair between the second runs, counted once.
    assert "6 cells, 4 comparisons (3 finished)" in header and "the 1 pair(s) between second runs" in header
    verdicts = _text(html, '<section id="verdicts">')
    counts = [int(n) for n in re.findall(r"(\d+) pairs?\b", verdicts[verdicts.index("finished comparisons"):])[:3]]
    assert "The 3 finished comparisons:" in verdicts and sum(counts) == 3, verdicts
    # The e-BH family: the finished pairs beside a repeat of one of their cells (the second
    # runs' pair too: it is judged, though counted once above); the guarantee in one sentence.
    assert "e-BH at 5% over the 3 judged comparisons" in verdicts
    # the first screen says what was decided, one sentence per judged comparison, before any table
    decided = _text(html, '<section id="decided">', "</section>")
    assert html.index('<section id="decided">') < html.index('<section id="headline">') < html.index("<table")
    raw = html[html.index('<section id="decided">'):html.index('<section id="headline">')]
    assert raw.count("<li data-verdict=") >= 1 and "prompts" in decided
    assert "The guarantee. With probability at least 95%, every interval" in verdicts


def test_a_diverged_prompt_without_answers_reads_no_answer_and_never_same_final_answer(audit_report):
    section = _text(audit_report[0], '<section id="diverged">')
    assert "no answer on either side" in section and "same final answer" not in section
    assert "answer nan" not in section and "answer None" not in section
    row = {"same_answer": True, "verdict_a": "no_answer", "verdict_b": "wrong", "extracted_a": float("nan"),
           "extracted_b": "4"}
    assert (diverged.answer(row, "a"), diverged.answers_agree(row)) == (None, "an answer on one side only")
    assert diverged.answers_agree({**row, "verdict_a": "correct", "extracted_a": "4"}) == "same final answer"
    assert diverged.answers_agree({**row, "verdict_a": "not_scored", "verdict_b": "not_scored"}) == (
        "answers not scored")


def test_accuracy_not_measured_in_the_pairs_table_is_not_measured_in_the_drill_down_either(audit_report):
    html = audit_report[0]
    assert "not measured" in _text(html, '<section id="pairs">')
    drill = _text(html, '<section id="drilldown">')
    assert drill.count("0.000 – –") == 3 and "0.000 0.0%" not in drill, drill  # acc. a, acc. b
    pairs = pd.DataFrame([{"cell_a": "x", "cell_b": "y", "accuracy_a": 0.0, "accuracy_b": 0.5, "mcnemar_p": 1.0}])
    masked = tables.measured_accuracy(pairs, {"x": "2 of 2 cut at 3 tokens"}).iloc[0]
    assert math.isnan(masked["accuracy_a"]) and masked["accuracy_b"] == 0.5 and math.isnan(masked["mcnemar_p"])
    assert masked["accuracy_a_of_rest"] == 0.0


@pytest.mark.parametrize("axis,a,b,words,setting", [
    ("repeat", "default", "2", "the first run vs repeat 2 (the same cell run again)",
     "repeat 2 (the same cell run again)"),
    ("load", "none", "busy", "no background load vs background load busy (load)", "background load busy"),
    ("logprobs", "on", "off", "logprobs requested vs no logprobs requested (logprobs)", "no logprobs requested"),
    ("concurrency", "default", "8", "the engine's default requests in flight vs 8 requests in flight (concurrency)",
     "8 requests in flight"),
    ("tensor_parallel", 1, 2, "the model on one device vs the model split over 2 devices (tensor_parallel)",
     "the model split over 2 devices"),
    ("engine", "transformers", "srv", "inference engine transformers vs srv", "inference engine srv"),
])
def test_an_axis_value_reads_as_a_phrase_in_comparisons_and_settings(axis, a, b, words, setting):
    assert page.pair_words(axis, a, b) == words
    assert in_words({axis: b}) == setting


def test_a_noise_floors_setting_says_no_intervention_by_its_kind(audit_report):
    floors = _text(audit_report[0], 'id="noise-floor-table"', "</table>")
    assert "greedy, no intervention, inference engine srv" in floors and "intervention none" not in floors

