"""Render a run's summaries into one self-contained HTML file (figures inline as SVG)."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path
from typing import Any

import jinja2
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from . import paper, stats, storage  # noqa: E402

sns.set_theme(style="whitegrid", context="paper")

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("tokenflip", "templates"),
    autoescape=jinja2.select_autoescape(["html", "j2"]),
    undefined=jinja2.StrictUndefined,
)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.2e}"
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{100 * value:.1f}%"


_TEMPLATES.filters["fmt"] = _fmt
_TEMPLATES.filters["pct"] = _pct


# Inline SVGs are shown at this multiple of their size in points, so that every figure's
# text reads at the same size (about 14 px for seaborn's "paper" context) whatever its
# figsize; CSS shrinks them to the column on narrow screens.
FIGURE_SCALE = 1.3


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    # Links within the page (a heatmap's row label to its drill-down) open in place.
    svg = re.sub(r'(<a xlink:href="#[^"]*") target="_blank"', r"\1", svg)
    head, rest = svg.split(">", 1)
    head = re.sub(r'\b(width|height)="([0-9.]+)pt"',
                  lambda m: f'{m.group(1)}="{float(m.group(2)) * FIGURE_SCALE:.1f}pt"', head)
    return f"{head}>{rest}"


# Figures drawn per pair, per model or per point stay as they are up to these sizes; above
# them they aggregate (per condition, over models) or rasterise their points, so that a
# study of thousands of pairs keeps figures of the same height and a file of a few MB.
MAX_PAIR_ROWS = 24
MAX_MODEL_STYLES = 4
MAX_VECTOR_POINTS = 2000


def first_divergence_figure(first_div: pd.DataFrame, pairs: pd.DataFrame) -> str | None:
    """Where sequences part: first divergence step of every diverged prompt, per pair (per
    condition, as box plots, when there are more pairs than fit in a figure)."""
    if first_div.empty:
        return None
    if first_div["pair_id"].nunique() > MAX_PAIR_ROWS:
        data = first_div.merge(pairs[["pair_id", *[c for c in ("precision", "a", "b") if c not in first_div]]],
                               on="pair_id", how="left")
        data = data.assign(condition=condition_labels(data))
        order = sorted(data["condition"].unique())
        fig, ax = plt.subplots(figsize=(6, 0.35 * len(order) + 1.0))
        sns.boxplot(data=data, x="first_div_step", y="condition", order=order, hue="axis", showfliers=False,
                    ax=ax, dodge=False)
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), frameon=False)
        ax.set_xlabel("first divergence step (generated tokens), all pairs of each condition")
        ax.set_ylabel("")
        return _svg(fig)
    order = [p for p in pairs.sort_values(["axis", "label", "context"])["pair_id"]
             if p in set(first_div["pair_id"])]
    labels = {r.pair_id: f"{r.label}\n[{r.context}]" for r in pairs.itertuples()}
    data = first_div.assign(pair=first_div["pair_id"].map(labels))
    fig, ax = plt.subplots(figsize=(6, 0.5 * len(order) + 1.0))
    sns.stripplot(data=data, x="first_div_step", y="pair", order=[labels[p] for p in order],
                  hue="axis", jitter=0.15, size=5, ax=ax, legend=True)
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.set_xlabel("first divergence step (generated tokens)")
    ax.set_ylabel("")
    return _svg(fig)


def _model_style(data: pd.DataFrame) -> str | None:
    """One line style per model for a few models; above that the lines pool the models
    (the overview's heatmaps show them one by one)."""
    return "model" if data["model"].nunique() <= MAX_MODEL_STYLES else None


def margin_figure(first_div: pd.DataFrame) -> str | None:
    """Top-1 minus top-2 logit margin at the flip step: flips happen at near-ties."""
    data = first_div.dropna(subset=["margin_a_at_div"])
    if data.empty:
        return None
    fig, ax = plt.subplots(figsize=(6, 3))
    sns.histplot(data=data, x="margin_a_at_div", hue="axis", bins=30, log_scale=(False, False), ax=ax)
    ax.set_xlabel("top-2 margin at the divergence step (side a, logits)")
    return _svg(fig)


def _read_optional(path: Path) -> pd.DataFrame:
    return storage.read_table(path)[0].to_pandas() if path.exists() else pd.DataFrame()


def kv_table(pairs: pd.DataFrame) -> list[dict[str, Any]]:
    """Cache ON vs OFF per model × benchmark × decoding × precision × batch size
    (paper Table: divergence, accuracy ON vs OFF, McNemar)."""
    if pairs.empty:
        return []
    cache = pairs[(pairs["axis"] == "cache") & (pairs["status"] == "done")].copy()
    if cache.empty:
        return []
    cache = cache.assign(accuracy_diff=cache["accuracy_a"] - cache["accuracy_b"])
    return cache.sort_values(["model", "benchmark", "decoding", "precision", "batch_size"]).to_dict("records")


def kv_claims(rows: list[dict[str, Any]], probe_rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The paper's headline claims next to what this run measured, each by the paper's
    quantity: the FP32 falsification's "eight orders of magnitude" (Fig. 3) is a ratio of
    per-step KL, which only the teacher-forced KV-cache probe measures (`probe_rows`, see
    `probe_claims`), never a ratio of max |Δlogit|."""
    if not rows:
        return {}
    df = pd.DataFrame(rows)
    # "Cache-ON more accurate in 8 of 9 conditions" (arXiv 2604.15409, abstract and §4) counts
    # the FP16 conditions (model x decoding strategy) only: the FP32 rows are the control.
    fp16 = df[df["precision"] == "fp16"]
    out: dict[str, Any] = {"conditions": len(fp16),
                           "on_better": int((fp16["accuracy_diff"] > 0).sum()),
                           "off_better": int((fp16["accuracy_diff"] < 0).sum())}
    for precision in ("fp16", "bf16", "fp32"):
        sub = df[df["precision"] == precision]
        if not sub.empty:
            out[precision] = {"diverged": int(sub["n_diverged"].sum()), "n": int(sub["n_prompts"].sum()),
                              "nonequiv": int(sub["n_logit_diff_before_div"].sum()),
                              "max_dlogit": float(sub["max_abs_dlogit"].max())}
    ratios = [r for r in probe_rows or [] if r["precision"] == "fp16" and r.get("kl_vs_fp32") is not None]
    out["fp32_kl"] = [{"model": r["model"], "log10": math.log10(r["kl_vs_fp32"])} for r in ratios]
    return out


_WHY = {"diverged": "diverged in the pair it explains", "agreed": "agreed there", "first": "the benchmark's first"}


def traced_prompts(steps: pd.DataFrame) -> list[dict[str, str]]:
    """Per model × benchmark, which prompts a probe traced and why (its `chosen_as`: from
    the results of the pairs it explains, or the benchmark's first)."""
    if steps.empty or "chosen_as" not in steps:
        return []
    out = []
    chosen = steps.drop_duplicates(["model", "benchmark", "prompt_id"])
    for (model, bench), g in chosen.groupby(["model", "benchmark"], sort=True):
        parts = [f"{', '.join(map(str, h['prompt_id']))} ({_WHY.get(why, why)})"
                 for why, h in g.groupby("chosen_as", sort=False)]
        out.append({"model": model, "benchmark": bench, "text": "traced " + "; ".join(parts)})
    return out


def flip_table(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Per probed prompt: the first step where cache-off would pick another token, with the
    KL and margin there and the largest KL before it (paper Fig. 4's data)."""
    if steps.empty:
        return []
    rows = []
    for (model, precision, prompt), g in steps.sort_values("step").groupby(["model", "precision", "prompt_id"]):
        flips = g[g["flip"]]
        first = flips.iloc[0] if len(flips) else None
        before = g[g["step"] < first["step"]] if first is not None else g
        rows.append({"model": model, "precision": precision, "prompt_id": prompt,
                     "first_flip": int(first["step"]) if first is not None else None,
                     "kl_at_flip": float(first["kl"]) if first is not None else None,
                     "margin_at_flip": float(first["margin_on"]) if first is not None else None,
                     "max_kl_before": float(before["kl"].max()) if len(before) else None,
                     "min_margin_before": float(before["margin_on"].min()) if len(before) else None})
    return rows


def probe_claims(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Per precision, from the teacher-forced KV probe: how far cache-off moves the logits
    at identical inputs, and on how many steps it would pick another token."""
    if steps.empty:
        return []
    rows = []
    for (model, precision), g in steps.groupby(["model", "precision"]):
        rows.append({"model": model, "precision": precision, "steps": len(g), "flips": int(g["flip"].sum()),
                     "steps_differ": int((g["max_abs_dlogit"] > 0).sum()),
                     "median_kl": float(g["kl"].median()), "max_kl": float(g["kl"].max()),
                     "max_abs_dlogit": float(g["max_abs_dlogit"].max())})
    # "Eight orders of magnitude" (arXiv 2604.15409, Fig. 3) is a ratio of KL, which grows with
    # the square of the logit difference: compare KL with KL (median over the probed steps).
    by = {(r["model"], r["precision"]): r for r in rows}
    for r in rows:
        fp32 = by.get((r["model"], "fp32"))
        r["kl_vs_fp32"] = (r["median_kl"] / fp32["median_kl"]
                           if fp32 and fp32["median_kl"] > 0 and r["precision"] != "fp32" else None)
        r["dlogit_vs_fp32"] = (r["max_abs_dlogit"] / fp32["max_abs_dlogit"]
                               if fp32 and fp32["max_abs_dlogit"] > 0 and r["precision"] != "fp32" else None)
    return rows


def form_claims(forms: pd.DataFrame) -> list[dict[str, Any]]:
    """Per cache form, from the KV probe: how far the form moves the logits of the default
    cache at identical inputs, and on how many steps it would pick another token."""
    if forms.empty:
        return []
    return [{"model": model, "precision": precision, "form": form, "prompts": int(g["prompt_id"].nunique()),
             "steps": len(g), "flips": int(g["flip"].sum()), "steps_differ": int((g["max_abs_dlogit"] > 0).sum()),
             "median_kl": float(g["kl"].median()), "max_kl": float(g["kl"].max()),
             "max_abs_dlogit": float(g["max_abs_dlogit"].max())}
            for (model, precision, form), g in forms.groupby(["model", "precision", "form"])]


def _kl_lines(data: pd.DataFrame, hue: str, label: str) -> str:
    """Per-step KL along a shared trajectory, one line per `hue` (median and range over
    prompts), log scale; zeros drawn at 1e-20."""
    data = data.assign(kl_plot=data["kl"].clip(lower=1e-20))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    sns.lineplot(data=data, x="step", y="kl_plot", hue=hue, style=_model_style(data),
                 errorbar=("pi", 100), estimator="median", ax=ax)
    ax.set_yscale("log")
    ax.set_ylabel(f"{label} per step (median, range)")
    ax.set_xlabel("generated token")
    return _svg(fig)


def form_kl_figure(forms: pd.DataFrame) -> str | None:
    """Per-step KL(default‖form) along the default cache's trajectory, per cache form."""
    if forms.empty or not (forms["kl"] > 0).any():
        return None
    return _kl_lines(forms.assign(variant=forms["form"] + ", " + forms["precision"]), "variant", "KL(default‖form)")


def kl_figure(steps: pd.DataFrame) -> str | None:
    """Per-step KL(ON‖OFF) along a shared trajectory, per precision, log scale (paper Fig. 3)."""
    if steps.empty:
        return None
    return _kl_lines(steps, "precision", "KL(ON‖OFF)")


def flip_kl_figure(steps: pd.DataFrame) -> str | None:
    """Each step's top-2 margin against its KL, flips marked (paper Fig. 4's decision boundary)."""
    if steps.empty:
        return None
    data = steps.assign(kl_plot=steps["kl"].clip(lower=1e-20),
                        margin_plot=steps["margin_on"].clip(lower=1e-6),
                        outcome=steps["flip"].map({True: "argmax flips", False: "same argmax"}))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    sns.scatterplot(data=data, x="kl_plot", y="margin_plot", hue="outcome", style="precision",
                    hue_order=["same argmax", "argmax flips"], s=18, alpha=0.7, ax=ax,
                    rasterized=len(data) > MAX_VECTOR_POINTS)
    flips = data[data["flip"]]
    if not flips.empty:
        ax.axhline(float(flips["max_abs_dlogit"].max()), color="gray", ls="--", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("KL(ON‖OFF) at the step")
    ax.set_ylabel("top-2 margin (cache ON)")
    return _svg(fig)


def drift_figure(layers: pd.DataFrame) -> str | None:
    """Per-layer L2 of the ON−OFF difference of each layer's output (paper Fig. 2)."""
    if layers.empty:
        return None
    data = layers.groupby(["model", "precision", "layer"], as_index=False)["l2"].mean()
    data = data.assign(l2_plot=data["l2"].clip(lower=1e-12))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    sns.lineplot(data=data, x="layer", y="l2_plot", hue="precision", style=_model_style(data), marker="o", ax=ax)
    ax.set_yscale("log")
    ax.set_ylabel("mean ‖h_ON − h_OFF‖₂ over steps and prompts")
    return _svg(fig)


# Whole-state patches of the KV-cache probe, in reading order (the per-layer ones are drawn
# against the layer).
WHOLE_PATCHES = ("residual stream", "kv cache")


def patching_figure(patching: pd.DataFrame) -> str | None:
    """Share of the KL to cache-OFF recovered by patching cache-OFF state into the cache-ON
    step (paper Fig. 5): the whole residual stream and the whole KV cache, then one layer
    at a time."""
    if patching.empty or "kind" not in patching:
        return None
    data = patching[patching["kind"] != "none"].dropna(subset=["kl_recovered"])
    if data.empty:
        return None
    data = data.assign(recovered=100 * data["kl_recovered"])
    fig, (whole_ax, layer_ax) = plt.subplots(1, 2, figsize=(9, 3.2), gridspec_kw={"width_ratios": [1, 2]})
    whole = data[data["kind"].isin(WHOLE_PATCHES)]
    sns.barplot(data=whole, x="kind", y="recovered", hue="precision", order=list(WHOLE_PATCHES),
                estimator="median", errorbar=None, ax=whole_ax)
    whole_ax.set_xlabel("")
    whole_ax.set_ylabel("KL recovered (%, median)")
    per_layer = data[data["kind"].isin(["residual layer", "kv layer"])]
    sns.lineplot(data=per_layer, x="layer", y="recovered", hue="precision", style="kind", estimator="median",
                 errorbar=None, marker="o", ax=layer_ax)
    layer_ax.set_ylabel("KL recovered (%, median)")
    for ax in (whole_ax, layer_ax):
        ax.axhline(100, color="grey", linewidth=0.6)
    return _svg(fig)


# What each patching table gives per group of patched steps.
PATCH_FIGURES = dict(experiments=("kl", "size"), median_kl=("kl", "median"), recovered=("kl_recovered", "median"),
                     flips=("flip", "sum"))


def patching_table(patching: pd.DataFrame) -> list[dict[str, Any]]:
    """Unpatched, the whole residual stream and the whole KV cache, per model and
    precision (the per-layer patches: `patching_layer_table`)."""
    if patching.empty or "kind" not in patching:
        return []
    data = patching[patching["kind"].isin(("none", *WHOLE_PATCHES))]
    agg = data.groupby(["model", "precision", "patch"], as_index=False).agg(
        **PATCH_FIGURES, max_abs_dlogit=("max_abs_dlogit", "max"))
    order = {patch: i for i, patch in enumerate(("none", *WHOLE_PATCHES))}
    return agg.sort_values(["model", "precision", "patch"], key=lambda c: c.map(order) if c.name == "patch" else c
                           ).to_dict("records")


def patching_layer_table(patching: pd.DataFrame) -> list[dict[str, Any]]:
    """The per-layer patches, one row per model, precision, kind and layer."""
    if patching.empty or "kind" not in patching:
        return []
    data = patching[patching["kind"].isin(("residual layer", "kv layer"))]
    return data.groupby(["model", "precision", "kind", "layer"], as_index=False).agg(**PATCH_FIGURES).to_dict("records")


def probe_sigma_z(steps: pd.DataFrame) -> dict[tuple[str, str, str, str], dict[str, float]]:
    """σz as arXiv 2609.26621 §I.3 defines it (per-logit RMS of the logit difference over
    the whole vocabulary), pooled over the precision probe's steps as an RMS, and the LM
    head's share of it (§7.3: 97.6%), Σσ_head² / Σ(σ_head² + σ_body²), per model,
    benchmark and precision pair."""
    if steps.empty or "sigma_z" not in steps:
        return {}
    keys = ["model", "benchmark", "a", "b"]
    sq = steps.assign(total=steps["sigma_z"] ** 2, head=steps.get("sigma_z_head", float("nan")) ** 2,
                      body=steps.get("sigma_z_body", float("nan")) ** 2).groupby(keys)[["total", "head", "body"]]
    mean, summed = sq.mean(), sq.sum()
    share = summed["head"] / (summed["head"] + summed["body"])
    return {key: {"sigma_z": float(mean.loc[key, "total"] ** 0.5), "head_share": float(share.loc[key])}
            for key in mean.index}


def precision_table(pairs: pd.DataFrame, steps: pd.DataFrame | None = None) -> list[dict[str, Any]]:
    """Cross-precision divergence spectrum (paper Table 2): precision pairs, no intervention,
    with σz from the precision probe where it ran on the same model, benchmark and pair."""
    if pairs.empty:
        return []
    prec = pairs[(pairs["axis"] == "precision") & (pairs["status"] == "done")].copy()
    if prec.empty:
        return []
    prec = prec.assign(ear_low=1 - prec["divergence_ci_high"], ear_high=1 - prec["divergence_ci_low"])
    prec = prec[prec["intervention"] == "none"]
    sigma = probe_sigma_z(steps if steps is not None else pd.DataFrame())
    nothing = {"sigma_z": float("nan"), "head_share": float("nan")}
    for column in nothing:
        prec[column] = [sigma.get((r.model, r.benchmark, r.a, r.b), nothing)[column] for r in prec.itertuples()]
    return prec.sort_values(["model", "benchmark", "a", "b", "cache", "batch_size"]).to_dict("records")


def intervention_figure(interventions: pd.DataFrame) -> str | None:
    """Exact agreement per intervention, with the lift's paired-bootstrap 90% interval."""
    data = interventions[interventions["status"] == "done"] if not interventions.empty else interventions
    if data.empty or data["intervention"].nunique() < 2:
        return None
    data = data.assign(condition=data["a"] + " vs " + data["b"] + ", " + data["batch_size"].astype(str))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    sns.barplot(data=data, x="intervention", y="ear", hue="condition", errorbar=None, ax=ax)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("exact agreement rate (EAR)")
    return _svg(fig)


def batch_figure(interventions: pd.DataFrame) -> str | None:
    """EAR per batch size and intervention (paper: the head-only lift vanishes at bs ≥ 8)."""
    data = interventions[interventions["status"] == "done"] if not interventions.empty else interventions
    if data.empty or data["batch_size"].nunique() < 2:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.2))
    sns.lineplot(data=data, x="batch_size", y="ear", hue="intervention", style=_model_style(data), marker="o",
                 ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_ylabel("EAR")
    return _svg(fig)


# Grafting sites in the order of the forward pass, and the label of each as a column.
GRAFT_ORDER = {"embedding": -2, "final_norm": 10_000, "kv_cache": 10_001}
GRAFT_COLUMNS = {-2: "emb", 10_000: "norm", 10_001: "KV"}


def graft_frame(grafting: pd.DataFrame) -> pd.DataFrame:
    """Grafting rows with `into` (the run grafted into, ← the precision grafted from) and a
    `position` that orders the sites as the forward pass meets them."""
    into, source = paper.graft_ends(grafting)
    position = grafting["site"].map(GRAFT_ORDER).fillna(grafting["layer"]).astype(int)
    return grafting.assign(into=into + " ← " + source, position=position)


def grafting_table(grafting: pd.DataFrame) -> list[dict[str, Any]]:
    """Flips fixed by grafting one site (or the KV cache) of the other precision, in both
    directions (paper Table 8, App. II(iii))."""
    if grafting.empty or "direction" not in grafting:
        return []
    frame = graft_frame(grafting)
    if "lossless" not in frame:
        frame = frame.assign(lossless=float("nan"))
    agg = frame.groupby(["model", "into", "graft", "position"], as_index=False).agg(
        flips=("fixed", "size"), fixed=("fixed", "sum"), lossless=("lossless", "mean"))
    return agg.assign(rate=agg["fixed"] / agg["flips"]).sort_values(["model", "into", "position"]).to_dict("records")


def lens_table(lens: pd.DataFrame) -> list[dict[str, Any]]:
    """Logit lens per layer for Diverged and Agreed prompts (paper Table 10, App. III):
    top-1 and top-2 agreement, median top-2 margins of both precisions, mean layer L2."""
    if lens.empty or "group" not in lens:
        return []
    agg = lens.groupby(["model", "a", "b", "group", "layer"], as_index=False).agg(
        prompts=("top1_agree", "size"), top1=("top1_agree", "mean"), top2=("top2_agree", "mean"),
        margin_a=("margin_a", "median"), margin_b=("margin_b", "median"), l2=("l2", "mean"))
    return agg.sort_values(["model", "a", "b", "group", "layer"]).to_dict("records")


def lens_figure(lens: pd.DataFrame) -> str | None:
    """Median top-2 margin of precision a's logit lens and mean layer L2, per layer, for
    Diverged and Agreed prompts (paper App. II(iv): the Diverged margin shrinks to the
    last layer while the Agreed one grows; App. III: the body L2 does not tell them apart)."""
    if lens.empty or "group" not in lens:
        return None
    lens = lens[lens["group"].isin(["diverged", "agreed"])]
    # A tie (margin 0) is drawn at 10⁻³, the margin gate's τ: below it the order is a coin toss.
    data = lens.assign(margin_plot=lens["margin_a"].clip(lower=1e-3), l2_plot=lens["l2"].clip(lower=1e-12))
    fig, (margin_ax, l2_ax) = plt.subplots(1, 2, figsize=(9, 3.2))
    style = _model_style(data)
    sns.lineplot(data=data, x="layer", y="margin_plot", hue="group", hue_order=["diverged", "agreed"], style=style,
                 estimator="median", errorbar=None, marker="o", ax=margin_ax)
    margin_ax.set_yscale("log")
    margin_ax.set_ylabel("median top-2 margin (lens, a)")
    sns.lineplot(data=data, x="layer", y="l2_plot", hue="group", hue_order=["diverged", "agreed"], style=style,
                 estimator="mean", errorbar=None, marker="o", ax=l2_ax)
    l2_ax.set_yscale("log")
    l2_ax.set_ylabel("mean ‖h_a − h_b‖₂")
    return _svg(fig)


def precision_drift_figure(layers: pd.DataFrame) -> str | None:
    """Per-layer L2 distance between the two precisions' layer outputs."""
    if layers.empty:
        return None
    data = layers.groupby(["model", "a", "b", "layer"], as_index=False)["l2"].mean()
    data = data.assign(pair=data["a"] + " vs " + data["b"], l2_plot=data["l2"].clip(lower=1e-12))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    sns.lineplot(data=data, x="layer", y="l2_plot", hue="pair", style=_model_style(data), marker="o", ax=ax)
    ax.set_yscale("log")
    ax.set_ylabel("mean ‖h_a − h_b‖₂")
    return _svg(fig)


def cv_heuristic(cells: pd.DataFrame, interventions: pd.DataFrame) -> list[dict[str, Any]]:
    """CV of the top-2 margin in one 16-bit run (no intervention, batch size 1) against the
    lift each intervention measured, per model × benchmark; Spearman across those points.
    In-sample: the same prompts give both numbers."""
    from scipy.stats import pearsonr, spearmanr

    if cells.empty or interventions.empty or "cv_margin" not in cells:
        return []
    done = interventions[(interventions["status"] == "done") & (interventions["intervention"] != "none")
                         & (interventions["batch_size"] == 1)]
    base = cells[(cells["status"] == "done") & (cells["intervention"] == "none") & (cells["batch_size"] == 1)]
    out = []
    for name, group in done.groupby("intervention"):
        points = []
        for r in group.itertuples():
            cv = base[(base["model"] == r.model) & (base["benchmark"] == r.benchmark) & (base["precision"] == r.a)
                      & (base["cache"] == r.cache)]["cv_margin"]
            if len(cv):
                points.append((float(cv.iloc[0]), float(r.lift)))
        rho = p = r_pearson = p_pearson = float("nan")
        if len(points) >= 3:
            res = spearmanr([x for x, _ in points], [y for _, y in points])
            rho, p = float(res.statistic), float(res.pvalue)
            pres = pearsonr([x for x, _ in points], [y for _, y in points])   # the paper gives both (§8.3)
            r_pearson, p_pearson = float(pres.statistic), float(pres.pvalue)
        out.append({"intervention": name, "points": len(points), "rho": rho, "p": p, "pearson_r": r_pearson,
                    "pearson_p": p_pearson})
    return out


# --- overview: the headline results as heatmaps that keep their size as the study grows ---

# Heatmap geometry (inches before FIGURE_SCALE): a cell with a two-line annotation, a
# cell without one, and the height of a row; rows shrink down to MIN_ROW for tall maps
# so that no figure grows past about one screen.
ANNOTATED_CELL = (0.86, 0.46)
PLAIN_CELL_WIDTH = 0.16
MIN_ROW = 0.2
MAX_HEATMAP_HEIGHT = 7.5
MAX_ANNOTATED_CELLS = 400


def condition_labels(rows: pd.DataFrame) -> pd.Series:
    """What a pair compares, without model and benchmark: 'axis: a vs b', plus the shared
    precision where the study varies it (cache ON vs OFF in fp32 is another finding than
    in fp16)."""
    base = rows["axis"].astype(str) + ": " + rows["a"].astype(str) + " vs " + rows["b"].astype(str)
    if "precision" not in rows:
        return base
    varied = rows.groupby("axis")["precision"].transform(lambda p: p.nunique() > 1)
    with_precision = varied & rows["precision"].notna() & (rows["axis"] != "precision")
    return base.where(~with_precision, base + " · " + rows["precision"].astype(str))


def _model_links(labels: list[str], models: set[str]) -> list[str | None]:
    """The drill-down link of each heatmap row label that names (or starts with) a model."""
    return [f"#model={label.split(' · ')[0]}" if label.split(" · ")[0] in models else None for label in labels]


def heatmap(values: pd.DataFrame, *, cmap: str, label: str, annotations: pd.DataFrame | None = None,
            vmin: float | None = None, vmax: float | None = None, log: bool = False, center: float | None = None,
            xlabel: str = "", ylabel: str = "", row_links: list[str | None] | None = None) -> str:
    """One heatmap (rows x columns of `values`) as inline SVG, sized by its shape: row labels
    are links to the drill-down where `row_links` says so."""
    from matplotlib.colors import LogNorm

    n_rows, n_cols = values.shape
    annotate = annotations is not None and values.size <= MAX_ANNOTATED_CELLS
    cell_w = ANNOTATED_CELL[0] if annotate else PLAIN_CELL_WIDTH
    row_h = max(MIN_ROW, min(ANNOTATED_CELL[1] if annotate else 0.3, MAX_HEATMAP_HEIGHT / max(n_rows, 1)))
    fig, ax = plt.subplots(figsize=(max(2.5, cell_w * n_cols + 1.2), row_h * n_rows + 0.9))
    norm = None
    if log:
        positive = values[values > 0].stack()
        low = float(positive.min()) if len(positive) else 1e-12
        norm = LogNorm(vmin=low, vmax=max(float(values.max().max()), low * 10))
        values = values.clip(lower=low)
    sns.heatmap(values.astype(float), ax=ax, cmap=cmap, norm=norm, vmin=None if log else vmin,
                vmax=None if log else vmax, center=center, annot=annotations.to_numpy() if annotate else False,
                fmt="", annot_kws={"fontsize": 7.5}, linewidths=0.5, linecolor="white",
                cbar_kws={"label": label, "shrink": 0.8 if n_rows > 4 else 1.0})
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="y", rotation=0)
    # Column labels one part per line ("axis: a vs b · precision"), never rotated: long
    # labels stay as wide as their cell instead of overlapping their neighbours.
    ax.set_xticks(ax.get_xticks(), [_column_label(t.get_text()) for t in ax.get_xticklabels()], rotation=0)
    if annotate:
        ax.tick_params(axis="x", labelsize=7.5)
    elif n_cols > 12:
        ax.tick_params(axis="x", labelsize=7)
    for text, link in zip(ax.get_yticklabels(), row_links or [], strict=False):
        if link:
            text.set_url(link)
    return _svg(fig)


def _batch(size: Any) -> str:
    """A batch size as written in the config (the summary stores it as float beside None)."""
    return str(int(size)) if isinstance(size, (int, float)) and not math.isnan(size) else str(size)


def _column_label(label: str, width: int = 11) -> str:
    """A heatmap column label one part per line ("axis: a vs b · precision"), long parts
    broken after "vs", so that it is no wider than its cell."""
    lines = []
    for part in label.replace(": ", " · ").split(" · "):
        lines.extend(part.replace(" vs ", " vs\n").split("\n") if len(part) > width else [part])
    return "\n".join(lines)


def _pooled(group: pd.DataFrame) -> pd.Series:
    n, d = int(group["n_prompts"].sum()), int(group["n_diverged"].sum())
    low, high = stats.wilson(d, n)
    return pd.Series({"n": n, "diverged": d, "rate": d / n if n else float("nan"), "low": low, "high": high})


def divergence_overview(pairs: pd.DataFrame) -> pd.DataFrame:
    """Divergence pooled over benchmarks and shared settings, per model x condition, with
    the Wilson interval of the pooled counts."""
    done = pairs[pairs["status"] == "done"] if not pairs.empty else pairs
    if done.empty:
        return pd.DataFrame()
    done = done.assign(condition=condition_labels(done))
    return done.groupby(["model", "condition"], sort=False).apply(_pooled, include_groups=False).reset_index()


def divergence_heatmap(pairs: pd.DataFrame) -> str | None:
    """Paper headline (both papers): share of prompts that diverge, model x condition."""
    table = divergence_overview(pairs)
    if table.empty:
        return None
    models = list(dict.fromkeys(table["model"]))
    conditions = sorted(table["condition"].unique())
    rates = table.pivot(index="model", columns="condition", values="rate").reindex(index=models, columns=conditions)
    notes = table.assign(note=[f"{100 * r:.0f}%\n{100 * lo:.0f}–{100 * hi:.0f}" for r, lo, hi in
                               zip(table["rate"], table["low"], table["high"])])
    notes = notes.pivot(index="model", columns="condition", values="note").reindex(index=models, columns=conditions)
    return heatmap(rates, annotations=notes.fillna(""), cmap="Reds", vmin=0, vmax=1,
                   label="divergence rate", row_links=_model_links(models, set(models)))


def ear_heatmap(pairs: pd.DataFrame) -> str | None:
    """Paper 2's EAR (exact agreement between two precisions, no intervention) by model x
    benchmark x batch size, pooled over the other settings."""
    if pairs.empty:
        return None
    prec = pairs[(pairs["axis"] == "precision") & (pairs["status"] == "done")]
    if "intervention" in prec:
        prec = prec[prec["intervention"].isin(["none"]) | prec["intervention"].isna()]
    if prec.empty:
        return None
    several = (prec["a"] + prec["b"]).nunique() > 1
    column = prec["benchmark"] + " · bs " + prec["batch_size"].map(_batch)
    if several:
        column = prec["a"] + " vs " + prec["b"] + " · " + column
    table = prec.assign(column=column).groupby(["model", "column"], sort=False).apply(
        _pooled, include_groups=False).reset_index()
    table = table.assign(ear=1 - table["rate"], note=[f"{100 * (1 - r):.0f}%\n{100 * (1 - h):.0f}–{100 * (1 - lo):.0f}"
                                                      for r, lo, h in zip(table["rate"], table["low"], table["high"])])
    models = list(dict.fromkeys(table["model"]))
    columns = list(dict.fromkeys(column.sort_values(key=lambda c: c.str.replace(r"bs (\d+)$", lambda m: f"bs {int(m[1]):04d}",
                                                                               regex=True))))
    ear = table.pivot(index="model", columns="column", values="ear").reindex(index=models, columns=columns)
    notes = table.pivot(index="model", columns="column", values="note").reindex(index=models, columns=columns)
    return heatmap(ear, annotations=notes.fillna(""), cmap="RdYlGn", vmin=0, vmax=1,
                   label="EAR", row_links=_model_links(models, set(models)))


def lift_heatmap(interventions: pd.DataFrame) -> str | None:
    """Each intervention's EAR lift over no intervention, by model (mean over benchmarks and
    shared settings, per batch size: the paper's head-only lift fades at large batches)."""
    if interventions.empty:
        return None
    data = interventions[(interventions["status"] == "done") & (interventions["intervention"] != "none")]
    if data.empty:
        return None
    data = data.assign(column=data["intervention"] + " · bs " + data["batch_size"].map(_batch))
    table = data.groupby(["model", "column"], sort=False).agg(lift=("lift", "mean"), low=("lift_ci_low", "min"),
                                                              high=("lift_ci_high", "max")).reset_index()
    table = table.assign(note=[f"{100 * v:+.1f}" for v in table["lift"]])
    models = list(dict.fromkeys(table["model"]))
    columns = sorted(table["column"].unique(), key=lambda c: (c.rsplit(" · bs ", 1)[0], int(c.rsplit(" ", 1)[1])))
    lift = 100 * table.pivot(index="model", columns="column", values="lift").reindex(index=models, columns=columns)
    notes = table.pivot(index="model", columns="column", values="note").reindex(index=models, columns=columns)
    bound = max(float(lift.abs().max().max()), 1.0)
    return heatmap(lift, annotations=notes.fillna(""), cmap="RdBu", vmin=-bound, vmax=bound, center=0,
                   label="EAR lift (pp)", row_links=_model_links(models, set(models)))


def layer_heatmap(frame: pd.DataFrame, value: str, label: str, *, by: tuple[str, ...] = (), log: bool = False,
                  cmap: str = "viridis", vmin: float | None = None, vmax: float | None = None,
                  rate: bool = False, labels: dict[int, str] | None = None) -> str | None:
    """A per-layer probe result as a heatmap of (model · `by`) x layer, mean over
    benchmarks, steps and prompts; `labels` names the columns that are not layers."""
    if frame.empty:
        return None
    rows = frame["model"].astype(str)
    for column in by:
        if frame[column].nunique() > 1:
            rows = rows + " · " + frame[column].astype(str)
    data = frame.assign(row=rows).groupby(["row", "layer"], sort=False)[value].mean()
    table = data.unstack("layer")
    table = table.reindex(columns=sorted(table.columns)) * (100 if rate else 1)
    table.columns = [(labels or {}).get(c, str(c)) for c in table.columns]
    order = list(dict.fromkeys(rows))
    return heatmap(table.reindex(order), cmap=cmap, label=label, log=log, vmin=vmin, vmax=vmax, xlabel="layer",
                   row_links=_model_links(order, set(frame["model"].astype(str))))


def overview_figures(pairs: pd.DataFrame, interventions: pd.DataFrame,
                     probes: dict[str, pd.DataFrame]) -> list[dict[str, str]]:
    """The overview's figures, in reading order: (id, title, svg, caption) for each the run
    has data for."""
    kv_layers, prec_layers = probes.get("kv_layers", pd.DataFrame()), probes.get("precision_layers", pd.DataFrame())
    grafting, lens = probes.get("precision_grafting", pd.DataFrame()), probes.get("precision_lens", pd.DataFrame())
    if not prec_layers.empty:
        prec_layers = prec_layers.assign(pair=prec_layers["a"] + " vs " + prec_layers["b"])
    if not grafting.empty and "direction" in grafting:
        grafting = graft_frame(grafting)
        grafting = grafting.assign(pair=grafting["into"], layer=grafting["position"],
                                   fixed=grafting["fixed"].astype(float))
    else:
        grafting = pd.DataFrame()
    if not lens.empty and "group" in lens:
        lens = lens[lens["group"] == "diverged"]
        lens = lens.assign(pair=lens["a"] + " vs " + lens["b"], top1=lens["top1_agree"].astype(float))
    else:
        lens = pd.DataFrame()
    specs = [
        ("ov-divergence", "Divergence rate by model and condition", lambda: divergence_heatmap(pairs),
         "Share of prompts whose two generated token sequences differ, pooled over benchmarks and shared "
         "settings, with its 95% Wilson interval. Papers: 100% for cache ON vs OFF in FP16, 49–100% for BF16 vs "
         "FP16, none in FP32."),
        ("ov-ear", "Exact agreement (EAR) by model, benchmark and batch size", lambda: ear_heatmap(pairs),
         "Precision pairs without intervention, pooled over the other settings (paper 2, Table 2)."),
        ("ov-lift", "Intervention lift by model", lambda: lift_heatmap(interventions),
         "Mean EAR lift of each intervention over none, in percentage points, per batch size (paper 2, Table 3: "
         "+22–36 pp at batch size 1, vanishing at 8). Intervals per condition in the interventions table."),
        ("ov-kv-drift", "Per-layer drift, cache ON vs OFF",
         lambda: layer_heatmap(kv_layers, "l2", "mean ‖h_ON − h_OFF‖₂", by=("precision",), log=True),
         "Teacher-forced probe: L2 of the difference of each layer's output (paper 1, Fig. 2)."),
        ("ov-precision-drift", "Per-layer drift between precisions",
         lambda: layer_heatmap(prec_layers, "l2", "mean ‖h_a − h_b‖₂", by=("pair",), log=True),
         "Precision a's trajectory replayed through b: L2 distance of each layer's output (paper 2, §7)."),
        ("ov-grafting", "Flips fixed by grafting one site",
         lambda: layer_heatmap(grafting, "fixed", "flips fixed (%)", by=("pair",), rate=True, cmap="Greens",
                               vmin=0, vmax=100, labels=GRAFT_COLUMNS),
         "Share of flip steps whose argmax becomes the other precision's after grafting its embedding, one "
         "layer's output, its final norm's output or its own KV cache into the run (row: into ← from; paper 2, "
         "Table 8 and App. II(iii))."),
        ("ov-lens", "Logit lens: top-1 agreement per layer, Diverged prompts",
         lambda: layer_heatmap(lens, "top1", "top-1 agree at the first flip (%)", by=("pair",), rate=True,
                               cmap="Blues", vmin=0, vmax=100),
         "Each layer read through the final norm and LM head of both precisions at each Diverged prompt's "
         "first flip (paper 2, Table 10)."),
    ]
    out = []
    for key, title, draw, caption in specs:
        svg = draw()
        if svg:
            out.append({"id": key, "title": title, "svg": svg, "caption": caption, "width": svg_width_px(svg)})
    return out


def svg_width_px(svg: str) -> int:
    """The width an inline SVG asks for, in CSS pixels (its captions wrap to it)."""
    points = float(re.search(r'\bwidth="([0-9.]+)pt"', svg[:svg.index(">")]).group(1))
    return math.ceil(points * 4 / 3)


def drilldown_table(pairs: pd.DataFrame, first_div: pd.DataFrame) -> list[dict[str, Any]]:
    """Per model x benchmark x condition: pooled divergence with its interval, median first
    divergence step and accuracy of both sides; the table the drill-down filters."""
    done = pairs[pairs["status"] == "done"] if not pairs.empty else pairs
    if done.empty:
        return []
    done = done.assign(condition=condition_labels(done))
    keys = ["model", "benchmark", "condition"]
    table = done.groupby(keys, sort=False).apply(_pooled, include_groups=False).reset_index()
    extra = done.groupby(keys, sort=False).agg(pairs=("pair_id", "size"), accuracy_a=("accuracy_a", "mean"),
                                              accuracy_b=("accuracy_b", "mean"),
                                              max_abs_dlogit=("max_abs_dlogit", "max")).reset_index()
    table = table.merge(extra, on=keys)
    if not first_div.empty:
        steps = first_div.merge(done[["pair_id", "condition"]], on="pair_id").groupby(keys)["first_div_step"].median()
        table = table.merge(steps.rename("median_first_div_step").reset_index(), on=keys, how="left")
    else:
        table = table.assign(median_first_div_step=float("nan"))
    return table.sort_values(keys).to_dict("records")


def render(summary_dir: str | Path, out_path: str | Path, config: dict[str, Any],
           title: str | None = None, partial: bool = False, tables_dir: str | Path | None = None) -> Path:
    summary_dir, out_path = Path(summary_dir), Path(out_path)
    cells, _ = storage.read_table(summary_dir / "cells.parquet")
    pairs, _ = storage.read_table(summary_dir / "pairs.parquet")
    first_div, _ = storage.read_table(summary_dir / "first_divergence.parquet")
    cells_df, pairs_df, first_df = cells.to_pandas(), pairs.to_pandas(), first_div.to_pandas()
    done_pairs = pairs_df[pairs_df["status"] == "done"] if not pairs_df.empty else pairs_df
    environment = _environment(_read_optional(summary_dir / "environment.parquet"))
    kv_steps = _read_optional(summary_dir / "kv_steps.parquet")
    kv_layers = _read_optional(summary_dir / "kv_layers.parquet")
    kv_patching = _read_optional(summary_dir / "kv_patching.parquet")
    kv_forms = _read_optional(summary_dir / "kv_forms.parquet")
    kv_rows = kv_table(pairs_df)
    interventions_df = _read_optional(summary_dir / "interventions.parquet")
    prec_steps = _read_optional(summary_dir / "precision_steps.parquet")
    precision_rows = precision_table(pairs_df, prec_steps)
    prec_layers = _read_optional(summary_dir / "precision_layers.parquet")
    grafting = _read_optional(summary_dir / "precision_grafting.parquet")
    lens = _read_optional(summary_dir / "precision_lens.parquet")
    context = dict(
        title=(title or config.get("report", {}).get("title") or f"tokenflip — {config['run']}")
        + (" (partial: some jobs failed)" if partial else ""),
        run=config["run"],
        headline=_headline(done_pairs),
        paper_rows=paper.comparison_rows(
            paper.Tables(pairs=pairs_df, interventions=interventions_df, first_divergence=first_df, cells=cells_df,
                         kv_steps=kv_steps, kv_layers=kv_layers, kv_patching=kv_patching,
                         precision_steps=prec_steps, grafting=grafting, lens=lens),
            paper.Study.of(config), _device_label(environment)),
        pairs=pairs_df.sort_values(["model", "benchmark", "axis", "a", "b", "context"]).to_dict("records")
        if not pairs_df.empty else [],
        cells=cells_df.sort_values("cell_id").to_dict("records") if not cells_df.empty else [],
        missing_cells=cells_df[cells_df["status"] != "done"].to_dict("records") if not cells_df.empty else [],
        missing_pairs=pairs_df[pairs_df["status"] != "done"].to_dict("records") if not pairs_df.empty else [],
        fig_first_div=first_divergence_figure(first_df, pairs_df),
        fig_margin=margin_figure(first_df),
        kv_rows=kv_rows,
        precision_rows=precision_rows,
        intervention_rows=interventions_df.to_dict("records") if not interventions_df.empty else [],
        fig_interventions=intervention_figure(interventions_df),
        fig_batch=batch_figure(interventions_df),
        cv_rows=cv_heuristic(cells_df, interventions_df),
        grafting_rows=grafting_table(grafting),
        lens_rows=lens_table(lens),
        fig_lens=lens_figure(lens),
        fig_precision_drift=precision_drift_figure(prec_layers),
        precision_probe_flips=int(prec_steps["flip"].sum()) if not prec_steps.empty else 0,
        traced_precision=traced_prompts(prec_steps),
        traced_kv=traced_prompts(kv_steps),
        precision_probe_steps=len(prec_steps),
        kv=kv_claims(kv_rows, probe_claims(kv_steps)),
        fig_kl=kl_figure(kv_steps),
        form_rows=form_claims(kv_forms),
        fig_form_kl=form_kl_figure(kv_forms),
        flip_rows=flip_table(kv_steps),
        probe_claim_rows=probe_claims(kv_steps),
        fig_flip_kl=flip_kl_figure(kv_steps),
        fig_drift=drift_figure(kv_layers),
        fig_patching=patching_figure(kv_patching),
        patching_rows=patching_table(kv_patching),
        patching_layer_rows=patching_layer_table(kv_patching),
        probe_flips=int(kv_steps["flip"].sum()) if not kv_steps.empty else 0,
        probe_steps=len(kv_steps),
        environment=environment,
        overview=overview_figures(pairs_df, interventions_df, {
            "kv_layers": kv_layers, "precision_layers": prec_layers, "precision_grafting": grafting,
            "precision_lens": lens}),
        drilldown_rows=drilldown_table(pairs_df, first_df),
        models=list(dict.fromkeys(cells_df["model"])) if not cells_df.empty else [],
        benchmarks=list(dict.fromkeys(cells_df["benchmark"])) if not cells_df.empty else [],
        config_yaml=json.dumps(config, indent=2, sort_keys=True, default=str),
    )
    html = _TEMPLATES.get_template("report.html.j2").render(**context)
    with storage.atomic_path(out_path) as tmp:
        tmp.write_text(html)
    write_tables(context, tables_dir or out_path.parent / "tables")
    return out_path


# Every table of the report, as the CSV file written beside it (tables/<name>.csv): the
# template variable that holds its rows -> file name. Any other `<name>_rows` variable is
# written as <name>.csv. Full-precision values, one row per HTML row, plus the columns the
# HTML leaves out (ids, statuses, errors).
TABLE_FILES = {
    "pairs": "pairs.csv",
    "cells": "cells.csv",
    "kv_rows": "kv_cache.csv",
    "precision_rows": "precision.csv",
    "intervention_rows": "interventions.csv",
    "cv_rows": "cv_heuristic.csv",
}


def _table_files(context: dict[str, Any]) -> dict[str, str]:
    files = dict(TABLE_FILES)
    for key in sorted(context):
        if key.endswith("_rows") and key not in files:
            files[key] = f"{key.removesuffix('_rows')}.csv"
    return files


def write_tables(context: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write each table the report shows as CSV into `out_dir`; a table the report does
    not show (no rows) has no file, and a stale CSV from an earlier render is removed."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for key, name in _table_files(context).items():
        path = out_dir / name
        rows = context.get(key)
        if not isinstance(rows, list) or not rows:
            path.unlink(missing_ok=True)
            continue
        with storage.atomic_path(path) as tmp:
            pd.DataFrame(rows).to_csv(tmp, index=False)
        written.append(path)
    for stale in out_dir.glob("*.csv"):
        if stale not in written:
            stale.unlink()
    return written


def _headline(pairs: pd.DataFrame) -> list[str]:
    """Plain sentences: which comparisons diverged, how often, and where the logits moved."""
    lines = []
    if pairs.empty:
        return ["No comparison finished."]
    for (axis, a, b), group in pairs.groupby(["axis", "a", "b"], sort=True):
        n = int(group["n_prompts"].sum())
        d = int(group["n_diverged"].sum())
        worst = group.sort_values("divergence_rate", ascending=False).iloc[0]
        nonequiv = int(group["n_logit_diff_before_div"].sum())
        lines.append(
            f"{axis} {a} vs {b}: {d} of {n} prompts ({_pct(d / n if n else float('nan'))}) produced a "
            f"different token sequence across {len(group)} pair(s); highest in [{worst['context']}] at "
            f"{_pct(worst['divergence_rate'])} (95% CI {_pct(worst['divergence_ci_low'])}–"
            f"{_pct(worst['divergence_ci_high'])}). Logits already differed before the first flip "
            f"(or anywhere, for identical sequences) on {nonequiv} of {n} prompts; "
            f"max |Δlogit| {_fmt(float(group['max_abs_dlogit'].max()))}.")
    return lines


def _device_label(environment: dict[str, Any]) -> str:
    device = environment.get("device", {})
    return f"{device.get('name', '?')} ({device.get('type', '?')})"


def _environment(rows: pd.DataFrame) -> dict[str, Any]:
    """Software, device and determinism of the run (the first machine's), and each model's
    and benchmark's provenance, from the summary's environment table."""
    env: dict[str, Any] = {"models": {}, "benchmarks": {}, "engines": {}}
    for row in rows.itertuples() if not rows.empty else ():
        value = json.loads(row.json)
        if row.kind in ("software", "device", "determinism"):
            env.setdefault(row.kind, value)
        else:
            env[f"{row.kind}s"].setdefault(row.name, value)
    return env


def render_partial(config: dict[str, Any], layout) -> Path:
    """After a failed run: summarise whatever results exist (missing and refused ones
    listed, nothing refused used) into a scratch folder and render them as the partial
    report, beside the complete one and never in its place: `reports/<run>/index.html` is
    only ever a complete report (or absent), and the next `snakemake` run reruns what its
    usual triggers say (failed jobs, a changed config), nothing more. The next complete
    report removes the partial one."""
    import shutil
    import tempfile

    from .summary import write_summaries

    Path(layout.results).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".summary-partial.", dir=layout.results))
    try:
        write_summaries(config, layout, scratch, strict=False)
        out = render(scratch, layout.partial_report, config, partial=True, tables_dir=layout.partial_report_tables)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out
