"""The report's condition labels: nothing that differs between two pairs of one axis is
pooled under one label (the engine, vLLM's knobs), and heatmap column labels break so that
neighbours do not run together."""

from __future__ import annotations

import pandas as pd

from tokenflip.report.common import condition_labels
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
