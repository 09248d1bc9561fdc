"""The page: reads the summaries, assembles the figures, tables and claims into the template,
writes the HTML and the tables as CSV (and, after a failed run, the partial report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from tokenflip.analysis.causes import CAUSE_WORDS
from tokenflip.analysis.texts import TEXT_CHARS
from tokenflip.core import storage
from tokenflip.report import paper
from tokenflip.report.common import (
    AXIS_WORDS,
    KV_DTYPE_WORDS,
    PHRASED_AXES,
    _fmt,
    _pct,
    _read_optional,
    first_runs,
    in_words,
    value_words,
)
from tokenflip.report.diverged import diverged_view, outcome, visible
from tokenflip.report.endpoints import endpoint_lines, endpoint_rows, engine_rows
from tokenflip.report.exports import printed, visible_controls, write_csv
from tokenflip.report.figures import (
    batch_figure,
    drift_figure,
    first_divergence_figure,
    flip_kl_figure,
    form_kl_figure,
    intervention_figure,
    kl_figure,
    lens_figure,
    margin_figure,
    patching_figure,
    precision_drift_figure,
)
from tokenflip.report.overview import overview_figures
from tokenflip.report.prompts import prompt_groups
from tokenflip.report.tables import (
    cv_heuristic,
    drilldown_table,
    flip_table,
    form_claims,
    grafting_table,
    kv_claims,
    kv_table,
    lens_table,
    measured_accuracy,
    patching_layer_table,
    patching_table,
    precision_table,
    probe_claims,
    traced_prompts,
)
from tokenflip.report.verdicts import (
    comparison_counts,
    noise_floor_rows,
    decided_lines,
    round_rows,
    still_identical_figure,
    verdict_counts,
    why_parted,
)

_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("tokenflip.report", "templates"),
    autoescape=jinja2.select_autoescape(["html", "j2"]),
    undefined=jinja2.StrictUndefined,
    finalize=lambda value: visible_controls(printed(value)),  # every value the page prints
)
_TEMPLATES.filters["fmt"] = _fmt
_TEMPLATES.filters["pct"] = _pct
_TEMPLATES.filters["visible"] = visible
_TEMPLATES.filters["shown"] = lambda v: "–" if v is None else ", ".join(map(str, v)) if isinstance(v, list) else v
_TEMPLATES.filters["cause_words"] = lambda cause: CAUSE_WORDS.get(cause, "")
_TEMPLATES.filters["answer_words"] = lambda correct, verdict: outcome(correct, verdict, None, 0)


def render(summary_dir: str | Path, out_path: str | Path, config: dict[str, Any],
           title: str | None = None, partial: bool = False, tables_dir: str | Path | None = None) -> Path:
    summary_dir, out_path = Path(summary_dir), Path(out_path)
    cells, _ = storage.read_table(summary_dir / "cells.parquet")
    pairs, _ = storage.read_table(summary_dir / "pairs.parquet")
    first_div, _ = storage.read_table(summary_dir / "first_divergence.parquet")
    cells_df, pairs_df, first_df = cells.to_pandas(), pairs.to_pandas(), first_div.to_pandas()
    unmeasured = _unmeasured(cells_df)
    pairs_df = measured_accuracy(pairs_df, unmeasured)
    done_pairs = pairs_df[pairs_df["status"] == "done"] if not pairs_df.empty else pairs_df
    environment = _environment(_read_optional(summary_dir / "environment.parquet"))
    kv_steps = _read_optional(summary_dir / "kv_steps.parquet")
    kv_layers = _read_optional(summary_dir / "kv_layers.parquet")
    kv_patching = _read_optional(summary_dir / "kv_patching.parquet")
    kv_forms = _read_optional(summary_dir / "kv_forms.parquet")
    kv_rows = kv_table(pairs_df)
    kv_probe_rows = probe_claims(kv_steps)
    interventions_df = _read_optional(summary_dir / "interventions.parquet")
    prec_steps = _read_optional(summary_dir / "precision_steps.parquet")
    precision_rows = precision_table(pairs_df, prec_steps)
    prec_layers = _read_optional(summary_dir / "precision_layers.parquet")
    grafting = _read_optional(summary_dir / "precision_grafting.parquet")
    lens = _read_optional(summary_dir / "precision_lens.parquet")
    prompt_texts = _read_optional(summary_dir / "texts.parquet")
    context = dict(
        title=(title or config.get("report", {}).get("title") or f"tokenflip — {config['run']}")
        + (" (partial: some jobs failed)" if partial else ""),
        run=config["run"],
        headline=(_truncation_lines(cells_df, unmeasured) + _prefix_cache_lines(cells_df) + endpoint_lines(cells_df)
                  + _headline(first_runs(done_pairs), config.get("interventions"))),
        unmeasured=unmeasured,
        **diverged_view(_read_optional(summary_dir / "diverged.parquet"), pairs_df),
        prompt_groups=prompt_groups(prompt_texts),
        prompt_text_rows=prompt_texts,
        prompt_text_chars=f"{TEXT_CHARS:,}",
        **paper_placement(paper.comparison_rows(
            paper.Tables(pairs=pairs_df, interventions=interventions_df, first_divergence=first_df, cells=cells_df,
                         kv_steps=kv_steps, kv_layers=kv_layers, kv_patching=kv_patching,
                         precision_steps=prec_steps, grafting=grafting, lens=lens),
            paper.Study.of(config), _device_label(environment))),
        pairs=[{**p, "why_parted": why_parted(p)} for p in pairs_df.sort_values(
            ["model", "benchmark", "axis", "a", "b", "context"]).to_dict("records")] if not pairs_df.empty else [],
        comparisons=comparison_counts(pairs_df),
        verdict_counts=verdict_counts(done_pairs),
        noise_floor_rows=noise_floor_rows(_read_optional(summary_dir / "repeats.parquet"), pairs_df),
        round_rows=round_rows(pairs_df) if config.get("rounds") is not None else [], rounds=config.get("rounds"),
        decided=decided_lines(pairs_df),
        guarantee=next((g for g in pairs_df.get("guarantee", []) if isinstance(g, str) and g), None),
        fig_still_identical=still_identical_figure(_read_optional(summary_dir / "still_identical.parquet")),
        cells=cells_df.sort_values("cell_id").to_dict("records") if not cells_df.empty else [],
        endpoint_rows=endpoint_rows(cells_df),
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
        kv=kv_claims(kv_rows, kv_probe_rows),
        fig_kl=kl_figure(kv_steps),
        form_rows=form_claims(kv_forms),
        fig_form_kl=form_kl_figure(kv_forms),
        flip_rows=flip_table(kv_steps),
        probe_claim_rows=kv_probe_rows,
        fig_flip_kl=flip_kl_figure(kv_steps),
        fig_drift=drift_figure(kv_layers),
        fig_patching=patching_figure(kv_patching),
        patching_rows=patching_table(kv_patching),
        patching_layer_rows=patching_layer_table(kv_patching),
        probe_flips=int(kv_steps["flip"].sum()) if not kv_steps.empty else 0,
        probe_steps=len(kv_steps),
        environment=environment,
        engine_rows=engine_rows(environment),
        cpu_features=cpu_features(environment.get("device", {})),
        axis_words=AXIS_WORDS,
        kv_dtype_words=KV_DTYPE_WORDS,
        overview=overview_figures(first_runs(pairs_df), interventions_df, {
            "kv_layers": kv_layers, "precision_layers": prec_layers, "precision_grafting": grafting,
            "precision_lens": lens}),
        drilldown_rows=drilldown_table(first_runs(pairs_df), first_df),
        models=list(dict.fromkeys(cells_df["model"])) if not cells_df.empty else [],
        benchmarks=list(dict.fromkeys(cells_df["benchmark"])) if not cells_df.empty else [],
        config_yaml=json.dumps(config, indent=2, sort_keys=True, default=str),
        verdict_margin=config.get("verdict", {}).get("margin", 0.05),
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
    "prompt_text_rows": "prompts.csv",
}


# Rows of the provenance (metadata about the run, not its data): no CSV of their own.
METADATA_ROWS = ("engine_rows",)


def _table_files(context: dict[str, Any]) -> dict[str, str]:
    files = dict(TABLE_FILES)
    for key in sorted(context):
        if key.endswith("_rows") and key not in files and key not in METADATA_ROWS:
            files[key] = f"{key.removesuffix('_rows')}.csv"
    return files


def write_tables(context: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write each table the report shows as CSV into `out_dir` (`exports.write_csv`: text
    that a spreadsheet would run as a formula is neutralised); a table the report does not
    show (no rows) has no file, and a stale CSV from an earlier render is removed."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for key, name in _table_files(context).items():
        path = out_dir / name
        rows = context.get(key)
        if isinstance(rows, pd.DataFrame):
            rows = rows if not rows.empty else []
        if not isinstance(rows, (list, pd.DataFrame)) or not len(rows):
            path.unlink(missing_ok=True)
            continue
        written.append(write_csv(rows, path))
    for stale in out_dir.glob("*.csv"):
        if stale not in written:
            stale.unlink()
    return written


# A paper whose rows this run reproduces (data from the paper's own models, not stand-ins)
# for at least this share is reproduced: the paper configs. Its rows come first, in full.
PAPER_REPRODUCED = 0.5


def paper_placement(rows: list[dict[str, str]]) -> dict[str, Any]:
    """The papers rows to show and where. A run that reproduces a paper (a paper config) shows
    that paper's rows in full right after the findings (`paper_first`), and the other
    paper's rows where it has data. Any other study (a user's own, the default with its
    stand-in model) shows only the rows it has data for, folded, after its own sections."""
    def has_data(r):
        return r["ours"] != "–"

    reproduced = set()
    for name in dict.fromkeys(r["paper"] for r in rows):
        own = [r for r in rows if r["paper"] == name]
        if sum(has_data(r) and "in place of" not in r["our_conditions"] for r in own) >= PAPER_REPRODUCED * len(own):
            reproduced.add(name)
    shown = [r for r in rows if r["paper"] in reproduced or has_data(r)]
    return {"paper_rows": shown, "paper_first": bool(reproduced), "paper_total": len(rows)}


def pair_words(axis: str, a: Any, b: Any, interventions: dict[str, Any] | None = None) -> str:
    """What a comparison changes, in words ("KV cache stored in FP8 E5M2 vs KV cache kept in
    the compute precision (kv_dtype)", "batch size 1 vs 4")."""
    if axis in PHRASED_AXES:
        words = f"{value_words(axis, a, interventions)} vs {value_words(axis, b, interventions)}"
        # a value that names its axis ("repeat 2 (the same cell run again)") needs no "(axis)"
        return words if value_words(axis, b, interventions).startswith(f"{axis} ") else f"{words} ({axis})"
    return f"{AXIS_WORDS.get(axis, axis)} {a} vs {b}"


def _headline(pairs: pd.DataFrame, interventions: dict[str, Any] | None = None) -> list[str]:
    """One line per comparison and engine (never pooled over engines), the most diverging
    first: how many prompts parted (with the interval), under which model, benchmark and
    settings (in words), and how far the logits had moved before (or, where no token
    changed, at all)."""
    if pairs.empty:
        return ["No comparison finished."]
    lines = []
    keys = ["axis", "a", "b", *(["engine"] if "engine" in pairs else [])]
    for key, group in pairs.groupby(keys, sort=True, dropna=False):
        axis, a, b = key[:3]
        n, d = int(group["n_prompts"].sum()), int(group["n_diverged"].sum())
        worst = group.sort_values("divergence_rate", ascending=False).iloc[0]
        where = ", ".join(filter(None, (f"{worst['model']} on {worst['benchmark']}",
                                        in_words(worst.to_dict(), plain=False))))
        ci = f"95% CI {_pct(worst['divergence_ci_low'])}–{_pct(worst['divergence_ci_high'])}"
        models = group["model"].nunique()
        if len(group) == 1:
            spread = f"({where}; {ci})"
        elif d:
            spread = (f"over {len(group)} pairs ({models} model{'s' if models > 1 else ''}), most at {where}: "
                      f"{_pct(worst['divergence_rate'])} ({ci})")
        else:
            spread = f"over {len(group)} pairs ({models} model{'s' if models > 1 else ''})"
        moved, dlogit = int(group["n_logit_diff_before_div"].sum()), _fmt(float(group["max_abs_dlogit"].max()))
        logits = (f"logits had moved before the first differing token on {moved} of {n}, max |Δlogit| {dlogit}"
                  if d else f"no token changed; logits differed on {moved} of {n}, max |Δlogit| {dlogit}")
        lines.append((d / n if n else 0.0, f"{pair_words(axis, a, b, interventions)}: {d} of {n} prompts diverged "
                      f"({_pct(d / n if n else float('nan'))}) {spread}; {logits}."))
    return [line for _, line in sorted(lines, key=lambda x: -x[0])]


# A cell whose completions were cut at the token limit before any answer this often has no
# measured accuracy: its "wrong" answers were never given.
UNMEASURED_SHARE = 0.5
# Up to this many such cells the findings name each; above it, one line gives their count.
TRUNCATION_LINES = 2


def _unmeasured(cells: pd.DataFrame) -> dict[str, str]:
    """Cells whose accuracy is not measured (most completions cut before any answer):
    cell id -> "24 of 24 cut at 48 tokens"."""
    if cells.empty or "n_cut_no_answer" not in cells:
        return {}
    done = cells[(cells["status"] == "done") & (cells["n_cut_no_answer"] > UNMEASURED_SHARE * cells["n_prompts"])]
    return {r.cell_id: f"{int(r.n_cut_no_answer)} of {int(r.n_prompts)} cut at {int(r.max_new_tokens)} tokens"
            for r in done.itertuples()}


def _truncation_lines(cells: pd.DataFrame, unmeasured: dict[str, str]) -> list[str]:
    if not unmeasured:
        return []
    if len(unmeasured) > TRUNCATION_LINES:
        limits = sorted({note.split(" cut at ", 1)[1] for note in unmeasured.values()})
        return [f"In {len(unmeasured)} of {len(cells)} cells most completions were cut at the token limit "
                f"({', '.join(limits)}) before any answer: their accuracy is not measured (the Cells table's "
                "\"cut\" column; raise max_new_tokens)."]
    return [f"{cell}: {note} before any answer: accuracy is not measured (raise max_new_tokens)."
            for cell, note in unmeasured.items()]


def _prefix_cache_lines(cells: pd.DataFrame) -> list[str]:
    """Cells that asked a serving engine for a prefix cache that served nothing: their pairs
    say nothing about the cache (a cold cache whose requests shared no whole block)."""
    if cells.empty or "prefix_cached_tokens" not in cells or "prefix_cache" not in cells:
        return []
    unhit = cells[(cells["status"] == "done") & (cells["prefix_cache"].astype(str) != "off")
                  & (cells["prefix_cached_tokens"].fillna(-1) == 0)]
    return [f"{r.cell_id}: the prefix cache was on but served no prompt token (no request shared a whole KV "
            f"block with an earlier one): its pairs measure nothing of the cache." for r in unhit.itertuples()]


# The CPU extensions that decide which 16-bit kernels run (cpu_flags.KERNEL_FLAGS holds
# more), named in the header: the same run gives other numbers on a CPU with other ones.
HEADER_FLAGS = {"avx2": ("avx2",), "avx512_bf16": ("avx512_bf16",), "avx512_fp16": ("avx512_fp16",),
                "amx": ("amx_tile", "amx_bf16", "amx_int8", "amx_fp16")}


def cpu_features(device: dict[str, Any]) -> list[tuple[str, bool]]:
    """[(extension, present)] of the run's CPU, from its recorded cpu_flags (empty on a
    device that recorded none, such as a GPU)."""
    flags = device.get("cpu_flags")
    if device.get("type") != "cpu" or not isinstance(flags, list):
        return []
    return [(name, any(f in flags for f in members)) for name, members in HEADER_FLAGS.items()]


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

    from tokenflip.analysis.summary import write_summaries

    Path(layout.results).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".summary-partial.", dir=layout.results))
    try:
        write_summaries(config, layout, scratch, strict=False)
        out = render(scratch, layout.partial_report, config, partial=True, tables_dir=layout.partial_report_tables)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out
