"""Cell files (schema, atomic writes, digests) and pair comparison on known inputs."""

from __future__ import annotations

import copy
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from tokenflip.analysis import compare
from tokenflip.analysis import statistics as stats
from tokenflip.core import storage
from tokenflip.study.plan import Cell, Pair

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
            "correct": correct, "answer_rule": "####" if extracted is not None else "none",
            "verdict": "no_answer" if extracted is None else "correct" if correct else "wrong", "latency_s": 0.1}


L = [4.0, 3.0, 2.0, 1.0]
L2 = [4.0, 3.5, 2.0, 1.0]  # same ids, second logit moved by 0.5


def cell_meta(of: Cell, **over):
    meta = {"kind": "cell", "cell": of.as_dict(), "cell_id": of.id,
            "settings": {"cell": of.as_dict(), "record_top_k": K, "max_new_tokens": 3,
                         "decoding": {"strategy": "greedy"}},
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
    # bf16 at a top logit of 4: one step is 2^(2-7) = 0.03125; both margins are wider and the
    # logits had moved by 1.0 by then: drift. The single differing last token never rejoins.
    assert rows["p2"]["cause"] == "drift" and rows["p2"]["rejoin_step"] is None
    assert rows["p0"]["cause"] is None
    s = meta["summary"]
    assert (s["n_prompts"], s["n_diverged"], s["n_logit_diff_before_div"]) == (3, 1, 2)
    # The interval and the paired test are the run summary's, from the same per-prompt table
    # (a comparison job does not import statsmodels for them).
    assert not {"divergence_ci_low", "divergence_ci_high", "mcnemar_p"} & set(s)
    full = compare.summarize(pq.read_table(tmp_path / "pair.parquet"))
    lo, hi = stats.wilson(1, 3)
    assert (full["divergence_ci_low"], full["divergence_ci_high"]) == (lo, hi) and full["mcnemar_p"] == 1.0
    assert {k: v for k, v in full.items() if k in s} == s
    assert s["accuracy_a"] == 1.0 and s["accuracy_b"] == pytest.approx(2 / 3)
    assert s["semantic_agreement"] == pytest.approx(2 / 3)
    assert (s["n_drift"], s["n_near_tie"], s["n_rejoined"], s["n_answer_differs"]) == (1, 0, 0, 1)


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


# --- Every pair summary figure on per-prompt tables computed by hand -----------------------
#
# Six prompts, top-4 logits chosen as short binary fractions (exact in float32). Per step
# the top-2 margin is logit[0] - logit[1]; "Δ" is the largest |logit_a - logit_b| over the
# token ids in both top-4 lists.
TIE = [4.0, 4.0, 2.0, 1.0]        # margin 0: a near-tie (below compare.NEAR_TIE)
UP = [4.5, 4.0, 2.0, 1.0]         # TIE with the top logit moved by 0.5
LOW = [4.0, 3.0, 2.0, 1.25]       # L with the fourth logit moved by 0.25


def hand_tables():
    a = storage.cell_table([
        # p0: identical, bitwise. Margins 1, 1, 1.
        record("p0", 0, [10, 11, 12], [L, L, L]),
        # p1: identical tokens; step 1 is a tie in a (margin 0), b's top logit is 0.5 higher.
        record("p1", 1, [20, 21, 22], [L, TIE, L]),
        # p2: parts at step 2 (a takes 32 with margin 0.25, b takes 99); step 1 moved by 0.25.
        record("p2", 2, [30, 31, 32], [L, L, [4.0, 3.75, 2.0, 1.0]],
               top_ids=[[30, 31, 32, 33], [31, 32, 33, 34], [32, 99, 34, 35]]),
        # p3: b stops after 2 tokens, a goes on to 4; same answer, both wrong.
        record("p3", 3, [40, 41, 42, 43], [TIE, L, L, L], correct=False, extracted="4"),
        # p4: parts at step 0: a takes 50 with margin 0.5, b takes 60.
        record("p4", 4, [50], [[4.0, 3.5, 2.0, 1.0]], top_ids=[[50, 60, 52, 53]]),
        # p5: parts at step 1 on an exact tie that b breaks the other way.
        record("p5", 5, [70, 71], [L, TIE], top_ids=[[70, 71, 72, 73], [71, 80, 73, 74]]),
    ], K)
    b = storage.cell_table([
        record("p0", 0, [10, 11, 12], [L, L, L]),
        record("p1", 1, [20, 21, 22], [L, UP, L]),
        record("p2", 2, [30, 31, 99], [L, LOW, [4.0, 3.5, 2.0, 1.0]], correct=False, extracted="7",
               top_ids=[[30, 31, 32, 33], [31, 32, 33, 34], [99, 32, 34, 35]]),
        record("p3", 3, [40, 41], [TIE, L], correct=False, extracted="4"),
        record("p4", 4, [60], [[4.0, 3.75, 2.0, 1.0]], correct=False, extracted="6", top_ids=[[60, 50, 52, 53]]),
        record("p5", 5, [70, 80], [L, TIE], correct=False, extracted=None,
               top_ids=[[70, 71, 72, 73], [80, 71, 73, 74]]),
    ], K)
    return a, b


@pytest.fixture(scope="module")
def hand_rows():
    return {r["prompt_id"]: r for r in compare.compare_tables(*hand_tables(), K).to_pylist()}


@pytest.fixture(scope="module")
def hand_summary():
    return compare.summarize(compare.compare_tables(*hand_tables(), K))


def test_per_prompt_rows_by_hand(hand_rows):
    # (identical, first_div_step, steps_compared, steps_logit_diff, n_tokens_a, n_tokens_b,
    #  logit_diff_before_div, max_abs_dlogit_before_div, dlogit_at_div, margin_a_at_div,
    #  margin_b_at_div, rms_dlogit_before_div, mean_margin_a, mean_margin_b, near_ties_a, same_answer)
    # p0: Δ = 0, 0, 0 over 3 steps.
    # p1: Δ = 0, 0.5 (id 21: 4 vs 4.5), 0 -> 1 step differs, rms sqrt(0.25 / 3).
    # p2: first_div 2, steps 0..2 compared; Δ before = 0, 0.25 (id 34: 1 vs 1.25);
    #     at step 2 ids 32: |4 - 3.5| = 0.5, 99: |3.75 - 4| = 0.25 -> 0.5; rms sqrt(0.0625 / 2).
    # p3: no token differs in the 2 shared steps, lengths differ: first_div = 2 = min length,
    #     steps 0..1 compared (Δ 0, 0), nothing at the divergence step (b has none).
    # p4: first_div 0, nothing before it (max 0, rms None); at step 0 id 50: |4 - 3.75| = 0.25,
    #     id 60: |3.5 - 4| = 0.5 -> 0.5; margins a 0.5, b 0.25.
    # p5: first_div 1; Δ before = 0; at step 1 ids 71 and 80 are 4 in both: Δ 0, margins 0.
    expected = {
        "p0": (True, None, 3, 0, 3, 3, False, 0.0, None, None, None, 0.0, 1.0, 1.0, 0, True),
        "p1": (True, None, 3, 1, 3, 3, True, 0.5, None, None, None, (0.25 / 3) ** 0.5, 2 / 3, 5 / 6, 1, True),
        "p2": (False, 2, 3, 1, 3, 3, True, 0.25, 0.5, 0.25, 0.5, (0.0625 / 2) ** 0.5, 0.75, 5 / 6, 0, False),
        "p3": (False, 2, 2, 0, 4, 2, False, 0.0, None, None, None, 0.0, 0.75, 0.5, 1, True),
        "p4": (False, 0, 1, 0, 1, 1, False, 0.0, 0.5, 0.5, 0.25, None, 0.5, 0.25, 0, False),
        "p5": (False, 1, 2, 0, 2, 2, False, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 1, False),
    }
    fields = ("identical", "first_div_step", "steps_compared", "steps_logit_diff", "n_tokens_a", "n_tokens_b",
              "logit_diff_before_div", "max_abs_dlogit_before_div", "dlogit_at_div", "margin_a_at_div",
              "margin_b_at_div", "rms_dlogit_before_div", "mean_margin_a", "mean_margin_b", "near_ties_a",
              "same_answer")
    for pid, values in expected.items():
        row = hand_rows[pid]
        for name, value in zip(fields, values):
            if isinstance(value, float):
                assert row[name] == pytest.approx(value, abs=1e-12), (pid, name)
            else:
                assert row[name] == value, (pid, name)


# The summary of the six prompts above, one figure per test. Per prompt (from the rows):
#   prompt            p0    p1    p2    p3    p4    p5
#   identical         yes   yes   no    no    no    no      -> 4 of 6 diverged
#   first_div_step    -     -     2     2     0     1
#   steps before div  3     3     2     2     0     1       (steps_compared if identical) -> 11
#   steps Δ > 0       0     1     1     0     0     0       -> 2
#   correct a / b     T/T   T/T   T/F   F/F   T/F   T/F
#   n_tokens a / b    3/3   3/3   3/3   4/2   1/1   2/2
def test_summary_has_exactly_the_figures_pinned_below(hand_summary):
    assert len(hand_summary) == 39


def test_summary_scored_prompts(hand_summary):
    assert (hand_summary["n_scored"], hand_summary["n_unscored"]) == (6, 0)  # every prompt has a verdict


def test_summary_n_prompts(hand_summary):
    assert hand_summary["n_prompts"] == 6


def test_summary_n_diverged(hand_summary):
    assert hand_summary["n_diverged"] == 4  # p2..p5


def test_summary_divergence_rate(hand_summary):
    assert hand_summary["divergence_rate"] == pytest.approx(4 / 6, abs=1e-12)


def _wilson_by_hand(count, n, z=1.959963984540054):
    """Wilson score interval: (p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)."""
    p = count / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return centre - half, centre + half


def test_summary_divergence_ci_low(hand_summary):
    # 4/6: p = 2/3, z = 1.959964, z²/n = 0.640243, centre = (0.666667 + 0.320122) / 1.640243
    # = 0.601611, half = 1.194923 * sqrt(0.037037 + 0.026677) = 0.301617 -> [0.299993, 0.903229]
    assert hand_summary["divergence_ci_low"] == pytest.approx(_wilson_by_hand(4, 6)[0], abs=1e-12)
    assert hand_summary["divergence_ci_low"] == pytest.approx(0.299993, abs=1e-6)


def test_summary_divergence_ci_high(hand_summary):
    assert hand_summary["divergence_ci_high"] == pytest.approx(_wilson_by_hand(4, 6)[1], abs=1e-12)
    assert hand_summary["divergence_ci_high"] == pytest.approx(0.903229, abs=1e-6)


def test_summary_n_logit_diff_before_div(hand_summary):
    assert hand_summary["n_logit_diff_before_div"] == 2  # p1 and p2


def test_summary_logit_diff_rate(hand_summary):
    assert hand_summary["logit_diff_rate"] == pytest.approx(2 / 6, abs=1e-12)


def test_summary_step_logit_diff_rate(hand_summary):
    # steps with Δ > 0 before the divergence over steps before it: (1 + 1) / (3 + 3 + 2 + 2 + 0 + 1)
    assert hand_summary["step_logit_diff_rate"] == pytest.approx(2 / 11, abs=1e-12)


def test_summary_max_abs_dlogit(hand_summary):
    assert hand_summary["max_abs_dlogit"] == 0.5  # p1's step 1 (p2's 0.5 is at the divergence)


def test_summary_mean_first_div_step(hand_summary):
    assert hand_summary["mean_first_div_step"] == pytest.approx((2 + 2 + 0 + 1) / 4, abs=1e-12)


def test_summary_median_first_div_step(hand_summary):
    assert hand_summary["median_first_div_step"] == 1.5  # 0, 1, 2, 2


def test_summary_accuracy_a(hand_summary):
    assert hand_summary["accuracy_a"] == pytest.approx(5 / 6, abs=1e-12)


def test_summary_accuracy_b(hand_summary):
    assert hand_summary["accuracy_b"] == pytest.approx(2 / 6, abs=1e-12)


def test_summary_mcnemar_p(hand_summary):
    # discordant pairs: 3 correct only in a (p2, p4, p5), 0 only in b; exact two-sided
    # binomial: 2 * P(X <= 0 | n = 3, 1/2) = 2 / 8
    assert hand_summary["mcnemar_p"] == pytest.approx(0.25, abs=1e-12)


def test_summary_semantic_agreement(hand_summary):
    # same answer: p0, p1 (identical), p3 ("4" both); not p2 ("5"/"7"), p4 ("5"/"6"), p5 ("5"/none)
    assert hand_summary["semantic_agreement"] == pytest.approx(3 / 6, abs=1e-12)


def test_summary_exact_agreement(hand_summary):
    assert hand_summary["exact_agreement"] == pytest.approx(2 / 6, abs=1e-12)


def test_summary_mean_margin_at_div(hand_summary):
    # a's margin where a divergence step exists in both: p2 0.25, p4 0.5, p5 0 (p3 has none)
    assert hand_summary["mean_margin_at_div"] == pytest.approx((0.25 + 0.5 + 0.0) / 3, abs=1e-12)


def test_summary_mean_margin_agreed(hand_summary):
    # a's mean margin over the identical prompts: p0 (1 + 1 + 1) / 3, p1 (1 + 0 + 1) / 3
    assert hand_summary["mean_margin_agreed"] == pytest.approx((1 + 2 / 3) / 2, abs=1e-12)


def test_summary_rms_max_shared_dlogit(hand_summary):
    # root of the mean, over prompts with a step before the divergence, of the per-prompt
    # mean squared Δ there: p0 0, p1 0.25 / 3, p2 0.0625 / 2, p3 0, p5 0 (p4 has no such step)
    assert hand_summary["rms_max_shared_dlogit"] == pytest.approx(((0.25 / 3 + 0.0625 / 2) / 5) ** 0.5, abs=1e-12)


def test_summary_near_tie_rate_a(hand_summary):
    # a's steps with margin < 1e-3: p1 step 1, p3 step 0, p5 step 1, over 3+3+3+4+1+2 steps
    assert hand_summary["near_tie_rate_a"] == pytest.approx(3 / 16, abs=1e-12)


def test_summary_mean_margin_a(hand_summary):
    # mean over prompts of a's mean margin: 1, 2/3, 0.75, 0.75, 0.5, 0.5
    assert hand_summary["mean_margin_a"] == pytest.approx((1 + 2 / 3 + 0.75 + 0.75 + 0.5 + 0.5) / 6, abs=1e-12)


def test_summary_mean_cascade_length(hand_summary):
    # a's tokens from the divergence on: p2 3-2, p3 4-2, p4 1-0, p5 2-1
    assert hand_summary["mean_cascade_length"] == pytest.approx((1 + 2 + 1 + 1) / 4, abs=1e-12)


def test_summary_n_length_differs(hand_summary):
    assert hand_summary["n_length_differs"] == 1  # p3


def test_summary_mean_abs_length_diff(hand_summary):
    # over the diverged prompts: |3-3|, |4-2|, |1-1|, |2-2|
    assert hand_summary["mean_abs_length_diff"] == pytest.approx(2 / 4, abs=1e-12)


def test_summary_median_margins(hand_summary):
    # at the divergence step: median of 0.25, 0.5, 0 = 0.25; agreed: median of 1 and 2/3 = 5/6
    assert hand_summary["median_margin_at_div"] == pytest.approx(0.25, abs=1e-12)
    assert hand_summary["median_margin_agreed"] == pytest.approx(5 / 6, abs=1e-12)


def test_summary_max_abs_length_diff(hand_summary):
    # over the diverged prompts: |3-3|, |4-2|, |1-1|, |2-2| -> 2
    assert hand_summary["max_abs_length_diff"] == 2


def test_summary_n_correctness_flips(hand_summary):
    assert hand_summary["n_correctness_flips"] == 3  # p2, p4, p5
