"""The statistics of the papers rows, each over one group's rows, and their formats."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pandas as pd

from tokenflip.report.paper.formats import _num, _pct, _pp
from tokenflip.report.paper.study import MATCHED, Study, _last_layer, graft_ends, paper_models


def _rate(rows: pd.DataFrame) -> float:
    return rows["n_diverged"].sum() / rows["n_prompts"].sum()


def _pairs_detail(rows: pd.DataFrame) -> str:
    return f"{len(rows)} pair(s), n = {int(rows['n_prompts'].sum())}"


def _on_better(rows: pd.DataFrame) -> str:
    on = rows["accuracy_a"].where(rows["a"] == "on", rows["accuracy_b"])
    off = rows["accuracy_b"].where(rows["a"] == "on", rows["accuracy_a"])
    return f"{int((on > off).sum())} of {len(rows)}"


def _kl_ratio(rows: pd.DataFrame) -> float:
    med = rows.groupby("precision")["kl"].median()
    return math.inf if med["fp32"] == 0 else float(med["fp16"] / med["fp32"])


def _first_layer_share(rows: pd.DataFrame) -> float:
    """KV-cache paper, Fig. 2: how much of the last layer's drift the first layer already
    shows (1: all at once, "sharp at the first layer"; near 1/L: "uniform accumulation"),
    the median over steps of L2(first layer) / L2(last layer)."""
    first = rows[rows["layer"] == rows["layer"].min()].set_index("step")["l2"]
    last = rows[rows["layer"] == rows["layer"].max()].set_index("step")["l2"]
    ratio = (first / last)[last > 0]
    return float(ratio.median()) if len(ratio) else float("nan")


def _patching(rows: pd.DataFrame) -> tuple[float, float]:
    med = rows.groupby("kind")["kl_recovered"].median()
    return float(med["residual stream"]), float(med["kv cache"])


def _share_from(step: Callable[[pd.Series], pd.Series]) -> Callable[[pd.DataFrame], float]:
    """Share of all the pairs' prompts (diverged or not) whose first divergence step passes."""
    def share(rows: pd.DataFrame) -> float:
        n = rows.drop_duplicates("pair_id")["n_prompts"].sum()
        return float(step(rows["first_div_step"]).sum() / n)
    return share


def _rms_sigma(rows: pd.DataFrame) -> float:
    return float((rows["sigma_z"] ** 2).mean() ** 0.5)


def _lens_margin(rows: pd.DataFrame, group: str) -> float:
    return float(rows.loc[rows["group"] == group, "margin_a"].median())


def _final_margins(rows: pd.DataFrame) -> tuple[float, float]:
    last = rows[_last_layer(rows)]
    return _lens_margin(last, "diverged"), _lens_margin(last, "agreed")


def _margin_trend(rows: pd.DataFrame) -> str:
    top, bottom = rows[rows["layer"] == rows["layer"].min()], rows[_last_layer(rows)]
    return (f"{_num(_lens_margin(top, 'diverged'))} → {_num(_lens_margin(bottom, 'diverged'))}; "
            f"{_num(_lens_margin(top, 'agreed'))} → {_num(_lens_margin(bottom, 'agreed'))}")


def _body_agreement(rows: pd.DataFrame) -> str:
    div = rows[(rows["group"] == "diverged") & ~_last_layer(rows)]
    per_layer = div.groupby("layer")["top1_agree"].mean()
    if per_layer.empty:
        raise ValueError("no Diverged prompt")
    return f"{_pct(float(per_layer.min()))}–{_pct(float(per_layer.max()))}"


def _first_token(rows: pd.DataFrame) -> str:
    last = rows[(rows["group"] == "first_token") & _last_layer(rows)]
    if last.empty:
        raise ValueError("no first-token lens")
    return f"{_pct(float(last['top1_agree'].mean()))}, mean margin {_num(float(last['margin_a'].mean()))}"


def _head_share(rows: pd.DataFrame) -> float:
    head, body = (rows["sigma_z_head"] ** 2).sum(), (rows["sigma_z_body"] ** 2).sum()
    return float(head / (head + body))


def _graft(site: str, into: str, source: str, layer: str | None = None) -> Callable[[pd.DataFrame], float]:
    def fixed(rows: pd.DataFrame) -> float:
        target, origin = graft_ends(rows)
        rows = rows[(target == into) & (origin == source) & (rows["site"] == site)]
        if layer == "last":
            rows = rows[_last_layer(rows)]
        elif layer == "body":
            rows = rows[~_last_layer(rows)]
        return float(rows["fixed"].mean()) if len(rows) else float("nan")
    return fixed


def _body_rule(rows: pd.DataFrame) -> float:
    """App. XII's directional decision rule: a flip is predicted where the body's part of
    the perturbation between a's top two tokens exceeds a's margin. (The whole measured
    perturbation, head included, decides the flip exactly by construction, z_b = z_a + Δ:
    not a test of anything.)"""
    predicted = rows["directional_body"] > rows["margin_a"]
    return float((predicted == rows["flip"].astype(bool)).mean())


def _rms_rule(rows: pd.DataFrame) -> float:
    """§7.1's practical RMS-scale trigger, "heuristic rather than an exact bound": a flip is
    predicted where the margin is below the typical size of the difference of two logits'
    perturbations, √2·σz (each logit moves by about σz, independently)."""
    predicted = rows["margin_a"] < math.sqrt(2) * rows["sigma_z"]
    return float((predicted == rows["flip"].astype(bool)).mean())


def _traced_detail(rows: pd.DataFrame) -> str:
    counts = rows["group"].value_counts()
    return (f"{counts.get('diverged', 0)} Diverged + {counts.get('agreed', 0)} Agreed traced step(s), "
            f"{int(rows['flip'].sum())} flip(s)")


def _body_projection(rows: pd.DataFrame) -> str:
    from scipy.stats import mannwhitneyu

    div, agr = rows[rows["group"] == "diverged"], rows[rows["group"] == "agreed"]
    if div.empty or agr.empty:
        raise ValueError("one group is empty")
    body_d, body_a = div["directional_body"].abs(), agr["directional_body"].abs()
    p = float(mannwhitneyu(body_d, body_a, alternative="two-sided").pvalue)
    return (f"{_num(float(body_d.median()))} vs {_num(float(body_a.median()))} (Mann–Whitney p = {p:.2g}); "
            f"margins {_num(float(div['margin_a'].median()))} vs {_num(float(agr['margin_a'].median()))}")


def _lift(rows: pd.DataFrame) -> float:
    return float(np.average(rows["lift"], weights=rows["n"]))


def _overhead(rows: pd.DataFrame) -> float:
    return float(rows["overhead"].max())


def _ear(rows: pd.DataFrame) -> float:
    return 1 - _rate(rows)


def _matched_pairs(rows: pd.DataFrame, study: Study) -> dict[str, Any]:
    """§6.5: per matched scale, the instruction-tuned model's EAR minus the reasoning-tuned
    one's (BF16 vs FP16, pooled over benchmarks) and the ratio of their gated-C trigger
    rates (from the C cells, where the run has them)."""
    by_paper: dict[str, str] = {}
    for model in rows["model"].unique():
        for key in paper_models(model, study.identity.get(model, model)):
            by_paper.setdefault(key, model)
    out = {}
    for scale, reasoning, instruct in MATCHED:
        r, i = by_paper.get(reasoning), by_paper.get(instruct)
        if r is None or i is None:
            continue
        pr, pi = rows[rows["model"] == r], rows[rows["model"] == i]
        out[f"{scale}: {r} vs {i}"] = f"{_pp(_ear(pi) - _ear(pr))[1:]} lower EAR"
    return out


def _cost_per_trigger(rows: pd.DataFrame, study: Study) -> dict[str, Any]:
    """§4.2: the extra compute of an intervention per step it fired on, (seconds per token
    with it − without) / trigger rate, for C (the whole head in FP32) over B with K = 8,
    per model × benchmark × precision that has all three cells."""
    out = {}
    for key, g in rows.groupby(["model", "benchmark", "precision"], sort=True):
        per = g.set_index("intervention")
        base = per.loc[per.index.isin(study.none), "seconds_per_token"]
        costs = {}
        for name, labels in (("B", study.b8_labels), ("C", study.c_labels)):
            hit = per.loc[per.index.isin(labels)]
            if len(base) and len(hit) and float(hit["trigger_rate"].iloc[0]) > 0:
                costs[name] = (float(hit["seconds_per_token"].iloc[0]) - float(base.iloc[0])) / float(
                    hit["trigger_rate"].iloc[0])
        if len(costs) == 2:
            out[" / ".join(map(str, key))] = (f"{costs['C'] / costs['B']:.3g}×" if costs["B"] > 0
                                              else "B's cost within the noise")
    return out


def _prompt_length(rows: pd.DataFrame) -> str:
    return f"up to {int(rows['max_prompt_tokens'].max())} tokens"
