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

from . import storage  # noqa: E402

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
    head, rest = svg.split(">", 1)
    head = re.sub(r'\b(width|height)="([0-9.]+)pt"',
                  lambda m: f'{m.group(1)}="{float(m.group(2)) * FIGURE_SCALE:.1f}pt"', head)
    return f"{head}>{rest}"


def first_divergence_figure(first_div: pd.DataFrame, pairs: pd.DataFrame) -> str | None:
    """Where sequences part: first divergence step of every diverged prompt, per pair."""
    if first_div.empty:
        return None
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


def kv_claims(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The paper's headline claims next to what this run measured."""
    if not rows:
        return {}
    df = pd.DataFrame(rows)
    out: dict[str, Any] = {"conditions": len(df),
                           "on_better": int((df["accuracy_diff"] > 0).sum()),
                           "off_better": int((df["accuracy_diff"] < 0).sum())}
    for precision in ("fp16", "bf16", "fp32"):
        sub = df[df["precision"] == precision]
        if not sub.empty:
            out[precision] = {"diverged": int(sub["n_diverged"].sum()), "n": int(sub["n_prompts"].sum()),
                              "nonequiv": int(sub["n_logit_diff_before_div"].sum()),
                              "max_dlogit": float(sub["max_abs_dlogit"].max())}
    if "fp16" in out and "fp32" in out and out["fp32"]["max_dlogit"] > 0:
        out["fp32_reduction"] = out["fp16"]["max_dlogit"] / out["fp32"]["max_dlogit"]
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
    by = {(r["model"], r["precision"]): r for r in rows}
    for r in rows:
        fp32 = by.get((r["model"], "fp32"))
        r["vs_fp32"] = (r["max_abs_dlogit"] / fp32["max_abs_dlogit"]
                        if fp32 and fp32["max_abs_dlogit"] > 0 and r["precision"] != "fp32" else None)
    return rows


def kl_figure(steps: pd.DataFrame) -> str | None:
    """Per-step KL(ON‖OFF) along a shared trajectory, per precision, log scale (paper Fig. 3)."""
    if steps.empty:
        return None
    data = steps.assign(kl_plot=steps["kl"].clip(lower=1e-20))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    sns.lineplot(data=data, x="step", y="kl_plot", hue="precision", style="model", errorbar=("pi", 100),
                 estimator="median", ax=ax)
    ax.set_yscale("log")
    ax.set_ylabel("KL(ON‖OFF) per step (median, range)")
    ax.set_xlabel("generated token")
    return _svg(fig)


def flip_kl_figure(steps: pd.DataFrame) -> str | None:
    """Each step's top-2 margin against its KL, flips marked (paper Fig. 4's decision boundary)."""
    if steps.empty:
        return None
    data = steps.assign(kl_plot=steps["kl"].clip(lower=1e-20),
                        margin_plot=steps["margin_on"].clip(lower=1e-6),
                        outcome=steps["flip"].map({True: "argmax flips", False: "same argmax"}))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    sns.scatterplot(data=data, x="kl_plot", y="margin_plot", hue="outcome", style="precision",
                    hue_order=["same argmax", "argmax flips"], s=18, alpha=0.7, ax=ax)
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
    sns.lineplot(data=data, x="layer", y="l2_plot", hue="precision", style="model", marker="o", ax=ax)
    ax.set_yscale("log")
    ax.set_ylabel("mean ‖h_ON − h_OFF‖₂ over steps and prompts")
    return _svg(fig)


def patching_figure(patching: pd.DataFrame) -> str | None:
    """KL remaining after patching cache-OFF state into the cache-ON run (paper Fig. 5)."""
    if patching.empty:
        return None
    data = patching.assign(kl_plot=patching["kl"].clip(lower=1e-20))
    fig, ax = plt.subplots(figsize=(6, 3.2))
    # Log scale set after drawing: seaborn's log_scale=(False, True) drops bars that start at 0.
    sns.barplot(data=data, x="precision", y="kl_plot", hue="patch", hue_order=["none", "residual", "kv_cache"],
                estimator="median", errorbar=None, ax=ax)
    ax.set_yscale("log")
    ax.set_ylabel("KL to cache-OFF at the patched step (median)")
    return _svg(fig)


def patching_table(patching: pd.DataFrame) -> list[dict[str, Any]]:
    if patching.empty:
        return []
    agg = patching.groupby(["model", "precision", "patch"], as_index=False).agg(
        experiments=("kl", "size"), median_kl=("kl", "median"), flips=("flip", "sum"),
        max_abs_dlogit=("max_abs_dlogit", "max"))
    order = {"none": 0, "residual": 1, "kv_cache": 2}
    return agg.sort_values(["model", "precision", "patch"], key=lambda c: c.map(order) if c.name == "patch" else c
                           ).to_dict("records")


def precision_table(pairs: pd.DataFrame) -> list[dict[str, Any]]:
    """Cross-precision divergence spectrum (paper Table 2): precision pairs, no intervention."""
    if pairs.empty:
        return []
    prec = pairs[(pairs["axis"] == "precision") & (pairs["status"] == "done")].copy()
    if prec.empty:
        return []
    prec = prec.assign(ear_low=1 - prec["divergence_ci_high"], ear_high=1 - prec["divergence_ci_low"])
    prec = prec[prec["intervention"] == "none"]
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
    sns.lineplot(data=data, x="batch_size", y="ear", hue="intervention", style="model", marker="o", ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_ylabel("EAR")
    return _svg(fig)


def grafting_table(grafting: pd.DataFrame) -> list[dict[str, Any]]:
    """Flips fixed by grafting one layer (or the KV cache) of precision b into a (paper Table 8)."""
    if grafting.empty:
        return []
    agg = grafting.groupby(["model", "a", "b", "graft", "layer"], as_index=False).agg(
        flips=("fixed", "size"), fixed=("fixed", "sum"))
    return agg.assign(rate=agg["fixed"] / agg["flips"]).sort_values(["model", "a", "b", "layer"]).to_dict("records")


def lens_table(lens: pd.DataFrame) -> list[dict[str, Any]]:
    """Logit-lens agreement between precisions per layer at flip steps (paper Table 10)."""
    if lens.empty:
        return []
    agg = lens.groupby(["model", "a", "b", "layer"], as_index=False).agg(
        steps=("top1_agree", "size"), top1=("top1_agree", "mean"), top2=("top2_agree", "mean"))
    return agg.sort_values(["model", "a", "b", "layer"]).to_dict("records")


def precision_drift_figure(layers: pd.DataFrame) -> str | None:
    """Per-layer L2 distance between the two precisions' layer outputs."""
    if layers.empty:
        return None
    data = layers.groupby(["model", "a", "b", "layer"], as_index=False)["l2"].mean()
    data = data.assign(pair=data["a"] + " vs " + data["b"], l2_plot=data["l2"].clip(lower=1e-12))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    sns.lineplot(data=data, x="layer", y="l2_plot", hue="pair", style="model", marker="o", ax=ax)
    ax.set_yscale("log")
    ax.set_ylabel("mean ‖h_a − h_b‖₂")
    return _svg(fig)


def cv_heuristic(cells: pd.DataFrame, interventions: pd.DataFrame) -> list[dict[str, Any]]:
    """CV of the top-2 margin in one 16-bit run (no intervention, batch size 1) against the
    lift each intervention measured, per model × benchmark; Spearman across those points.
    In-sample: the same prompts give both numbers."""
    from scipy.stats import spearmanr

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
        rho = p = float("nan")
        if len(points) >= 3:
            res = spearmanr([x for x, _ in points], [y for _, y in points])
            rho, p = float(res.statistic), float(res.pvalue)
        out.append({"intervention": name, "points": len(points), "rho": rho, "p": p})
    return out


def render(summary_dir: str | Path, out_path: str | Path, config: dict[str, Any],
           title: str | None = None, partial: bool = False) -> Path:
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
    kv_rows = kv_table(pairs_df)
    interventions_df = _read_optional(summary_dir / "interventions.parquet")
    precision_rows = precision_table(pairs_df)
    prec_steps = _read_optional(summary_dir / "precision_steps.parquet")
    context = dict(
        title=(title or config.get("report", {}).get("title") or f"tokenflip — {config['run']}")
        + (" (partial: some jobs failed)" if partial else ""),
        run=config["run"],
        headline=_headline(done_pairs),
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
        grafting_rows=grafting_table(_read_optional(summary_dir / "precision_grafting.parquet")),
        lens_rows=lens_table(_read_optional(summary_dir / "precision_lens.parquet")),
        fig_precision_drift=precision_drift_figure(_read_optional(summary_dir / "precision_layers.parquet")),
        precision_probe_flips=int(prec_steps["flip"].sum()) if not prec_steps.empty else 0,
        precision_probe_steps=len(prec_steps),
        kv=kv_claims(kv_rows),
        fig_kl=kl_figure(kv_steps),
        flip_rows=flip_table(kv_steps),
        probe_claim_rows=probe_claims(kv_steps),
        fig_flip_kl=flip_kl_figure(kv_steps),
        fig_drift=drift_figure(kv_layers),
        fig_patching=patching_figure(kv_patching),
        patching_rows=patching_table(kv_patching),
        probe_flips=int(kv_steps["flip"].sum()) if not kv_steps.empty else 0,
        probe_steps=len(kv_steps),
        environment=environment,
        config_yaml=json.dumps(config, indent=2, sort_keys=True, default=str),
    )
    html = _TEMPLATES.get_template("report.html.j2").render(**context)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    tmp.write_text(html)
    tmp.replace(out_path)
    write_tables(context, out_path.parent / "tables")
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
        tmp = path.with_name(f".{name}.tmp")
        pd.DataFrame(rows).to_csv(tmp, index=False)
        tmp.replace(path)
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


def _environment(rows: pd.DataFrame) -> dict[str, Any]:
    """Software, device and determinism of the run (the first machine's), and each model's
    and benchmark's provenance, from the summary's environment table."""
    env: dict[str, Any] = {"models": {}, "benchmarks": {}}
    for row in rows.itertuples() if not rows.empty else ():
        value = json.loads(row.json)
        if row.kind in ("software", "device", "determinism"):
            env.setdefault(row.kind, value)
        else:
            env[f"{row.kind}s"].setdefault(row.name, value)
    return env


def render_partial(config: dict[str, Any], layout) -> Path:
    """After a failed run: summarise whatever results exist (missing and refused ones
    listed, nothing refused used) into a scratch folder, render the report from it, and
    remove the run's summary tables, which no longer match the report. With the
    summaries gone, the next `snakemake` run redoes them, the report, and every job whose
    output is still missing."""
    import shutil
    import tempfile

    from .summary import summary_tables, write_summaries

    Path(layout.results).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".summary-partial.", dir=layout.results))
    try:
        write_summaries(config, layout, scratch, strict=False)
        out = render(scratch, layout.report, config, partial=True)
        for name in summary_tables():
            Path(layout.summary(name)).unlink(missing_ok=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out
