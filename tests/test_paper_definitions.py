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
