"""Each divergence's label, worked by hand: one step of each format at a logit's magnitude
(checked against numpy's and torch's own spacing), the order of the labels, and where two
streams come together again."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_storage_compare import K, hand_tables

from tokenflip.analysis import compare
from tokenflip.analysis.causes import cause, rejoin_step, resolution


@pytest.mark.parametrize("value", [24.5, 4.0, 1.0, 0.7, 1000.0, -24.5, 3e-5])
def test_one_step_of_each_format_is_the_libraries_spacing(value):
    assert resolution(value, "fp32") == float(np.spacing(np.float32(abs(value))))
    assert resolution(value, "fp16") == float(np.spacing(np.float16(abs(value))))
    x = torch.tensor(abs(value), dtype=torch.bfloat16)
    assert resolution(value, "bf16") == float(torch.nextafter(x, torch.tensor(np.inf, dtype=torch.bfloat16)) - x)


def test_one_bf16_step_at_24_5_is_an_eighth():
    # 24.5 lies in [16, 32): bf16 keeps 8 significant bits, so steps of 16 / 2^7 = 0.125
    assert resolution(24.5, "bf16") == 0.125 and resolution(24.5, "fp16") == 2 ** -6


def test_labels_in_order_of_what_explains_the_flip():
    bf16 = ("bf16", "bf16")
    assert cause((0.0, 0.3), (24.5, 24.5), bf16) == "exact tie"
    assert cause((0.125, 0.3), (24.5, 24.5), bf16) == "near-tie"  # exactly one step
    assert cause((0.3, 0.125), (24.5, 24.5), bf16) == "near-tie"  # either side
    assert cause((0.126, 0.3), (24.5, 24.5), bf16) == "drift"  # both chose their top: the logits moved
    assert cause((0.126, 0.3), (24.5, 24.5), bf16, (True, False)) == "unexplained"  # b chose below its top
    assert cause((0.1, 0.3), (24.5, 24.5), bf16, (False, True)) == "unexplained"  # a rule, not a rounding
    assert cause((0.2, 0.3), (None, None), bf16, (False, True), logits=False) == "unexplained"  # logprobs too
    assert cause((0.0, 0.3), (24.5, 24.5), bf16, (False, True)) == "exact tie"  # a tie's second is a tie-break
    # the same margin is wide in fp16 (a step of 1/64 at 24.5)
    assert cause((0.125, 0.3), (24.5, 24.5), ("fp16", "fp16")) == "drift"
    # a negative top: the second logit (-24.6) has the larger magnitude, and 0.125 is within
    # its bf16 step; at a top of 31.9 the second (31.8) is below 32 too: a step of 0.125
    assert cause((0.125, 0.3), (-24.5, -24.5), bf16) == "near-tie"
    assert cause((0.2, 0.3), (31.9, 31.9), bf16) == "drift"
    assert cause((0.25, 0.3), (32.1, 32.1), bf16) == "near-tie"  # at 32.1 a step is 0.25
    assert cause((0.2, 0.3), (24.5, 24.5), bf16, greedy=False) == "sampled"
    assert cause((None, None), (None, None), bf16, ended=True) == "ended"
    assert cause((0.2, 0.3), (None, None), bf16, logits=False) == "no logits"
    assert cause((0.0, 0.3), (None, None), bf16, logits=False) == "exact tie"  # a tie needs no magnitude


def test_one_step_at_zero_is_the_smallest_subnormal():
    assert resolution(0.0, "fp16") == float(np.spacing(np.float16(0))) == 2 ** -24
    assert resolution(0.0, "fp32") == float(np.spacing(np.float32(0)))
    assert resolution(0.0, "bf16") == 2 ** -133


def test_rejoin_needs_four_tokens_in_a_row_again():
    a = [1, 2, 3, 9, 4, 5, 6, 7]
    b = [1, 2, 3, 8, 8, 4, 5, 6, 7]
    assert rejoin_step(a, b, 3) == 4  # 4 5 6 7 again, at a's step 4
    assert rejoin_step(a[:-1], b[:-1], 3) is None  # 4 5 6: three only
    assert rejoin_step([1, 9, 9, 9, 9], [1, 8, 9, 9, 9, 9], 1) == 1


def test_hand_tables_labelled_as_bf16():
    rows = {r["prompt_id"]: r for r in compare.compare_tables(*hand_tables(), K, precisions=("bf16", "bf16"))
            .to_pylist()}
    # p2: margins 0.25 and 0.5 at a top logit of 4 (a bf16 step: 1/32), logits moved 0.5: drift;
    # p3: b stopped where a went on; p4: margins 0.5 / 0.25, moved 0.5 at step 0: drift;
    # p5: both margins 0 (an exact tie broken two ways).
    assert {p: rows[p]["cause"] for p in rows} == {"p0": None, "p1": None, "p2": "drift", "p3": "ended",
                                                   "p4": "drift", "p5": "exact tie"}
    assert rows["p2"]["top_logit_a_at_div"] == 4.0 and rows["p3"]["top_logit_a_at_div"] is None
    summary = compare.summarize(compare.compare_tables(*hand_tables(), K))  # not labelled as raw logits
    assert (summary["n_exact_tie"], summary["n_ended"], summary["n_no_logits"], summary["n_drift"]) == (1, 1, 2, 0)
    # same_answer: p2 no, p3 yes (both "4"), p4 no, p5 no
    assert summary["n_answer_differs"] == 3 and summary["n_rejoined"] == 0


def test_a_near_tie_is_judged_in_steps_between_the_two_logits():
    """At a power of two the step toward the smaller logit is the finer one below it: in bf16,
    32.0 and 31.75 are two steps of 0.125 apart (drift), 32.0 and 31.875 one (a near-tie); the
    same for negative logits, whose larger magnitude is the second one."""
    from tokenflip.analysis.causes import step_between

    assert step_between(32.0, 31.75, "bf16") == 0.125 and resolution(32.0, "bf16") == 0.25
    assert cause((0.25, 0.25), (32.0, 32.0), ("bf16", "bf16")) == "drift"
    assert cause((0.125, 0.125), (32.0, 32.0), ("bf16", "bf16")) == "near-tie"
    assert cause((0.25, 0.25), (-31.75, -31.75), ("bf16", "bf16")) == "drift"  # top −31.75, second −32.0
    assert cause((0.125, 0.125), (24.5, 24.5), ("bf16", "bf16")) == "near-tie"  # inside a binade: as before
    assert step_between(2.0 ** -126, 0.0, "bf16") == resolution(2.0 ** -126, "bf16")  # the smallest normal
