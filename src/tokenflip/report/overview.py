"""The overview heatmaps: every pair of the run at a glance (divergence, EAR, the
intervention's lift, per-layer drift), sized to stay within a screen or two."""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from tokenflip.report.common import GRAFT_COLUMNS, _batch, _pooled, _svg, condition_labels, graft_frame

# Heatmap geometry (inches before FIGURE_SCALE): a cell with a two-line annotation, a
# cell without one, and the height of a row; rows shrink down to MIN_ROW for tall maps
# so that no figure grows past about one screen.
ANNOTATED_CELL = (0.86, 0.46)
# Annotated cells widen until the widest column label fits with this much room to spare.
LABEL_ROOM = 1.12


PLAIN_CELL_WIDTH = 0.16


MIN_ROW = 0.2


MAX_HEATMAP_HEIGHT = 7.5


MAX_ANNOTATED_CELLS = 400


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
        _fit_column_labels(fig, ax, n_cols)
    elif n_cols > 12:
        ax.tick_params(axis="x", labelsize=7)
    for text, link in zip(ax.get_yticklabels(), row_links or [], strict=False):
        if link:
            text.set_url(link)
    return _svg(fig)


def _fit_column_labels(fig, ax, n_cols: int) -> None:
    """Widen the figure until its widest column label fits its cell (measured as drawn:
    the colour bar takes its share of the width, and label widths depend on the font)."""
    renderer = fig.canvas.get_renderer()
    widest = max((t.get_window_extent(renderer).width for t in ax.get_xticklabels()), default=0.0)
    cell = ax.get_window_extent(renderer).width / max(n_cols, 1)
    if widest * LABEL_ROOM > cell > 0:
        w, h = fig.get_size_inches()
        fig.set_size_inches(w * widest * LABEL_ROOM / cell, h)


def _column_label(label: str, width: int = 11) -> str:
    """A heatmap column label one part per line ("axis: a vs b · precision"), long parts
    broken before "vs" (and after it where "vs b" is long too), so that no line is much
    wider than its cell ("transformers vs" beside "llama.cpp vs" ran together)."""
    lines = []
    for part in label.replace(": ", " · ").split(" · "):
        if len(part) <= width or " vs " not in part:
            lines.append(part)
            continue
        a, b = part.split(" vs ", 1)
        lines.extend([a, f"vs {b}"] if len(b) + 3 <= width else [a, "vs", b])
    return "\n".join(lines)


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
    prec = prec[prec["no_intervention"].astype(bool)]
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
    data = interventions[(interventions["status"] == "done") & ~interventions["baseline"].astype(bool)]
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
