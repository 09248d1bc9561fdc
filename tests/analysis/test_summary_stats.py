"""Statistics of the summaries on inputs whose answer is known by hand: the Wilson interval,
exact McNemar, and the intervention table (lift, its paired bootstrap interval, McNemar on
agreement, trigger rate and compute overhead)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from tokenflip.analysis import statistics as stats
from tokenflip.analysis.interventions import _paired_bootstrap, intervention_rows
from tokenflip.study import config as cfg
from tokenflip.study.plan import expand_cells, expand_pairs

# --- Wilson and McNemar ---------------------------------------------------------------------

def test_wilson_3_of_10_by_hand():
    # p = 0.3, n = 10, z = 1.959964 (95%), z² = 3.841459:
    # centre = (p + z²/2n) / (1 + z²/n) = (0.3 + 0.192073) / 1.384146 = 0.355507
    # half   = z / (1 + z²/n) * sqrt(p(1-p)/n + z²/4n²) = 1.416005 * sqrt(0.021 + 0.009604)
    #        = 0.247715  ->  [0.107791, 0.603222]
    z = 1.959963984540054
    centre = (0.3 + z * z / 20) / (1 + z * z / 10)
    half = z / (1 + z * z / 10) * math.sqrt(0.3 * 0.7 / 10 + z * z / 400)
    lo, hi = stats.wilson(3, 10)
    assert lo == pytest.approx(centre - half, abs=1e-12) and hi == pytest.approx(centre + half, abs=1e-12)
    assert (round(lo, 6), round(hi, 6)) == (0.107791, 0.603222)


def test_wilson_edges():
    # 0 of n: the interval starts at 0 exactly; n of n ends at 1; 0 of 0 is undefined.
    assert stats.wilson(0, 10)[0] == pytest.approx(0.0, abs=1e-15)
    assert stats.wilson(10, 10)[1] == pytest.approx(1.0, abs=1e-15)
    assert all(math.isnan(v) for v in stats.wilson(0, 0))


def test_mcnemar_exact_on_a_known_table():
    # 2x2 table: both right 2, only a right 5, only b right 1, both wrong 2. Exact test on
    # the 6 discordant pairs: 2 * P(X <= 1 | n = 6, 1/2) = 2 * (1 + 6) / 64 = 14 / 64.
    a = np.array([True] * 2 + [True] * 5 + [False] * 1 + [False] * 2)
    b = np.array([True] * 2 + [False] * 5 + [True] * 1 + [False] * 2)
    assert stats.mcnemar_exact(a, b) == pytest.approx(14 / 64, abs=1e-12)
    assert stats.mcnemar_exact(b, a) == pytest.approx(14 / 64, abs=1e-12)  # symmetric
    assert stats.mcnemar_exact(a, a) == 1.0  # no discordant pair


# --- The paired bootstrap of the lift --------------------------------------------------------

def test_bootstrap_of_all_equal_differences_is_the_lift_itself():
    # Every prompt gains 1: every resample's mean is 1, so the interval is [1, 1].
    assert _paired_bootstrap(np.ones(4), np.zeros(4)) == (1.0, 1.0)
    # Every prompt loses 1.
    assert _paired_bootstrap(np.zeros(5), np.ones(5)) == (-1.0, -1.0)
    # No prompt changes: lift 0, interval [0, 0].
    same = np.array([1.0, 0.0, 1.0])
    assert _paired_bootstrap(same, same) == (0.0, 0.0)


def test_bootstrap_of_one_prompt_is_its_difference():
    assert _paired_bootstrap(np.array([1.0]), np.array([0.0])) == (1.0, 1.0)
    assert all(math.isnan(v) for v in _paired_bootstrap(np.array([]), np.array([])))


def test_bootstrap_interval_contains_the_lift_and_lies_in_minus_one_to_one():
    # 10 prompts: 5 gain, 1 loses, 4 unchanged -> lift = (5 - 1) / 10 = 0.4.
    x = np.array([1, 1, 1, 1, 1, 0, 1, 0, 1, 0], dtype=float)
    y = np.array([0, 0, 0, 0, 0, 1, 1, 0, 1, 0], dtype=float)
    assert float(np.mean(x - y)) == pytest.approx(0.4, abs=1e-12)
    lo, hi = _paired_bootstrap(x, y)
    assert -1 <= lo <= 0.4 <= hi <= 1 and lo < hi
    assert _paired_bootstrap(x, y) == (lo, hi)  # seeded: the same interval every time


# --- The intervention table -------------------------------------------------------------------

def _study():
    return cfg.validate({
        "run": "t",
        "models": {"m": {"source": "random", "architecture": "llama"}},
        "benchmarks": {"arith": {"kind": "arithmetic", "n": 10}},
        "interventions": {"none": {"kind": "none"}, "C_gated": {"kind": "fp32_head", "tau": 0.001, "gated": True}},
        "grids": [{"precision": ["bf16", "fp16"], "cache": ["on"], "batch_size": [1],
                   "intervention": ["none", "C_gated"]}],
        "comparisons": [{"axis": "precision", "a": "bf16", "b": "fp16"}],
    })


NONE_PAIR = "m/arith/precision/bf16_vs_fp16/x-on-bs1-greedy-none"
GATED_PAIR = "m/arith/precision/bf16_vs_fp16/x-on-bs1-greedy-C_gated"


def _agreement(values: list[bool], ids: list[str] | None = None) -> pd.DataFrame:
    ids = ids or [f"p{i}" for i in range(len(values))]
    return pd.DataFrame({"agree": values}, index=pd.Index(ids, name="prompt_id"))


def _cells(seconds_per_token: dict[str, float], trigger_rate: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame({"cell_id": list(seconds_per_token), "seconds_per_token": list(seconds_per_token.values()),
                         "trigger_rate": [trigger_rate[c] for c in seconds_per_token]})


# Per-token seconds: no intervention 0.010 (bf16) + 0.020 (fp16) = 0.030; the gated fp32
# head 0.012 + 0.024 = 0.036, so its overhead is 0.036 / 0.030 - 1 = 0.2. Trigger rates:
# 0 without intervention, 0.1 and 0.3 with it (mean 0.2).
CELLS = _cells({"m/arith/bf16-on-bs1-greedy-none": 0.010, "m/arith/fp16-on-bs1-greedy-none": 0.020,
                "m/arith/bf16-on-bs1-greedy-C_gated": 0.012, "m/arith/fp16-on-bs1-greedy-C_gated": 0.024},
               {"m/arith/bf16-on-bs1-greedy-none": 0.0, "m/arith/fp16-on-bs1-greedy-none": 0.0,
                "m/arith/bf16-on-bs1-greedy-C_gated": 0.1, "m/arith/fp16-on-bs1-greedy-C_gated": 0.3})

# Agreement of bf16 and fp16 per prompt: 4 of 10 without intervention, 8 of 10 with it;
# 5 prompts gain agreement (p0..p4), 1 loses it (p5), 4 are unchanged (p6..p9).
BASE_AGREE = [False, False, False, False, False, True, True, False, True, True]
GATED_AGREE = [True, True, True, True, True, False, True, False, True, True]


@pytest.fixture(scope="module")
def intervention_table():
    study = _study()
    assert {p.id for p in expand_pairs(study, expand_cells(study))} == {NONE_PAIR, GATED_PAIR}
    rows = intervention_rows(study, {NONE_PAIR: _agreement(BASE_AGREE), GATED_PAIR: _agreement(GATED_AGREE)},
                             CELLS)
    return {row["intervention"]: row for row in rows}


def test_intervention_rows_one_per_intervention(intervention_table):
    assert sorted(intervention_table) == ["C_gated", "none"]
    assert intervention_table["C_gated"]["pair_id"] == GATED_PAIR
    assert all(row["status"] == "done" and row["n"] == 10 for row in intervention_table.values())


def test_intervention_ear(intervention_table):
    assert intervention_table["none"]["ear"] == pytest.approx(4 / 10, abs=1e-12)
    assert intervention_table["C_gated"]["ear"] == pytest.approx(8 / 10, abs=1e-12)


def test_intervention_lift(intervention_table):
    assert intervention_table["C_gated"]["lift"] == pytest.approx((5 - 1) / 10, abs=1e-12)
    assert intervention_table["none"]["lift"] == 0.0


def test_intervention_lift_ci(intervention_table):
    gated = intervention_table["C_gated"]
    assert -1 <= gated["lift_ci_low"] <= gated["lift"] <= gated["lift_ci_high"] <= 1
    assert (gated["lift_ci_low"], gated["lift_ci_high"]) == _paired_bootstrap(
        np.array(GATED_AGREE, dtype=float), np.array(BASE_AGREE, dtype=float))
    # The baseline against itself: every difference is 0, the interval is [0, 0].
    assert (intervention_table["none"]["lift_ci_low"], intervention_table["none"]["lift_ci_high"]) == (0.0, 0.0)


def test_intervention_mcnemar_p(intervention_table):
    # discordant: 5 agree only with the intervention, 1 only without: 2 * (1 + 6) / 2^6
    assert intervention_table["C_gated"]["mcnemar_p"] == pytest.approx(14 / 64, abs=1e-12)
    assert intervention_table["none"]["mcnemar_p"] == 1.0


def test_intervention_trigger_rate(intervention_table):
    assert intervention_table["C_gated"]["trigger_rate"] == pytest.approx((0.1 + 0.3) / 2, abs=1e-12)
    assert intervention_table["none"]["trigger_rate"] == 0.0


def test_intervention_overhead(intervention_table):
    assert intervention_table["C_gated"]["overhead"] == pytest.approx((0.012 + 0.024) / (0.010 + 0.020) - 1,
                                                                      abs=1e-12)
    assert intervention_table["C_gated"]["overhead"] == pytest.approx(0.2, abs=1e-12)
    assert intervention_table["none"]["overhead"] == 0.0


def test_intervention_compares_only_prompts_in_both_pairs():
    # p10 only in the intervention's pair, p0 only in the baseline's: both left out.
    study = _study()
    base = _agreement([False, True, False], ["p0", "p1", "p2"])
    gated = _agreement([True, True, True], ["p1", "p2", "p10"])
    rows = {r["intervention"]: r for r in intervention_rows(study, {NONE_PAIR: base, GATED_PAIR: gated}, CELLS)}
    gated_row = rows["C_gated"]
    assert gated_row["n"] == 2
    assert gated_row["ear"] == 1.0 and gated_row["lift"] == pytest.approx(0.5, abs=1e-12)


def test_intervention_without_its_pair_is_missing_and_without_baseline_has_no_rows():
    study = _study()
    rows = intervention_rows(study, {NONE_PAIR: _agreement(BASE_AGREE)}, CELLS)
    assert {r["intervention"]: r["status"] for r in rows} == {"C_gated": "missing", "none": "done"}
    assert "lift" not in next(r for r in rows if r["intervention"] == "C_gated")
    assert intervention_rows(study, {GATED_PAIR: _agreement(GATED_AGREE)}, CELLS) == []


# --- What a live endpoint's cell row says of its server ---------------------------------------

def test_an_endpoint_cells_row_holds_its_servers_model_length_and_fingerprints():
    from tokenflip.run.engines.endpoint.server import summary_columns

    keys = ("endpoint_model", "endpoint_max_model_len", "endpoint_fingerprints", "chat_template")

    def served(meta):
        return {k: summary_columns(meta)[k] for k in keys}

    server = {"model_entry": {"id": "llama", "max_model_len": 4096}, "system_fingerprints": ["fp_a", "fp_b"]}
    assert served({"engine": {"kind": "endpoint", "server": server, "chat_template": "the server's"}}) == {
        "endpoint_model": "llama", "endpoint_max_model_len": 4096, "endpoint_fingerprints": "fp_a, fp_b",
        "chat_template": "the server's"}
    # a server that reports neither; a local engine (whose columns are null)
    assert served({"engine": {"kind": "endpoint", "server": {"model_entry": {"id": "m"}}}}) == {
        "endpoint_model": "m", "endpoint_max_model_len": None, "endpoint_fingerprints": None, "chat_template": None}
    assert set(served({"engine": {"name": "transformers"}}).values()) == {None}
