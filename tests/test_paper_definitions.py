"""The papers' quantities by the papers' definitions, each on inputs whose right answer
is known by hand."""

from __future__ import annotations


def test_sigma_z_is_the_per_logit_rms_over_the_whole_vocabulary():
    """σz (arXiv 2609.26621 §I.3): on a step where one of four logits moves by 0.1, the
    per-logit RMS is 0.1 / √4 = 0.05 (the largest |Δ| would be 0.1)."""
    import torch

    from tokenflip.probes.replay import Replay, step_differences

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

    from tokenflip.jobs import Cell, Pair
    from tokenflip.summary import _table4

    joined = pd.DataFrame({"agree_base": [False, False, False, True], "agree_int": [True, False, False, True]},
                          index=["p0", "p1", "p2", "p3"])
    a = Cell("m", "b", "bf16", "on", 1, "greedy", "C")
    b = Cell("m", "b", "fp16", "on", 1, "greedy", "C")
    metas = {a.id: {"_triggered": {"p0"}}, b.id: {"_triggered": {"p1", "p3"}}}
    assert _table4(joined, metas, Pair("precision", a, b)) == {
        "n_base_diverged": 3, "n_triggered_reconciled": 1, "n_triggered_not_reconciled": 1, "n_not_triggered": 1}


def test_triggered_prompts_come_from_the_per_step_flags():
    import numpy as np

    from tokenflip import storage
    from tokenflip.summary import triggered_prompts

    records = []
    for i, flags in enumerate([[False, True], [False, False], [True]]):
        steps = len(flags)
        records.append({"prompt_index": i, "prompt_id": f"p{i}", "batch_index": i, "prompt_ids": [1],
                        "token_ids": [5] * steps, "top_ids": np.zeros((steps, 2), np.int32),
                        "top_logits": np.zeros((steps, 2), np.float32), "margin": [0.0] * steps,
                        "logsumexp": [0.0] * steps, "entropy": [0.0] * steps, "intervened": flags,
                        "n_tokens": steps, "finish_reason": "length", "text": "", "gold": None, "extracted": None,
                        "correct": None, "latency_s": 0.0})
    assert triggered_prompts(storage.cell_table(records, 2)) == {"p0", "p2"}
