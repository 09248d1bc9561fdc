"""The papers' headline figures beside this run's, one row each, with the conditions of
both (model, precision, device, n), so that a reader sees where the run agrees with the
papers and where it cannot be compared. Computed from the summary tables only."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
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


@dataclass
class ProbeTables:
    """The probe summaries the comparison reads (empty where a probe did not run)."""

    kv_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    kv_patching: pd.DataFrame = field(default_factory=pd.DataFrame)
    precision_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    grafting: pd.DataFrame = field(default_factory=pd.DataFrame)
    lens: pd.DataFrame = field(default_factory=pd.DataFrame)


def _bf16_vs_fp16(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of a precision-probe table whose pair is BF16 and FP16, either way round."""
    if frame.empty or "a" not in frame:
        return frame
    return frame[((frame["a"] == "bf16") & (frame["b"] == "fp16")) | ((frame["a"] == "fp16") & (frame["b"] == "bf16"))]


def graft_ends(grafting: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per grafting row, the precision grafted into and the one grafted from ("b→a": b's
    state into a's run)."""
    forward = grafting["direction"] == "b→a"
    return grafting["a"].where(forward, grafting["b"]), grafting["b"].where(forward, grafting["a"])


def _grafts_into(grafting: pd.DataFrame, into: str, source: str) -> pd.DataFrame:
    """Grafting rows where `source`'s state went into `into`'s run."""
    if grafting.empty or "direction" not in grafting:
        return grafting.iloc[0:0]
    target, origin = graft_ends(grafting)
    return grafting[(target == into) & (origin == source)]


def _last_layer(frame: pd.DataFrame) -> pd.Series:
    """Rows at their model's last layer (models differ in depth)."""
    return frame["layer"] == frame.groupby("model")["layer"].transform("max")


def gated_c_labels(config: dict[str, Any]) -> set[str]:
    """The config's names for the paper's intervention C (whole LM head in FP32, gated, the
    head alone: a broader scope is §7.6's other experiment)."""
    return {name for name, spec in config.get("interventions", {}).items()
            if spec.get("kind") == "fp32_head" and spec.get("gated", True) and spec.get("scope", "head") == "head"}


def comparison_rows(pairs: pd.DataFrame, interventions: pd.DataFrame, device: str, c_labels: set[str],
                    probes: ProbeTables | None = None) -> list[dict[str, str]]:
    """Rows of (paper, claim, paper's figure and conditions, ours and our conditions). A row
    whose data this run does not have says so instead of a number."""
    probes = probes or ProbeTables()
    # The precision paper's figures are BF16 against FP16: other probed pairs are not pooled in.
    kv_steps, precision_steps = probes.kv_steps, _bf16_vs_fp16(probes.precision_steps)
    lens_16 = _bf16_vs_fp16(probes.lens)
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
        if med["fp32"] == 0:
            return "FP32 KL is 0", f"median per-step KL, probe, {steps['prompt_id'].nunique()} prompt(s)"
        ratio = med["fp16"] / med["fp32"]
        return f"10^{math.log10(ratio):.1f}", f"median per-step KL, probe, {steps['prompt_id'].nunique()} prompt(s)"
    add(KV, "FP32 shrinks the drift (KL ratio FP16 / FP32)", "≈ 10^8", "Fig. 3, GPU", kl_ratio)

    def patching() -> tuple[str, str]:
        rows = need(probes.kv_patching)
        rows = rows[rows["precision"] == "fp16"] if (rows["precision"] == "fp16").any() else rows
        med = rows.groupby("kind")["kl_recovered"].median()
        return (f"{_pct(float(med['residual stream']))} vs {_pct(float(med['kv cache']))}",
                f"{_models(rows)}; median KL recovered, {', '.join(sorted(set(rows['precision'])))}, "
                f"{len(rows[rows['kind'] == 'none'])} patched step(s)")
    add(KV, "KL recovered: residual stream vs KV cache patch", "residual stream fails; KV cache recovers",
        "Fig. 5, 3 models", patching)

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

    def lens_margin(rows: pd.DataFrame, group: str) -> str:
        return _num(float(rows.loc[rows["group"] == group, "margin_a"].median()))

    def margins() -> tuple[str, str]:
        # App. I.3 / §7.5: one traced step per prompt, read through the final-layer lens,
        # Diverged prompts at their first flip against Agreed prompts.
        lens = need(lens_16)
        last = lens[_last_layer(lens)]
        counts = last["group"].value_counts()
        return (f"{lens_margin(last, 'diverged')} vs {lens_margin(last, 'agreed')}",
                f"{_models(last)}; final-layer lens, {counts.get('diverged', 0)} Diverged vs "
                f"{counts.get('agreed', 0)} Agreed prompt(s)")
    add(PRECISION, "median top-2 margin, Diverged vs Agreed prompts", "0.039 vs 5.733",
        "final-layer logit lens, TinyLlama, §I.3", margins)

    def margin_trend() -> tuple[str, str]:
        lens = need(lens_16)
        top = lens[lens["layer"] == lens["layer"].min()]
        bottom = lens[_last_layer(lens)]
        return (f"{lens_margin(top, 'diverged')} → {lens_margin(bottom, 'diverged')}; "
                f"{lens_margin(top, 'agreed')} → {lens_margin(bottom, 'agreed')}",
                f"{_models(lens)}; lens margin, first → last layer, Diverged; Agreed")
    add(PRECISION, "lens margin from first to last layer, Diverged; Agreed", "0.33 → 0.04; 2.06 → 5.73",
        "TinyLlama, App. II(iv), Table 10", margin_trend)

    def body_lens() -> tuple[str, str]:
        lens = need(lens_16)
        div = lens[(lens["group"] == "diverged") & ~_last_layer(lens)]
        per_layer = need(div).groupby(["model", "layer"])["top1_agree"].mean()
        return (f"{_pct(float(per_layer.min()))}–{_pct(float(per_layer.max()))}",
                f"{_models(div)}; body layers at the first flip, {div['prompt_id'].nunique()} prompt(s)")
    add(PRECISION, "top-1 agreement of the two precisions at body layers", "93–100%", "App. II(iv)", body_lens)

    def first_token() -> tuple[str, str]:
        lens = need(lens_16)
        last = lens[(lens["group"] == "first_token") & _last_layer(lens)]
        last = need(last)
        return (f"{_pct(float(last['top1_agree'].mean()))}, mean margin {_num(float(last['margin_a'].mean()))}",
                f"{_models(last)}; final-layer lens at the first token, {len(last)} prompt(s)")
    add(PRECISION, "first token: top-1 agreement, mean top-2 margin", "100%, 0.70", "100 prompts, App. II(i)",
        first_token)

    def head_share() -> tuple[str, str]:
        steps = need(precision_steps)
        head, body = (steps["sigma_z_head"] ** 2).sum(), (steps["sigma_z_body"] ** 2).sum()
        return _pct(float(head / (head + body))), f"{_models(steps)}; measured, σ_head² / (σ_head² + σ_body²)"
    add(PRECISION, "LM head's share of the per-logit perturbation", "97.6%", "estimated, TinyLlama, §7.3",
        head_share)

    def graft(site: str, into: str, source: str, layer: str | None = None) -> Callable[[], tuple[str, str]]:
        def compute() -> tuple[str, str]:
            rows = _grafts_into(probes.grafting, into, source)
            rows = rows[rows["site"] == site]
            if layer == "last":
                rows = rows[_last_layer(rows)]
            elif layer == "body":
                rows = rows[~_last_layer(rows)]
            rows = need(rows)
            return _pct(float(rows["fixed"].mean())), f"{_models(rows)}; {len(rows)} graft(s) at flip steps"
        return compute
    for claim, figure, args in (
            ("flips fixed by grafting FP16's embedding into BF16", "29.4%", ("embedding", "bf16", "fp16")),
            ("flips fixed by grafting one FP16 body layer into BF16", "≈ 36%", ("layer", "bf16", "fp16", "body")),
            ("flips fixed by grafting FP16's last layer into BF16", "65%", ("layer", "bf16", "fp16", "last")),
            ("flips fixed by grafting FP16's final norm into BF16", "71%", ("final_norm", "bf16", "fp16")),
            ("KV-cache graft, FP16's own cache into BF16", "47.5%", ("kv_cache", "bf16", "fp16")),
            ("KV-cache graft, BF16's own cache into FP16", "35.6%", ("kv_cache", "fp16", "bf16"))):
        add(PRECISION, claim, figure, "TinyLlama, App. II(ii)-(iii), Table 8", graft(*args))

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

    def body_projection() -> tuple[str, str]:
        from scipy.stats import mannwhitneyu

        steps = need(precision_steps)
        if "directional_body" not in steps:
            raise KeyError("directional_body")
        flips, kept = steps[steps["flip"]], steps[~steps["flip"]]
        need(flips), need(kept)
        body_f, body_k = flips["directional_body"].abs(), kept["directional_body"].abs()
        p = float(mannwhitneyu(body_f, body_k, alternative="two-sided").pvalue)
        return (f"{_num(float(body_f.median()))} vs {_num(float(body_k.median()))} (Mann–Whitney p = {p:.2g}); "
                f"margins {_num(float(flips['margin_a'].median()))} vs {_num(float(kept['margin_a'].median()))}",
                f"{_models(steps)}; |body projection| at flip vs other steps, {len(flips)} vs {len(kept)}")
    add(PRECISION, "body projection, flip vs other steps; their margins", "equivalent; margins 10²–10³ apart",
        "TinyLlama, Qwen2.5-3B, App. XII, Table 20", body_projection)

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
