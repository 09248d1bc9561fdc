"""The report's figures, one function per figure (an inline SVG, or None without data)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.ticker import MaxNLocator

from tokenflip.report.common import (
    MAX_PAIR_ROWS,
    MAX_VECTOR_POINTS,
    WHOLE_PATCHES,
    _batch,
    _model_style,
    _svg,
    condition_labels,
    in_words,
    legend_outside,
    palette,
)


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
                    ax=ax, dodge=False, palette=palette(data["axis"]))
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), frameon=False)
        ax.set_xlabel("first divergence step (generated tokens), all pairs of each condition")
        ax.set_ylabel("")
        return _svg(fig)
    order = [p for p in pairs.sort_values(["axis", "label", "context"])["pair_id"]
             if p in set(first_div["pair_id"])]
    labels = {r["pair_id"]: f"{r['label']}\n{in_words(r)}" for r in pairs.to_dict("records")}
    data = first_div.assign(pair=first_div["pair_id"].map(labels))
    fig, ax = plt.subplots(figsize=(6, 0.5 * len(order) + 1.0))
    sns.stripplot(data=data, x="first_div_step", y="pair", order=[labels[p] for p in order],
                  hue="axis", jitter=0.15, size=5, ax=ax, legend=True, palette=palette(first_div["axis"]))
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.set_xlabel("first divergence step (generated tokens)")
    ax.set_ylabel("")
    return _svg(fig)


def margin_figure(first_div: pd.DataFrame) -> str | None:
    """Top-1 minus top-2 logit margin at the flip step: flips happen at near-ties."""
    data = first_div.dropna(subset=["margin_a_at_div"])
    if data.empty:
        return None
    fig, ax = plt.subplots(figsize=(6, 3))
    sns.histplot(data=data, x="margin_a_at_div", hue="axis", bins=30, log_scale=(False, False), ax=ax,
                 palette=palette(first_div["axis"]))
    legend_outside(ax)
    ax.set_xlabel("top-1 minus top-2 logit at the divergence step (side a; 0: a tie)")
    ax.set_ylabel("diverged prompts")
    return _svg(fig)


def _kl_lines(data: pd.DataFrame, hue: str, label: str) -> str:
    """Per-step KL along a shared trajectory, one line per `hue` (median and range over
    prompts), log scale; zeros drawn at 1e-20."""
    data = data.assign(kl_plot=data["kl"].clip(lower=1e-20))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    sns.lineplot(data=data, x="step", y="kl_plot", hue=hue, style=_model_style(data),
                 errorbar=("pi", 100), estimator="median", ax=ax, palette=palette(data[hue]))
    ax.set_yscale("log")
    legend_outside(ax)
    ax.set_ylabel(f"{label} per step (median, range;\nKL = 0 drawn at 10⁻²⁰)")
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
    legend_outside(ax)
    ax.set_xlabel("KL(ON‖OFF) at the step (KL = 0 drawn at 10⁻²⁰)")
    ax.set_ylabel("top-2 margin (cache ON)")
    return _svg(fig)


def drift_figure(layers: pd.DataFrame) -> str | None:
    """Per-layer L2 of the ON−OFF difference of each layer's output (paper Fig. 2)."""
    if layers.empty:
        return None
    data = layers.groupby(["model", "precision", "layer"], as_index=False)["l2"].mean()
    data = data.assign(l2_plot=data["l2"].clip(lower=1e-12))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    sns.lineplot(data=data, x="layer", y="l2_plot", hue="precision", style=_model_style(data), marker="o", ax=ax,
                 palette=palette(data["precision"]))
    ax.set_yscale("log")
    legend_outside(ax)
    ax.set_ylabel("mean ‖h_ON − h_OFF‖₂\n(0 drawn at 10⁻¹²)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _svg(fig)


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
    colours = palette(data["precision"])
    sns.barplot(data=whole, x="kind", y="recovered", hue="precision", order=list(WHOLE_PATCHES),
                estimator="median", errorbar=None, ax=whole_ax, palette=colours, saturation=1)
    whole_ax.set_xlabel("")
    whole_ax.set_ylabel("KL recovered (%, median)")
    per_layer = data[data["kind"].isin(["residual layer", "kv layer"])]
    sns.lineplot(data=per_layer, x="layer", y="recovered", hue="precision", style="kind", estimator="median",
                 errorbar=None, marker="o", ax=layer_ax, palette=colours)
    legend_outside(layer_ax)
    if whole_ax.get_legend() is not None and layer_ax.get_legend() is not None:
        whole_ax.get_legend().remove()   # the precisions' colours are in the right-hand legend
    layer_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    layer_ax.set_ylabel("KL recovered (%, median)")
    for ax in (whole_ax, layer_ax):
        ax.axhline(100, color="grey", linewidth=0.6)
    return _svg(fig)


def intervention_figure(interventions: pd.DataFrame) -> str | None:
    """Exact agreement per intervention, with the lift's paired-bootstrap 90% interval."""
    data = interventions[interventions["status"] == "done"] if not interventions.empty else interventions
    if data.empty or data["intervention"].nunique() < 2:
        return None
    data = data.assign(condition=data["a"] + " vs " + data["b"] + ", batch size " + data["batch_size"].map(_batch))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    sns.barplot(data=data, x="intervention", y="ear", hue="condition", errorbar=None, ax=ax)
    ax.set_ylim(0, 1.05)
    legend_outside(ax)
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
