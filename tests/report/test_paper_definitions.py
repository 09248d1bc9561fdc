"""The papers' quantities by the papers' definitions, each on inputs whose right answer
is known by hand."""

from __future__ import annotations


def test_sigma_z_is_the_per_logit_rms_over_the_whole_vocabulary():
    """σz (arXiv 2609.26621 §I.3): on a step where one of four logits moves by 0.1, the
    per-logit RMS is 0.1 / √4 = 0.05 (the largest |Δ| would be 0.1)."""
    import torch

    from tokenflip.run.probes.replay import Replay, step_differences

    a = Replay(tokens=[1], logits=torch.tensor([[4.0, 3.0, 2.0, 1.0]]), layer_outputs=torch.zeros(1, 1, 2))
    b = Replay(tokens=[1], logits=torch.tensor([[4.0, 3.1, 2.0, 1.0]]), layer_outputs=torch.zeros(1, 1, 2))
    d = step_differences(a, b)
    assert abs(d["sigma_z"][0] - 0.05) < 1e-6
    assert abs(d["max_abs_dlogit"][0] - 0.1) < 1e-6


def test_table4_splits_the_baseline_diverged_prompts_by_trigger_and_reconciliation():
    """Paper Table 4 (§6.3): of the prompts that diverged without the intervention, those
    on which it fired and that then agree, those on which it fired but that still differ,
    and those on which it never fired. Four prompts, one of each kind plus one that
    agreed at baseline (not counted)."""
    import pandas as pd

    from tokenflip.analysis.interventions import _table4
    from tokenflip.core.specs import Cell, Pair

    joined = pd.DataFrame({"agree_base": [False, False, False, True], "agree_int": [True, False, False, True]},
                          index=["p0", "p1", "p2", "p3"])
    a = Cell("m", "b", "bf16", "on", 1, "greedy", "C")
    b = Cell("m", "b", "fp16", "on", 1, "greedy", "C")
    metas = {a.id: {"_triggered": {"p0"}}, b.id: {"_triggered": {"p1", "p3"}}}
    assert _table4(joined, metas, Pair("precision", a, b)) == {
        "n_base_diverged": 3, "n_triggered_reconciled": 1, "n_triggered_not_reconciled": 1, "n_not_triggered": 1}


def test_triggered_prompts_come_from_the_per_step_flags():
    import numpy as np

    from tokenflip.analysis.summary import triggered_prompts
    from tokenflip.core import storage

    records = []
    for i, flags in enumerate([[False, True], [False, False], [True]]):
        steps = len(flags)
        records.append({"prompt_index": i, "prompt_id": f"p{i}", "batch_index": i, "prompt_ids": [1],
                        "token_ids": [5] * steps, "top_ids": np.zeros((steps, 2), np.int32),
                        "top_logits": np.zeros((steps, 2), np.float32), "margin": [0.0] * steps,
                        "logsumexp": [0.0] * steps, "entropy": [0.0] * steps, "intervened": flags,
                        "n_tokens": steps, "finish_reason": "length", "text": "", "gold": None, "extracted": None,
                        "correct": None, "answer_rule": "none", "verdict": "no_answer", "latency_s": 0.0})
    assert triggered_prompts(storage.cell_table(records, 2)) == {"p0", "p2"}


def test_cache_on_more_accurate_counts_the_fp16_conditions_only():
    """arXiv 2604.15409: "cache-ON more accurate in 8 of 9 conditions" counts model x
    decoding in FP16; the FP32 control rows are not conditions."""
    from tokenflip.report import kv_claims

    rows = [{"precision": "fp16", "accuracy_diff": d, "n_diverged": 1, "n_prompts": 2, "n_logit_diff_before_div": 1,
             "max_abs_dlogit": 0.5} for d in (0.1, 0.2, -0.1)]
    rows += [{"precision": "fp32", "accuracy_diff": 0.3, "n_diverged": 0, "n_prompts": 2,
              "n_logit_diff_before_div": 0, "max_abs_dlogit": 1e-5}]
    claims = kv_claims(rows)
    assert (claims["conditions"], claims["on_better"], claims["off_better"]) == (3, 2, 1)


def test_orders_of_magnitude_compare_kl_with_kl():
    """KL grows with the square of the logit difference: a 10x larger |Δlogit| is about a
    100x larger KL, and the paper's ratio (Fig. 3) is the KL one."""
    import pandas as pd

    from tokenflip.report import probe_claims

    steps = pd.DataFrame({"model": "m", "precision": ["fp16", "fp16", "fp32", "fp32"], "flip": False,
                          "kl": [1e-4, 3e-4, 1e-12, 3e-12], "max_abs_dlogit": [0.1, 0.2, 1e-5, 2e-5]})
    rows = {r["precision"]: r for r in probe_claims(steps)}
    assert abs(rows["fp16"]["kl_vs_fp32"] - 1e8) < 1e-2
    assert abs(rows["fp16"]["dlogit_vs_fp32"] - 1e4) < 1e-6
    assert rows["fp32"]["kl_vs_fp32"] is None


def test_the_paper_table_puts_each_headline_beside_ours_or_says_it_is_missing():
    import pandas as pd

    from tokenflip.report.paper import Study, Tables, comparison_rows

    pairs = pd.DataFrame([{"status": "done", "axis": "cache", "a": "on", "b": "off", "precision": "fp16",
                           "decoding": "greedy", "intervention": "none", "batch_size": 1.0, "model": "m",
                           "n_prompts": 10, "n_diverged": 4, "accuracy_a": 0.5, "accuracy_b": 0.4,
                           "median_first_div_step": 7.0},
                          {"status": "done", "axis": "precision", "a": "bf16", "b": "fp16", "precision": None,
                           "decoding": "greedy", "intervention": "none", "batch_size": 1.0, "model": "m",
                           "n_prompts": 10, "n_diverged": 6, "accuracy_a": 0.5, "accuracy_b": 0.5,
                           "median_first_div_step": 12.0}]).assign(pair_id=["p0", "p1"])
    first = pd.DataFrame({"pair_id": "p1", "model": "m", "first_div_step": [10.0, 12.0, 14.0]})
    rows = {r["claim"]: r for r in comparison_rows(Tables(pairs=pairs, first_divergence=first), Study(), "cpu")}
    fp16 = rows["token divergence, cache ON vs OFF, FP16"]
    assert (fp16["paper_figure"], fp16["ours"]) == ("100%", "40%") and "n = 10" in fp16["our_conditions"]
    assert rows["cache ON more accurate"]["ours"] == "1 of 1"
    assert rows["prompts whose greedy output differs, BF16 vs FP16"]["ours"] == "60%"
    assert rows["median first divergence step"]["ours"] == "12"
    assert rows["σz, per-logit RMS of the logit difference"]["ours"] == "–"
    assert rows["σz, per-logit RMS of the logit difference"]["our_conditions"] == "not in this run"


def test_the_directional_perturbation_decides_the_flip():
    """§7.1: b picks a's runner-up j over a's top i exactly when (Δz_j − Δz_i) exceeds a's
    margin z_i − z_j. a = [4, 3, 0]: margin 1. b moves j up by 0.7 and i down by 0.4: the
    perturbation 1.1 exceeds 1, and b's argmax is j."""
    import torch

    from tokenflip.run.probes.replay import Replay, step_differences

    none = dict(layer_outputs=torch.zeros(2, 1, 2), embedding=torch.zeros(2, 2), normed=torch.zeros(2, 2))
    a = Replay(tokens=[0, 0], logits=torch.tensor([[4.0, 3.0, 0.0], [4.0, 3.0, 0.0]]), **none)
    b = Replay(tokens=[0, 0], logits=torch.tensor([[3.6, 3.7, 0.0], [3.9, 3.2, 0.0]]), **none)
    d = step_differences(a, b)
    assert abs(d["directional"][0] - 1.1) < 1e-6 and abs(d["directional"][1] - 0.3) < 1e-6
    assert list(d["flip"]) == [True, False]
    assert list(d["directional"] > d["margin_a"]) == list(d["flip"])


def test_the_paper_table_reads_the_mechanism_probes_by_the_papers_definitions():
    """Hand-made probe tables whose answers are known: the head's share is its part of the
    summed squares, margins are medians of the final-layer lens per prompt group, a graft
    counts in the direction the state went, KL recovered is the median per patch."""
    import pandas as pd

    from tokenflip.report.paper import Study, Tables, comparison_rows

    steps = pd.DataFrame({"model": "m", "a": "bf16", "b": "fp16", "flip": [True, False], "sigma_z": [3.0, 1.0],
                          "sigma_z_head": [3.0, 0.0], "sigma_z_body": [0.0, 1.0], "margin_a": [0.1, 2.0],
                          "directional": [0.2, 0.0]})
    lens = pd.DataFrame({"model": "m", "a": "bf16", "b": "fp16", "prompt_id": ["p1", "p1", "p2", "p2", "p3", "p3",
                                                                              "q1", "q1", "q2", "q2", "p1", "p1",
                                                                              "q1", "q1"],
                         "group": ["diverged"] * 6 + ["agreed"] * 4 + ["first_token"] * 4, "layer": [0, 1] * 7,
                         "margin_a": [0.4, 0.01, 0.3, 0.03, 0.2, 0.05, 2.0, 5.0, 3.0, 7.0, 9.0, 0.5, 9.0, 0.9],
                         "top1_agree": [True, False, False, False, True, False, True, True, True, True,
                                        False, True, False, True]})
    # A pair the paper's figures are not about: never pooled in.
    steps = pd.concat([steps, steps.assign(a="fp32", sigma_z_head=100.0)], ignore_index=True)
    grafting = pd.DataFrame({"model": "m", "site": "final_norm", "layer": -1, "fixed": [True, False, True, True],
                             # bf16 ← fp16 twice as (a=bf16, b→a), once as (a=fp16, a→b); then fp16 ← bf16
                             "a": ["bf16", "bf16", "fp16", "bf16"], "b": ["fp16", "fp16", "bf16", "fp16"],
                             "direction": ["b→a", "b→a", "a→b", "a→b"]})
    patching = pd.DataFrame({"model": "m", "precision": "fp16", "step": 3,
                             "kind": ["none", "residual stream", "kv cache"] * 2,
                             "kl_recovered": [0.0, 0.1, 1.0, 0.0, 0.3, 1.0]})
    rows = {r["claim"]: r["ours"] for r in comparison_rows(
        Tables(precision_steps=steps, lens=lens, grafting=grafting, kv_patching=patching), Study(), "cpu")}
    assert rows["LM head's share of the per-logit perturbation"] == "90%"  # 9 / (9 + 1)
    assert rows["median top-2 margin, Diverged vs Agreed prompts"] == "0.03 vs 6"
    assert rows["lens margin from first to last layer, Diverged; Agreed"] == "0.3 → 0.03; 2.5 → 6"
    assert rows["top-1 agreement of the two precisions at body layers"] == "67%–67%"
    assert rows["first token: top-1 agreement, mean top-2 margin"] == "100%, mean margin 0.7"
    assert rows["flips fixed by grafting FP16's final norm into BF16"] == "67%"  # 2 of the 3 into bf16
    assert rows["KL recovered: residual stream vs KV cache patch"] == "20% vs 100%"
    assert rows["KV-cache graft, FP16's own cache into BF16"] == "–"  # no such graft in these rows


def test_only_the_gated_head_alone_counts_as_the_papers_c():
    from tokenflip.report.paper import gated_c_labels

    config = {"interventions": {"none": {"kind": "none"}, "C": {"kind": "fp32_head", "tau": 1e-3, "gated": True},
                                "C_head": {"kind": "fp32_head", "gated": True, "scope": "head"},
                                "C_ungated": {"kind": "fp32_head", "gated": False},
                                "C_norm": {"kind": "fp32_head", "gated": True, "scope": "final_norm"},
                                "B": {"kind": "topk_fp32"}}}
    assert gated_c_labels(config) == {"C", "C_head"}


def test_the_body_projection_row_compares_diverged_and_agreed_traced_steps_by_hand():
    """App. XII, Table 20: |body projection| at the Diverged prompts' traced steps (their
    first flips) [0.1, 0.2, 0.3] against the Agreed prompts' [0.15, 0.25, 0.35]: medians
    0.2 and 0.25; Mann–Whitney U = 3 of 9 pairs, whose exact two-sided p for 3 + 3 values
    is 2 · P(U ≤ 3) = 2 · 7/20 = 0.7. Margins: median 0.01 at the flips, 5 elsewhere. A
    step the probe did not trace (step 9 of p1, a large projection) is not in it."""
    import pandas as pd

    from tokenflip.report.paper import Study, Tables, comparison_rows

    ids = ["p1", "p2", "p3", "q1", "q2", "q3"]
    steps = pd.DataFrame({"model": "m", "a": "bf16", "b": "fp16", "prompt_id": ids + ["p1"], "step": [4] * 6 + [9],
                          "flip": [True] * 3 + [False] * 4, "sigma_z": 0.01,
                          "directional_body": [0.1, -0.2, 0.3, 0.15, 0.25, -0.35, 50.0],
                          "margin_a": [0.01, 0.02, 0.005, 5.0, 4.0, 6.0, 1.0]})
    lens = pd.DataFrame({"model": "m", "a": "bf16", "b": "fp16", "prompt_id": ids, "step": 4, "layer": 0,
                         "group": ["diverged"] * 3 + ["agreed"] * 3})
    rows = {r["claim"]: r for r in comparison_rows(Tables(precision_steps=steps, lens=lens), Study(), "cpu")}
    assert rows["body projection, Diverged vs Agreed steps; their margins"]["ours"] == \
        "0.2 vs 0.25 (Mann–Whitney p = 0.7); margins 0.01 vs 5"
    assert "3 Diverged + 3 Agreed traced step(s)" in rows["body projection, Diverged vs Agreed steps; their margins"][
        "our_conditions"]
