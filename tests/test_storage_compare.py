"""Cell files (schema, atomic writes, digests) and pair comparison on known inputs."""

from __future__ import annotations

import copy
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from tokenflip import compare, stats, storage
from tokenflip.plan import Cell, Pair

K = 4


def record(pid: str, index: int, tokens: list[int], logits: list[list[float]], correct=True,
           extracted="5", top_ids=None):
    steps = len(tokens)
    top_ids = np.array(top_ids or [[t, t + 1, t + 2, t + 3] for t in tokens], dtype=np.int32)
    top_logits = np.array(logits, dtype=np.float32).reshape(steps, K)
    return {"prompt_index": index, "prompt_id": pid, "batch_index": index, "prompt_ids": [1, 2, 3],
            "token_ids": tokens, "top_ids": top_ids, "top_logits": top_logits,
            "margin": list(top_logits[:, 0] - top_logits[:, 1]), "logsumexp": [0.0] * steps,
            "entropy": [0.0] * steps, "intervened": [False] * steps, "n_tokens": steps,
            "finish_reason": "length", "text": "t", "gold": "5", "extracted": extracted,
            "correct": correct, "latency_s": 0.1}


L = [4.0, 3.0, 2.0, 1.0]
L2 = [4.0, 3.5, 2.0, 1.0]  # same ids, second logit moved by 0.5


def cell_meta(of: Cell, **over):
    meta = {"kind": "cell", "cell": of.as_dict(), "cell_id": of.id,
            "settings": {"cell": of.as_dict(), "record_top_k": K, "max_new_tokens": 3},
            "model": {"weights_sha256": "w", "tokenizer_sha256": "t"},
            "environment": {"software": {"torch": "2.13.0", "transformers": "5.24.0"},
                            "device": {"name": "cpu"}},
            "token_stream_sha256": "x", "logits_sha256": "y", "wall_seconds": 1.0}
    for dotted, value in over.items():
        node = meta
        *path, last = dotted.split("__")
        for key in path:
            node = node[key]
        node[last] = value
    return meta


CELL_A = Cell("m", "b", "bf16", "on", 1, "greedy", "none")
CELL_B = Cell("m", "b", "bf16", "off", 1, "greedy", "none")


def write_pair_inputs(tmp_path, meta_b_over=None):
    a = storage.cell_table([
        record("p0", 0, [10, 11, 12], [L, L, L]),                  # identical, bitwise
        record("p1", 1, [10, 11, 12], [L, L, L]),                  # identical tokens, logits moved
        record("p2", 2, [10, 11, 12], [L, L, L], correct=True,     # flips at step 2
               top_ids=[[10, 11, 12, 13], [11, 12, 13, 14], [12, 40, 14, 15]]),
    ], K)
    b = storage.cell_table([
        record("p0", 0, [10, 11, 12], [L, L, L]),
        record("p1", 1, [10, 11, 12], [L, L2, L]),
        record("p2", 2, [10, 11, 40], [L, L2, [4.0, 3.9, 2.0, 1.0]], correct=False, extracted="7",
               top_ids=[[10, 11, 12, 13], [11, 12, 13, 14], [40, 12, 14, 15]]),
    ], K)
    pa_, pb_ = tmp_path / "a.parquet", tmp_path / "b.parquet"
    storage.write_table(a, pa_, with_digests(a, cell_meta(CELL_A)))
    storage.write_table(b, pb_, with_digests(b, cell_meta(CELL_B, **(meta_b_over or {}))))
    return pa_, pb_


def with_digests(table, meta):
    """The metadata with the digests of `table` (what `run_cell` records)."""
    return {**meta, "token_stream_sha256": storage.token_stream_digest(table),
            "logits_sha256": storage.logits_digest(table)}


def test_compare_known_divergence(tmp_path):
    pa_, pb_ = write_pair_inputs(tmp_path)
    meta = compare.compare_files(Pair("cache", CELL_A, CELL_B), pa_, pb_, tmp_path / "pair.parquet")
    rows = {r["prompt_id"]: r for r in pq.read_table(tmp_path / "pair.parquet").to_pylist()}
    assert rows["p0"]["identical"] and rows["p0"]["first_div_step"] is None
    assert rows["p0"]["max_abs_dlogit_before_div"] == 0.0 and not rows["p0"]["logit_diff_before_div"]
    assert rows["p1"]["identical"] and rows["p1"]["logit_diff_before_div"]
    assert rows["p1"]["max_abs_dlogit_before_div"] == pytest.approx(0.5)
    assert not rows["p2"]["identical"] and rows["p2"]["first_div_step"] == 2
    assert rows["p2"]["max_abs_dlogit_before_div"] == pytest.approx(0.5)
    assert rows["p2"]["margin_a_at_div"] == pytest.approx(1.0)
    assert rows["p2"]["dlogit_at_div"] == pytest.approx(1.0)  # token 40: 3.0 vs 4.0
    assert rows["p2"]["margin_b_at_div"] == pytest.approx(0.1)
    s = meta["summary"]
    assert (s["n_prompts"], s["n_diverged"], s["n_logit_diff_before_div"]) == (3, 1, 2)
    lo, hi = stats.wilson(1, 3)
    assert (s["divergence_ci_low"], s["divergence_ci_high"]) == (lo, hi)
    assert s["accuracy_a"] == 1.0 and s["accuracy_b"] == pytest.approx(2 / 3)
    assert s["mcnemar_p"] == 1.0
    assert s["semantic_agreement"] == pytest.approx(2 / 3)


def test_statistics_match_reference_values():
    # Wilson 95% for 1/3 and exact McNemar with 0 vs 6 discordant pairs (p = 2 * 0.5^6).
    lo, hi = stats.wilson(1, 3)
    assert lo == pytest.approx(0.0615, abs=1e-4) and hi == pytest.approx(0.7923, abs=1e-4)
    a = np.array([True] * 6 + [False] * 4)
    b = np.array([False] * 6 + [False] * 4)
    assert stats.mcnemar_exact(a, b) == pytest.approx(2 * 0.5 ** 6)


@pytest.mark.parametrize("field, value, name", [
    ("model__weights_sha256", "other", "model.weights_sha256"),
    ("environment__software__transformers", "4.0.0", "environment.software.transformers"),
    ("model__tokenizer_sha256", "tok2", "model.tokenizer_sha256"),
])
def test_incomparable_provenance_names_both_files_and_field(tmp_path, field, value, name):
    pa_, pb_ = write_pair_inputs(tmp_path, {field: value})
    with pytest.raises(compare.ComparabilityError) as err:
        compare.compare_files(Pair("cache", CELL_A, CELL_B), pa_, pb_, tmp_path / "pair.parquet")
    msg = str(err.value)
    assert str(pa_) in msg and str(pb_) in msg and repr(name) in msg
    assert not (tmp_path / "pair.parquet").exists()


def test_cells_differing_in_two_axes_are_refused(tmp_path):
    other = Cell("m", "b", "fp16", "off", 1, "greedy", "none")
    pa_, pb_ = write_pair_inputs(tmp_path, {"cell": other.as_dict()})
    with pytest.raises(compare.ComparabilityError, match=r"differ in axes \['cache', 'precision'\]"):
        compare.compare_files(Pair("cache", CELL_A, CELL_B), pa_, pb_, tmp_path / "pair.parquet")


def test_truncated_parquet_is_reported_by_name(tmp_path):
    pa_, pb_ = write_pair_inputs(tmp_path)
    data = pb_.read_bytes()
    pb_.write_bytes(data[: len(data) // 2])
    with pytest.raises(storage.StorageError, match=str(pb_)):
        compare.compare_files(Pair("cache", CELL_A, CELL_B), pa_, pb_, tmp_path / "pair.parquet")


def test_write_is_atomic(tmp_path, monkeypatch):
    table = storage.cell_table([record("p0", 0, [1, 2], [L, L])], K)
    target = tmp_path / "cell.parquet"

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        storage.write_table(table, target, {"x": 1})
    assert list(tmp_path.iterdir()) == []  # no final file, no temporary left behind


def test_round_trip_and_digests(tmp_path):
    recs = [record("p0", 0, [1, 2], [L, L2]), record("p1", 1, [3], [L])]
    table = storage.cell_table(recs, K)
    storage.write_table(table, tmp_path / "c.parquet", {"hello": "world"})
    back, meta = storage.read_table(tmp_path / "c.parquet")
    assert meta["hello"] == "world" and meta["schema_version"] == storage.SCHEMA_VERSION
    assert back.column("token_ids").to_pylist() == [[1, 2], [3]]
    assert back.column("top_logits")[0].as_py()[1] == L2
    assert storage.token_stream_digest(back) == storage.token_stream_digest(table)
    assert storage.logits_digest(back) == storage.logits_digest(table)
    changed = storage.cell_table([record("p0", 0, [1, 2], [L, L]), record("p1", 1, [3], [L])], K)
    assert storage.token_stream_digest(changed) == storage.token_stream_digest(table)
    assert storage.logits_digest(changed) != storage.logits_digest(table)
    other_tokens = storage.cell_table([record("p0", 0, [1, 5], [L, L2]), record("p1", 1, [3], [L])], K)
    assert storage.token_stream_digest(other_tokens) != storage.token_stream_digest(table)
