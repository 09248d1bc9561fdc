"""The papers' headline figures beside this run's, one row each, with the conditions of
both (model, precision, device, n), so that a reader sees where the run agrees with the
papers and where it cannot be compared. Computed from the summary tables only."""

from __future__ import annotations

import math
from typing import Any, Callable

import pandas as pd

KV = "arXiv 2604.15409 (KV cache, FP16)"
PRECISION = "arXiv 2609.26621 (BF16 vs FP16)"


def _pct(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def _num(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.3g}"


def _models(df: pd.DataFrame) -> str:
    models = sorted(set(df["model"])) if not df.empty else []
    return ", ".join(models[:4]) + (f" +{len(models) - 4}" if len(models) > 4 else "")


def _pairs(pairs: pd.DataFrame, axis: str, a: str, b: str, **shared: Any) -> pd.DataFrame:
    if pairs.empty:
        return pairs
    sel = (pairs["status"] == "done") & (pairs["axis"] == axis) & (pairs["a"] == a) & (pairs["b"] == b)
    for key, value in shared.items():
        if isinstance(value, int):   # batch_size: a float column where the axis is compared
            sel &= pd.to_numeric(pairs[key], errors="coerce") == value
        else:
            sel &= pairs[key].astype(str) == str(value)
    return pairs[sel]


def _divergence(pairs: pd.DataFrame) -> tuple[str, str]:
    n, d = int(pairs["n_prompts"].sum()), int(pairs["n_diverged"].sum())
    return _pct(d / n if n else float("nan")), f"{_models(pairs)}; {len(pairs)} pair(s), n = {n}"


def gated_c_labels(config: dict[str, Any]) -> set[str]:
    """The config's names for the paper's intervention C (whole LM head in FP32, gated)."""
    return {name for name, spec in config.get("interventions", {}).items()
            if spec.get("kind") == "fp32_head" and spec.get("gated", True)}


def comparison_rows(pairs: pd.DataFrame, interventions: pd.DataFrame, kv_steps: pd.DataFrame,
                    precision_steps: pd.DataFrame, device: str, c_labels: set[str]) -> list[dict[str, str]]:
    """Rows of (paper, claim, paper's figure and conditions, ours and our conditions). A row
    whose data this run does not have says so instead of a number."""
    rows: list[dict[str, str]] = []

    def add(paper: str, claim: str, theirs: str, their_conditions: str, compute: Callable[[], tuple[str, str]]):
        try:
            ours, conditions = compute()
        except (KeyError, ValueError, ZeroDivisionError):
            ours, conditions = "–", "not in this run"
        rows.append({"paper": paper, "claim": claim, "paper_figure": theirs, "paper_conditions": their_conditions,
                     "ours": ours, "our_conditions": f"{conditions}; {device}" if ours != "–" else conditions})

    def need(df: pd.DataFrame) -> pd.DataFrame:
        if df.empty:
            raise KeyError("no data")
        return df

    fp16_cache = lambda: need(_pairs(pairs, "cache", "on", "off", precision="fp16", decoding="greedy"))  # noqa: E731
    fp32_cache = lambda: need(_pairs(pairs, "cache", "on", "off", precision="fp32"))  # noqa: E731
    add(KV, "token divergence, cache ON vs OFF, FP16 greedy", "100%", "3 models (7B, 2B), GSM8K, GPU",
        lambda: _divergence(fp16_cache()))
    add(KV, "token divergence, cache ON vs OFF, FP32", "0%", "3 models, GSM8K, GPU", lambda: _divergence(fp32_cache()))

    def on_better() -> tuple[str, str]:
        fp16 = need(_pairs(pairs, "cache", "on", "off", precision="fp16"))
        diff = fp16["accuracy_a"] - fp16["accuracy_b"]
        return f"{int((diff > 0).sum())} of {len(fp16)}", f"{_models(fp16)}; FP16 model × decoding conditions"
    add(KV, "cache ON more accurate", "8 of 9", "FP16 conditions: 3 models × 3 decoding strategies", on_better)

    def kl_ratio() -> tuple[str, str]:
        steps = need(kv_steps)
        med = steps.groupby("precision")["kl"].median()
        ratio = med["fp16"] / med["fp32"]
        return f"10^{math.log10(ratio):.1f}", f"median per-step KL, probe, {steps['prompt_id'].nunique()} prompt(s)"
    add(KV, "FP32 shrinks the drift (KL ratio FP16 / FP32)", "≈ 10^8", "Fig. 3, GPU", kl_ratio)

    no_int = lambda: need(_pairs(pairs, "precision", "bf16", "fp16", intervention="none", batch_size=1))  # noqa: E731
    add(PRECISION, "prompts whose greedy output differs, BF16 vs FP16", "49–100%",
        "6 models 1.1–7B, GSM8K/HumanEval/MBPP, A10G", lambda: _divergence(no_int()))

    def first_div() -> tuple[str, str]:
        p = no_int()
        return _num(float(p["median_first_div_step"].median())), f"{_models(p)}; median over pairs"
    add(PRECISION, "median first divergence step", "34–50 tokens", "non-Qwen models, §6.2", first_div)

    def sigma() -> tuple[str, str]:
        steps = need(precision_steps)
        return _num(float((steps["sigma_z"] ** 2).mean() ** 0.5)), f"{_models(steps)}; precision probe, full vocabulary"
    add(PRECISION, "σz, per-logit RMS of the logit difference", "0.026", "TinyLlama, §I.3", sigma)

    def margins() -> tuple[str, str]:
        steps = need(precision_steps)
        flips, kept = steps[steps["flip"]], steps[~steps["flip"]]
        return (f"{_num(float(flips['margin_a'].median()))} vs {_num(float(kept['margin_a'].median()))}",
                f"{_models(steps)}; probe steps that flip vs that do not")
    add(PRECISION, "median top-2 margin, diverging vs agreeing", "0.039 vs 5.733",
        "final-layer logit lens, TinyLlama, §I.3", margins)

    def decision_rule() -> tuple[str, str]:
        steps = need(precision_steps)
        if "directional" not in steps:
            raise KeyError("directional")
        predicted = steps["directional"] > steps["margin_a"]
        agree = float((predicted == steps["flip"]).mean())
        return _pct(agree), (f"{_models(steps)}; {len(steps)} probe steps, {int(steps['flip'].sum())} flips; "
                             f"perturbation measured exactly at identical inputs")
    add(PRECISION, "flip iff the top-2 perturbation exceeds the margin (§7.1)", "88–89% of steps",
        "TinyLlama, Qwen2.5-3B, App. XII", decision_rule)

    def lift(batch: int) -> Callable[[], tuple[str, str]]:
        def compute() -> tuple[str, str]:
            df = need(interventions)
            c = df[(df["status"] == "done") & (df["batch_size"] == batch) & df["intervention"].isin(c_labels)]
            c = need(c)
            return (f"{100 * c['lift'].mean():+.0f} pp, overhead {_pct(c['overhead'].mean())}",
                    f"{_models(c)}; {', '.join(sorted(set(c['intervention'])))}, batch size {batch}, "
                    f"n = {int(c['n'].sum())}")
        return compute
    add(PRECISION, "gated FP32 head (C): EAR lift, overhead", "+22–36 pp, < 4%", "A10G, batch size 1, Table 3",
        lift(1))
    add(PRECISION, "gated FP32 head (C) at batch size 8", "0 pp", "App. IV", lift(8))
    return rows
