"""Each papers row is computed over the paper's own population with the paper's statistic:
hand-made summary tables where the population decides the answer."""

from __future__ import annotations

import pandas as pd
import pytest

from tokenflip.report.paper import ROWS, Study, Tables, comparison_rows

TINY, LLAMA3, QWEN7 = "tinyllama-1.1b-chat", "llama3.2-3b-instruct", "qwen2.5-7b-instruct"
STUDY = Study(identity={TINY: "TinyLlama/TinyLlama-1.1B-Chat-v1.0", LLAMA3: "meta-llama/Llama-3.2-3B-Instruct",
                        "qwen2.5-3b-instruct": "Qwen/Qwen2.5-3B-Instruct", QWEN7: "Qwen/Qwen2.5-7B-Instruct",
                        "mistral-7b": "mistralai/Mistral-7B-v0.1"},
              kind={"gsm8k": "gsm8k", "gsm8k_chat": "gsm8k"}, format={"gsm8k": "bare", "gsm8k_chat": "chat"},
              c_labels=frozenset({"C_gated"}))
PLAIN = {"status": "done", "cache": "on", "batch_size": 1.0, "decoding": "greedy", "intervention": "none",
         "attention": "default", "threads": "default", "device": "default", "deterministic": "default",
         "repeat": "default", "benchmark": "gsm8k"}


def rows(tables: Tables, study: Study = STUDY) -> dict[str, dict[str, str]]:
    return {r["claim"]: r for r in comparison_rows(tables, study, "cpu")}


def pair(model: str, n: int, diverged: int, pair_id: str, **settings) -> dict:
    return {**PLAIN, "axis": "precision", "a": "bf16", "b": "fp16", "precision": None, "model": model,
            "n_prompts": n, "n_diverged": diverged, "pair_id": pair_id, **settings}


def test_the_decision_rule_predicts_from_the_body_not_from_the_whole_perturbation():
    """§7.1 / App. XII. Four traced steps of TinyLlama: two Diverged (first flips), two
    Agreed. The whole measured perturbation exceeds the margin exactly at the flips (true
    by construction: it would read 100%). The body's projection exceeds it at one flip of
    two: 3 of 4 steps right. The RMS-scale trigger √2·σz = 0.028 exceeds the margins
    0.01 and 0.02 of both flips and none of the Agreed margins: 4 of 4. A step the probe
    did not trace (step 7, a flip no rule predicts) is left out."""
    steps = pd.DataFrame({"model": TINY, "a": "bf16", "b": "fp16", "prompt_id": ["d1", "d2", "a1", "a2", "d1"],
                          "step": [3, 5, 4, 4, 7], "flip": [True, True, False, False, True],
                          "margin_a": [0.01, 0.02, 5.0, 3.0, 9.0], "directional": [0.3, 0.03, 0.1, 0.2, 9.5],
                          "directional_body": [0.5, 0.001, 0.1, 0.2, 0.0], "sigma_z": [0.02, 0.02, 0.02, 0.02, 0.02]})
    lens = pd.DataFrame({"model": TINY, "a": "bf16", "b": "fp16", "prompt_id": ["d1", "d2", "a1", "a2"],
                         "step": [3, 5, 4, 4], "layer": 0, "group": ["diverged", "diverged", "agreed", "agreed"]})
    got = rows(Tables(precision_steps=steps, lens=lens))
    body = got["flip predicted from the body's projection vs the margin"]
    assert body["ours"] == "75%"
    assert body["our_conditions"].startswith(f"{TINY}; 2 Diverged + 2 Agreed traced step(s), 2 flip(s)")
    assert got["flip predicted by the RMS-scale trigger (margin < √2·σz)"]["ours"] == "100%"


def test_sigma_z_is_tinyllamas_where_the_run_has_it_and_each_models_own_where_not():
    """§I.3 gives σz for TinyLlama (0.026). With TinyLlama at 0.02 and Llama-3.2-3B at 0.5
    the row reads 0.02 (pooled: 0.35). Without TinyLlama, each model has its own figure,
    named as standing in for it, never one pooled number."""
    steps = pd.DataFrame({"model": [TINY] * 2 + [LLAMA3] * 2, "a": "bf16", "b": "fp16",
                          "sigma_z": [0.02, 0.02, 0.5, 0.5]})
    assert rows(Tables(precision_steps=steps))["σz, per-logit RMS of the logit difference"]["ours"] == "0.02"
    others = steps.assign(model=["m1", "m1", "m2", "m2"], sigma_z=[0.1, 0.1, 0.3, 0.3])
    row = rows(Tables(precision_steps=others), Study())["σz, per-logit RMS of the logit difference"]
    assert row["ours"] == "m1: 0.1; m2: 0.3"
    assert row["our_conditions"].startswith("m1, m2, in place of TinyLlama")


def test_the_median_first_divergence_leaves_the_qwen_models_out():
    """§6.2: "34-50 tokens, non-Qwen models"; Qwen2.5-7B diverges at the first token. Five
    Qwen prompts at step 0 would pull a pooled median to 0; without them, TinyLlama's
    median is 42 and Mistral's 32: the range 32 to 42."""
    pairs = pd.DataFrame([pair(TINY, 10, 2, "t"), pair("mistral-7b", 10, 2, "m"), pair(QWEN7, 10, 5, "q")])
    first = pd.DataFrame({"pair_id": ["t", "t", "m", "m"] + ["q"] * 5, "model": [TINY] * 2 + ["mistral-7b"] * 2
                          + [QWEN7] * 5, "first_div_step": [40.0, 44.0, 30.0, 34.0] + [0.0] * 5})
    got = rows(Tables(pairs=pairs, first_divergence=first))
    assert got["median first divergence step"]["ours"] == "32 to 42"
    assert QWEN7 not in got["median first divergence step"]["our_conditions"]
    assert got["prompts diverging at the first token"]["ours"] == "50%"  # 5 of the pair's 10 prompts


def test_repeats_other_kernels_batch_sizes_and_chat_prompts_never_enter_the_bf16_fp16_rows():
    """The plain BF16-vs-FP16 pair (6 of 10 diverged) is the row. A `repeat: 2` pair (§6.1),
    an eager-attention pair, a batch-size-4 pair and a chat-template pair (§2: bare
    prompts) would each move it: 60% stays 60%, from one pair of 10 prompts."""
    pairs = pd.DataFrame([pair(TINY, 10, 6, "plain"), pair(TINY, 10, 1, "rep", repeat="2"),
                          pair(TINY, 10, 0, "eager", attention="eager"), pair(TINY, 10, 0, "bs4", batch_size=4.0),
                          pair(TINY, 10, 0, "chat", benchmark="gsm8k_chat")])
    got = rows(Tables(pairs=pairs))
    row = got["prompts whose greedy output differs, BF16 vs FP16"]
    assert row["ours"] == "60%" and "1 pair(s), n = 10" in row["our_conditions"]
    # App. VII is about MATH-500's longer chains: GSM8K never stands in for it.
    assert got["BF16 vs FP16 divergence on MATH-500"]["ours"] == "–"
    repeat = pd.DataFrame([{**PLAIN, "axis": "repeat", "a": "default", "b": "2", "repeat": None, "precision": p,
                            "model": TINY, "n_prompts": 10, "n_diverged": 0, "pair_id": p} for p in ("bf16", "fp16")])
    assert rows(Tables(pairs=repeat))["within-precision repeat: exact agreement"]["ours"] == "100%"


def test_the_lift_is_a_range_over_the_papers_models_and_each_models_own_in_table_12():
    """"+22-36 pp" is TinyLlama (+22) to Llama-3.2-3B (+36), not a mean with Qwen2.5-3B's
    +3. TinyLlama's lift is pooled over its benchmarks by prompt count: (0.2·100 +
    0.3·50) / 150 = 0.233. Table 12's row lists each model."""
    base = {k: v for k, v in PLAIN.items() if k != "intervention"}
    ints = pd.DataFrame([{**base, "model": m, "a": "bf16", "b": "fp16", "intervention": "C_gated", "n": n,
                          "lift": lift, "overhead": 0.02, "benchmark": b}
                         for m, n, lift, b in ((TINY, 100, 0.2, "gsm8k"), (TINY, 50, 0.3, "humaneval"),
                                               (LLAMA3, 100, 0.36, "gsm8k"),
                                               ("qwen2.5-3b-instruct", 100, 0.03, "gsm8k"))])
    study = Study(identity=STUDY.identity, kind={"gsm8k": "gsm8k", "humaneval": "humaneval"},
                  format={"gsm8k": "bare", "humaneval": "bare"}, c_labels=frozenset({"C_gated"}))
    got = rows(Tables(interventions=ints), study)
    assert got["gated FP32 head (C): EAR lift"]["ours"] == "+23 pp to +36 pp"
    assert got["gated FP32 head (C): lift per model"]["ours"] == \
        f"{LLAMA3}: +36 pp; qwen2.5-3b-instruct: +3 pp; {TINY}: +23 pp"


def test_the_kv_rows_stand_in_for_the_papers_models_and_benchmark_by_name():
    """The default run has neither the paper's models nor GSM8K: its figure is labelled
    with what it stands in for."""
    pairs = pd.DataFrame([{**PLAIN, "axis": "cache", "a": "on", "b": "off", "cache": None, "precision": "fp16",
                           "model": "smollm2-135m", "benchmark": "onestep", "n_prompts": 4, "n_diverged": 1,
                           "pair_id": "x", "accuracy_a": 0.5, "accuracy_b": 0.25}])
    row = rows(Tables(pairs=pairs), Study(kind={"onestep": "onestep"}))["token divergence, cache ON vs OFF, FP16"]
    assert row["ours"] == "25%"
    assert "smollm2-135m, in place of LLaMA-2-7B, Mistral-7B-v0.3, Gemma-2-2B" in row["our_conditions"]
    assert "onestep, in place of gsm8k" in row["our_conditions"]


def test_the_fp32_falsification_headline_is_a_kl_ratio():
    """"Eight orders of magnitude" (Fig. 3) is KL against KL: median KL 1e-4 in fp16 and
    1e-12 in fp32 is 10^8, whatever the |Δlogit| ratio (10^4 here)."""
    from tokenflip.report import kv_claims, probe_claims

    steps = pd.DataFrame({"model": "m", "precision": ["fp16", "fp16", "fp32", "fp32"], "flip": False,
                          "kl": [1e-4, 1e-4, 1e-12, 1e-12], "max_abs_dlogit": [0.1, 0.1, 1e-5, 1e-5]})
    kv_rows = [{"precision": p, "accuracy_diff": 0.0, "n_diverged": 0, "n_prompts": 2, "n_logit_diff_before_div": 1,
                "max_abs_dlogit": d} for p, d in (("fp16", 0.1), ("fp32", 1e-5))]
    claims = kv_claims(kv_rows, probe_claims(steps))
    assert claims["fp32_kl"] == [{"model": "m", "log10": pytest.approx(8.0)}]
    assert "fp32_reduction" not in claims


def test_the_docs_say_what_each_row_is_computed_over():
    from conftest import REPO

    page = (REPO / "docs" / "papers.md").read_text(encoding="utf-8")
    missing = [row.claim for row in ROWS if f"| {row.claim} | {row.population()} |" not in page]
    assert not missing, missing


def test_the_cost_per_trigger_divides_the_extra_compute_by_the_trigger_rate():
    """§4.2: per model × benchmark × precision, C adds 0.004 s a token firing on 1% of
    steps (0.4 s a trigger), B adds 0.0001 s at 1% (0.01 s): 40×."""
    cells = pd.DataFrame([{**PLAIN, "model": TINY, "precision": "bf16", "intervention": name,
                           "seconds_per_token": spt, "trigger_rate": rate}
                          for name, spt, rate in (("none", 0.05, 0.0), ("B8", 0.0501, 0.01), ("C_gated", 0.054, 0.01))])
    study = Study(identity=STUDY.identity, kind={"gsm8k": "gsm8k"}, format={"gsm8k": "bare"},
                  c_labels=frozenset({"C_gated"}), b8_labels=frozenset({"B8"}))
    assert rows(Tables(cells=cells), study)["cost per trigger, whole head (C) over top-8 (B)"]["ours"] == "40×"


def test_the_papers_table_comes_first_only_for_a_reproduction():
    """A paper config (the paper's own models) puts that paper's rows first, all of them; a
    study of other models (stand-ins) shows only the rows it has data for, after its own
    sections."""
    from tokenflip.report.page import paper_placement

    def row(paper, ours, conditions):
        return {"paper": paper, "claim": f"{paper} {ours} {conditions}", "ours": ours, "our_conditions": conditions}

    reproduction = [row("KV", "100%", "llama2-7b; gsm8k"), row("KV", "0%", "gemma2-2b; gsm8k"),
                    row("KV", "–", "not in this run"), row("P", "–", "not in this run"),
                    row("P", "41%", "tiny, in place of TinyLlama")]
    placed = paper_placement(reproduction)
    assert placed["paper_first"] and placed["paper_total"] == 5
    assert [r["claim"] for r in placed["paper_rows"]] == [r["claim"] for r in reproduction[:3]] + [reproduction[4]["claim"]]
    stand_ins = [row("KV", "100%", "tiny, in place of LLaMA-2-7B"), row("KV", "–", "not in this run"),
                 row("P", "–", "not in this run"), row("P", "–", "not in this run")]
    placed = paper_placement(stand_ins)
    assert not placed["paper_first"] and [r["ours"] for r in placed["paper_rows"]] == ["100%"]
