"""Aggregate a run: one table of cells and one of pairs, read from file metadata and the
small per-prompt pair tables, one file at a time (never the cells' per-step columns)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from . import storage
from .plan import Cell, Pair

SUMMARY_FILES = ("cells.parquet", "pairs.parquet", "first_divergence.parquet",
                 "kv_steps.parquet", "kv_layers.parquet", "kv_patching.parquet")
PROBE_TABLES = ("steps", "layers", "patching")


def cell_rows(cells: list[Cell], run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for cell in cells:
        path = run_dir / "cells" / f"{cell.id}.parquet"
        row: dict[str, Any] = {"cell_id": cell.id, **cell.as_dict(), "status": "missing"}
        if path.exists():
            try:
                meta = storage.read_metadata(path)
                correct = pq.read_table(path, columns=["correct", "n_tokens"])
                acc = pd.Series(correct.column("correct").to_pylist(), dtype="boolean").fillna(False)
                row.update(status="done", n_prompts=correct.num_rows, accuracy=float(acc.mean()),
                           generated_tokens=int(sum(correct.column("n_tokens").to_pylist())),
                           wall_seconds=meta["wall_seconds"], token_stream_sha256=meta["token_stream_sha256"],
                           logits_sha256=meta["logits_sha256"], device=meta["environment"]["device"]["name"])
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
                row.update(status="done", **meta["summary"])
                for rec in table.to_pylist():
                    if rec["first_div_step"] is not None:
                        first_div.append({"pair_id": pair.id, "label": pair.label, "axis": pair.axis,
                                          "context": pair.context, **rec})
            except storage.StorageError as exc:
                row.update(status="unreadable", error=str(exc))
        rows.append(row)
    return rows, first_div


def probe_frames(probes: list[tuple[str, str, str]], run_dir: Path) -> dict[str, pd.DataFrame]:
    """KV-cache probe tables of every model × benchmark, concatenated; layer drift is
    averaged over prompts (the report plots layers × steps)."""
    frames: dict[str, list[pd.DataFrame]] = {name: [] for name in PROBE_TABLES}
    for probe, model, bench in probes:
        if probe != "kv_cache":
            continue
        for name in PROBE_TABLES:
            path = run_dir / "probes" / model / bench / probe / f"{name}.parquet"
            if path.exists():
                df = storage.read_table(path)[0].to_pandas()
                frames[name].append(df.assign(model=model, benchmark=bench))
    out = {name: (pd.concat(dfs, ignore_index=True) if dfs else pd.DataFrame())
           for name, dfs in frames.items()}
    if not out["layers"].empty:
        out["layers"] = (out["layers"].groupby(["model", "benchmark", "precision", "layer", "step"],
                                                as_index=False)[["l2", "rel_l2"]].mean())
    return {"kv_steps.parquet": out["steps"], "kv_layers.parquet": out["layers"],
            "kv_patching.parquet": out["patching"]}


def write_summaries(cells: list[Cell], pairs: list[Pair], run_dir: str | Path, out_dir: str | Path,
                    probes: list[tuple[str, str, str]] = ()) -> None:
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    prows, first_div = pair_rows(pairs, run_dir)
    frames = {"cells.parquet": pd.DataFrame(cell_rows(cells, run_dir)),
              "pairs.parquet": pd.DataFrame(prows),
              "first_divergence.parquet": pd.DataFrame(
                  first_div, columns=["pair_id", "label", "axis", "context", "prompt_id",
                                      "first_div_step", "margin_a_at_div", "margin_b_at_div"]),
              **probe_frames(list(probes), run_dir)}
    for name, df in frames.items():
        storage.write_table(pa.Table.from_pandas(df, preserve_index=False), out_dir / name,
                            {"kind": "summary", "table": name})
