"""Render a run's summaries into one self-contained HTML file (figures inline as SVG)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import jinja2
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from . import storage  # noqa: E402

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


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def first_divergence_figure(first_div: pd.DataFrame, pairs: pd.DataFrame) -> str | None:
    """Where sequences part: first divergence step of every diverged prompt, per pair."""
    if first_div.empty:
        return None
    order = [p for p in pairs.sort_values(["axis", "label", "context"])["pair_id"]
             if p in set(first_div["pair_id"])]
    labels = {r.pair_id: f"{r.label} [{r.context}]" for r in pairs.itertuples()}
    data = first_div.assign(pair=first_div["pair_id"].map(labels))
    sns.set_theme(style="whitegrid", context="paper")
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(order) + 1.2))
    sns.stripplot(data=data, x="first_div_step", y="pair", order=[labels[p] for p in order],
                  hue="axis", jitter=0.15, size=5, ax=ax, legend=True)
    ax.set_xlabel("first divergence step (generated tokens)")
    ax.set_ylabel("")
    return _svg(fig)


def margin_figure(first_div: pd.DataFrame) -> str | None:
    """Top-1 minus top-2 logit margin at the flip step: flips happen at near-ties."""
    data = first_div.dropna(subset=["margin_a_at_div"])
    if data.empty:
        return None
    sns.set_theme(style="whitegrid", context="paper")
    fig, ax = plt.subplots(figsize=(6, 3))
    sns.histplot(data=data, x="margin_a_at_div", hue="axis", bins=30, log_scale=(False, False), ax=ax)
    ax.set_xlabel("top-2 margin at the divergence step (side a, logits)")
    return _svg(fig)


def render(summary_dir: str | Path, out_path: str | Path, config: dict[str, Any],
           title: str | None = None) -> Path:
    summary_dir, out_path = Path(summary_dir), Path(out_path)
    cells, _ = storage.read_table(summary_dir / "cells.parquet")
    pairs, _ = storage.read_table(summary_dir / "pairs.parquet")
    first_div, _ = storage.read_table(summary_dir / "first_divergence.parquet")
    cells_df, pairs_df, first_df = cells.to_pandas(), pairs.to_pandas(), first_div.to_pandas()
    done_pairs = pairs_df[pairs_df["status"] == "done"] if not pairs_df.empty else pairs_df
    environment = _first_environment(summary_dir.parent / "cells", cells_df)
    html = _TEMPLATES.get_template("report.html.j2").render(
        title=title or config.get("report", {}).get("title") or f"tokenflip — {config['run']}",
        run=config["run"],
        headline=_headline(done_pairs),
        pairs=pairs_df.sort_values(["model", "benchmark", "axis", "a", "b", "context"]).to_dict("records")
        if not pairs_df.empty else [],
        cells=cells_df.sort_values("cell_id").to_dict("records") if not cells_df.empty else [],
        missing_cells=cells_df[cells_df["status"] != "done"].to_dict("records") if not cells_df.empty else [],
        missing_pairs=pairs_df[pairs_df["status"] != "done"].to_dict("records") if not pairs_df.empty else [],
        fig_first_div=first_divergence_figure(first_df, pairs_df),
        fig_margin=margin_figure(first_df),
        environment=environment,
        config_yaml=json.dumps(config, indent=2, sort_keys=True, default=str),
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    tmp.write_text(html)
    tmp.replace(out_path)
    return out_path


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


def _first_environment(cells_dir: Path, cells_df: pd.DataFrame) -> dict[str, Any]:
    """Software and device of the run, and each model's and benchmark's provenance once."""
    env: dict[str, Any] = {"models": {}, "benchmarks": {}}
    if cells_df.empty:
        return env
    for row in cells_df[cells_df["status"] == "done"].itertuples():
        if row.model in env["models"] and row.benchmark in env["benchmarks"]:
            continue
        meta = storage.read_metadata(cells_dir / f"{row.cell_id}.parquet")
        for key in ("software", "device", "determinism"):
            env.setdefault(key, meta["environment"][key])
        env["models"].setdefault(row.model, meta["model"])
        env["benchmarks"].setdefault(row.benchmark, meta["benchmark"])
    return env
