"""Aggregate a run into the summary tables the report reads: file metadata and small
per-prompt pair tables, one file at a time; per-step columns only through Arrow compute
(never materialised as Python objects)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import storage
from .plan import PROBE_TABLES, Cell, Pair

SUMMARY_FILES = ("cells.parquet", "pairs.parquet", "first_divergence.parquet", "interventions.parquet",
                 "kv_steps.parquet", "kv_layers.parquet", "kv_patching.parquet",
                 "precision_steps.parquet", "precision_layers.parquet", "precision_grafting.parquet",
                 "precision_lens.parquet")
_PROBE_PREFIX = {"kv_cache": "kv", "precision": "precision"}


def cell_rows(cells: list[Cell], run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for cell in cells:
        path = run_dir / "cells" / f"{cell.id}.parquet"
        row: dict[str, Any] = {"cell_id": cell.id, **cell.as_dict(), "status": "missing"}
        if path.exists():
            try:
                meta = storage.read_metadata(path)
                correct = pq.read_table(path, columns=["correct", "n_tokens", "intervened", "margin"])
                steps = pc.sum(correct.column("n_tokens")).as_py() or 0
                fired = pc.sum(pc.list_flatten(correct.column("intervened")).cast(pa.int64())).as_py() or 0
                flat_margin = pc.list_flatten(correct.column("margin"))
                mean_margin = pc.mean(flat_margin).as_py()
                std_margin = pc.stddev(flat_margin).as_py()
                acc = pd.Series(correct.column("correct").to_pylist(), dtype="boolean").fillna(False)
                row.update(status="done", n_prompts=correct.num_rows, accuracy=float(acc.mean()),
                           generated_tokens=int(steps),
                           wall_seconds=meta["wall_seconds"], token_stream_sha256=meta["token_stream_sha256"],
                           logits_sha256=meta["logits_sha256"], device=meta["environment"]["device"]["name"],
                           trigger_rate=fired / steps if steps else float("nan"),
                           mean_margin=float("nan") if mean_margin is None else float(mean_margin),
                           cv_margin=float(std_margin / mean_margin) if mean_margin and std_margin is not None
                           else float("nan"))
            except storage.StorageError as exc:
                row.update(status="unreadable", error=str(exc))
        rows.append(row)
    return rows


def pair_rows(pairs: list[Pair], run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows, first_div = [], []
    for pair in pairs:
        path = run_dir / "pairs" / f"{pair.id}.parquet"
        row: dict[str, Any] = {"pair_id": pair.id, "label": pair.label, "axis": pair.axis,
                               "model": pair.a.model, "benchmark": pair.a.benchmark,
                               "a": str(pair.a.value(pair.axis)), "b": str(pair.b.value(pair.axis)),
                               "context": pair.context, "cell_a": pair.a.id, "cell_b": pair.b.id,
                               "status": "missing"}
        if path.exists():
            try:
                table, meta = storage.read_table(path, columns=["prompt_id", "first_div_step",
                                                                "margin_a_at_div", "margin_b_at_div"])
                row.update(status="done", **meta["summary"], machine_a=meta["machines"]["a"],
                           machine_b=meta["machines"]["b"])
                for rec in table.to_pylist():
                    if rec["first_div_step"] is not None:
                        first_div.append({"pair_id": pair.id, "label": pair.label, "axis": pair.axis,
                                          "context": pair.context, **rec})
            except storage.StorageError as exc:
                row.update(status="unreadable", error=str(exc))
        rows.append(row)
    return rows, first_div


def probe_frames(probes: list[tuple[str, str, str]], run_dir: Path) -> dict[str, pd.DataFrame]:
    """Every probe table of every model × benchmark, concatenated per probe and table;
    per-layer drift is averaged over prompts (the report plots layers, not prompts)."""
    frames: dict[str, list[pd.DataFrame]] = {}
    for probe, model, bench in probes:
        for name in PROBE_TABLES[probe]:
            key = f"{_PROBE_PREFIX[probe]}_{name}.parquet"
            frames.setdefault(key, [])
            path = run_dir / "probes" / model / bench / probe / f"{name}.parquet"
            if path.exists():
                df = storage.read_table(path)[0].to_pandas()
                frames[key].append(df.assign(model=model, benchmark=bench))
    out = {name: pd.DataFrame() for name in SUMMARY_FILES if name.startswith(("kv_", "precision_"))}
    out.update({key: pd.concat(dfs, ignore_index=True) for key, dfs in frames.items() if dfs})
    if not out["kv_layers.parquet"].empty:
        out["kv_layers.parquet"] = out["kv_layers.parquet"].groupby(
            ["model", "benchmark", "precision", "layer", "step"], as_index=False)[["l2", "rel_l2"]].mean()
    if not out["precision_layers.parquet"].empty:
        out["precision_layers.parquet"] = out["precision_layers.parquet"].groupby(
            ["model", "benchmark", "a", "b", "layer", "step"], as_index=False)["l2"].mean()
    return out


def intervention_rows(pairs: list[Pair], run_dir: Path, cells: pd.DataFrame) -> list[dict[str, Any]]:
    """Each intervention against the baseline (`none`) for the same precision pair and
    conditions: exact agreement, lift with a paired bootstrap 90% interval, exact McNemar
    on agreement, trigger rate and wall-time overhead (paper Table 3, per batch size)."""
    from scipy.stats import bootstrap

    from .stats import mcnemar_exact

    by_key: dict[tuple, dict[str, Pair]] = {}
    for pair in pairs:
        if pair.axis != "precision":
            continue
        a = pair.a
        key = (a.model, a.benchmark, str(a.precision), str(pair.b.precision), a.cache, a.batch_size, a.decoding)
        by_key.setdefault(key, {})[a.intervention] = pair
    wall = cells.set_index("cell_id")["wall_seconds"].to_dict() if "wall_seconds" in cells else {}
    trig = cells.set_index("cell_id")["trigger_rate"].to_dict() if "trigger_rate" in cells else {}
    rows = []
    for key, group in sorted(by_key.items()):
        if "none" not in group or len(group) < 2:
            continue
        base = _agreement(run_dir, group["none"])
        if base is None:
            continue
        base_wall = wall.get(group["none"].a.id, np.nan) + wall.get(group["none"].b.id, np.nan)
        for name, pair in sorted(group.items()):
            agree = base if name == "none" else _agreement(run_dir, pair)
            row = dict(zip(("model", "benchmark", "a", "b", "cache", "batch_size", "decoding"), key))
            row.update(intervention=name, status="missing" if agree is None else "done")
            if agree is not None:
                joined = base.merge(agree, left_index=True, right_index=True, suffixes=("_base", "_int"))
                x, y = joined["agree_int"].to_numpy(float), joined["agree_base"].to_numpy(float)
                lift = float(np.mean(x - y))
                lo = hi = float("nan")
                if len(x) > 1 and np.any(x != y):
                    ci = bootstrap((x, y), lambda u, v, axis=-1: np.mean(u - v, axis=axis), paired=True,
                                   confidence_level=0.9, n_resamples=2000, method="percentile",
                                   random_state=np.random.default_rng(0), vectorized=True).confidence_interval
                    lo, hi = float(ci.low), float(ci.high)
                elif len(x):
                    lo = hi = lift
                pair_wall = wall.get(pair.a.id, np.nan) + wall.get(pair.b.id, np.nan)
                row.update(n=len(joined), ear=float(np.mean(x)), lift=lift, lift_ci_low=lo, lift_ci_high=hi,
                           mcnemar_p=mcnemar_exact(x.astype(bool), y.astype(bool)),
                           trigger_rate=float(np.nanmean([trig.get(pair.a.id, np.nan), trig.get(pair.b.id, np.nan)])),
                           overhead=float(pair_wall / base_wall - 1) if base_wall else float("nan"))
            rows.append(row)
    return rows


def _agreement(run_dir: Path, pair: Pair) -> pd.DataFrame | None:
    path = run_dir / "pairs" / f"{pair.id}.parquet"
    if not path.exists():
        return None
    table = pq.read_table(path, columns=["prompt_id", "identical"]).to_pandas()
    return table.set_index("prompt_id").rename(columns={"identical": "agree"})


def write_summaries(cells: list[Cell], pairs: list[Pair], run_dir: str | Path, out_dir: str | Path,
                    probes: list[tuple[str, str, str]] = ()) -> None:
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    prows, first_div = pair_rows(pairs, run_dir)
    cells_df = pd.DataFrame(cell_rows(cells, run_dir))
    frames = {"cells.parquet": cells_df,
              "interventions.parquet": pd.DataFrame(intervention_rows(pairs, run_dir, cells_df)),
              "pairs.parquet": pd.DataFrame(prows),
              "first_divergence.parquet": pd.DataFrame(
                  first_div, columns=["pair_id", "label", "axis", "context", "prompt_id",
                                      "first_div_step", "margin_a_at_div", "margin_b_at_div"]),
              **probe_frames(list(probes), run_dir)}
    for name, df in frames.items():
        storage.write_table(pa.Table.from_pandas(df, preserve_index=False), out_dir / name,
                            {"kind": "summary", "table": name})
