"""Aggregate a run into the summary tables the report reads, after checking that every
result is what the config asks for.

A cell file is used only if its recorded cell id, cell and settings are exactly the
current config's for its path, and its data match the digests recorded when it was
written (recomputed here); a pair file only if it was made from the cells now on disk; a
probe table only if its settings are the current ones. Anything else is refused with the
file, the differing field and what to run next (`ResultError`), never summarised under a
name it does not belong to. Per-step columns go through Arrow compute only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tokenflip.analysis import ResultError, compare, texts  # noqa: F401 - ResultError raised here, imported from here
from tokenflip.analysis.floors import (
    REPEAT_COLUMNS,
    STILL_IDENTICAL_COLUMNS,
    repeat_rows,
    settings_run_again,
    still_identical_rows,
    streams_of,
)
from tokenflip.analysis.interventions import intervention_rows
from tokenflip.analysis.rounds import paired_outcomes, stopped_at_budget, verdict_rows  # noqa: F401 - read here
from tokenflip.core import storage
from tokenflip.core.axes import AXES
from tokenflip.core.layout import RunLayout
from tokenflip.core.provenance import flatten_provenance
from tokenflip.core.specs import Cell, Pair
from tokenflip.run.interventions import no_intervention_labels
from tokenflip.study.plan import cell_job, expand_cells, expand_pairs, probe_job, probe_targets

BASE_TABLES = ("cells", "pairs", "first_divergence", "still_identical", "repeats", "diverged", "texts",
               "interventions", "environment")
# What the summary keeps of each diverged prompt: where it parted, both margins there, the
# label of why (`causes`), where the streams came together again, and whether the answers agree.
FIRST_DIV_FIELDS = ["first_div_step", "margin_a_at_div", "margin_b_at_div", "cause", "rejoin_step", "same_answer"]


def summary_tables() -> list[str]:
    """Every summary table: the base ones and each registered probe's."""
    from tokenflip.run.probes import PROBES

    return [*BASE_TABLES, *(name for probe in PROBES.values() for name in probe.summary_tables())]


def first_difference(recorded: Any, expected: Any) -> tuple[str, Any, Any] | None:
    """The first field (dotted path) where two settings differ, with both values."""
    a = flatten_provenance(json.loads(json.dumps(recorded)))
    b = flatten_provenance(json.loads(json.dumps(expected)))
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            return key, a.get(key, "<absent>"), b.get(key, "<absent>")
    return None


def _redo(path: str) -> str:
    return f"remove it, or run `snakemake --forcerun {path}` to make it again"


@dataclass
class Checked:
    """What the checks found: usable results, and refusals (file -> reason)."""

    refused: dict[str, str] = field(default_factory=dict)

    def refuse(self, path: str, reason: str) -> None:
        self.refused[path] = reason


def input_digests(description: dict[str, Any]) -> dict[str, Any]:
    """The digests of the data files a benchmark description names (its source, exemplar
    and shot sources): {dotted key: sha256}."""
    return {key: value for key, value in flatten_provenance(description).items() if key.endswith("sha256")}


def current_inputs(config: dict[str, Any], benchmark: str, cache: dict[str, dict]) -> dict[str, Any]:
    """The digests of the benchmark's data files as they are now (computed once per run)."""
    if benchmark not in cache:
        from tokenflip.run.benchmarks import BenchmarkError, build_benchmark

        try:
            cache[benchmark] = input_digests(build_benchmark(benchmark, config["benchmarks"][benchmark]).describe())
        except (BenchmarkError, OSError) as exc:
            raise ResultError(f"benchmark {benchmark!r}: its data cannot be read now ({exc})") from None
    return cache[benchmark]


def check_cell(path: str, cell: Cell, expected_settings: dict[str, Any],
               inputs: dict[str, Any] | None = None) -> tuple[pa.Table, dict[str, Any]]:
    """The cell file at `path`, if it is the cell the config asks for there, made from the
    data files as they are now (`inputs`, see `current_inputs`); else ResultError."""
    try:
        table, meta = storage.read_cell(path)
    except storage.StorageError as exc:
        raise ResultError(f"{exc}; {_redo(path)}") from None
    if meta.get("cell_id") != cell.id or meta.get("cell") != cell.as_dict():
        raise ResultError(f"{path}: holds cell {meta.get('cell_id')!r}, not {cell.id!r} (a file copied from "
                          f"elsewhere?); {_redo(path)}")
    diff = first_difference(meta.get("settings"), expected_settings)
    if diff is not None:
        key, got, want = diff
        raise ResultError(f"{path}: made with settings.{key} = {got!r}, but the config asks for {want!r}; "
                          f"{_redo(path)}")
    recorded = input_digests(meta.get("benchmark", {}))
    for key, now in (inputs or {}).items():
        if recorded.get(key) != now:
            where = key.rsplit(".", 1)[0]
            file = flatten_provenance(meta.get("benchmark", {})).get(f"{where}.path") or where
            raise ResultError(f"{path}: made from another version of its data ({file}: benchmark.{key} "
                              f"{str(recorded.get(key))[:12]}… then, {now[:12]}… now); {_redo(path)}")
    return table, meta


def _seconds(meta: dict[str, Any]) -> float:
    """The cell's compute time robust to other load: process CPU time on a CPU, wall time
    (synchronised) on an accelerator, where the host CPU mostly waits."""
    device = meta.get("environment", {}).get("device", {}).get("type")
    if device == "cpu" and meta.get("cpu_seconds") is not None:
        return float(meta["cpu_seconds"])
    return float(meta.get("wall_seconds", float("nan")))


def cell_row(cell: Cell, table: pa.Table, meta: dict[str, Any]) -> dict[str, Any]:
    from tokenflip.run.engines.endpoint.server import summary_columns as endpoint_columns

    steps = pc.sum(table.column("n_tokens")).as_py() or 0
    fired = pc.sum(pc.list_flatten(table.column("intervened")).cast(pa.int64())).as_py() or 0
    flat_margin = pc.list_flatten(table.column("margin"))
    mean_margin, std_margin = pc.mean(flat_margin).as_py(), pc.stddev(flat_margin).as_py()
    # A sandbox failure leaves `correct` null: counted apart, never as the model's failure.
    acc = pd.Series(table.column("correct").to_pylist(), dtype="boolean").dropna()
    verdicts = pd.Series(table.column("verdict").to_pylist(), dtype="string")
    env = meta["environment"]
    seconds = _seconds(meta)
    return dict(
        status="done", n_prompts=table.num_rows, accuracy=float(acc.mean()) if len(acc) else float("nan"),
        n_scored=int(len(acc)), n_sandbox_errors=int((verdicts == "sandbox_error").sum()),
        n_no_answer=int(verdicts.isin(["no_answer", "no_code"]).sum()),
        n_stopped=int(pc.sum(pc.equal(table.column("finish_reason"), "stop")).as_py() or 0),
        **texts.truncation(table, meta),
        generated_tokens=int(steps),
        max_prompt_tokens=int(pc.max(pc.list_value_length(table.column("prompt_ids"))).as_py() or 0),
        wall_seconds=float(meta["wall_seconds"]), compute_seconds=seconds,
        seconds_per_token=seconds / steps if steps else float("nan"),
        token_stream_sha256=meta["token_stream_sha256"], logits_sha256=meta["logits_sha256"],
        device_name=env["device"]["name"], device_type=env["device"]["type"],
        torch=env["software"].get("torch"), transformers=env["software"].get("transformers"),
        trigger_rate=fired / steps if steps else float("nan"),
        # A serving engine's prefix cache: the prompt tokens it served (None where none was asked).
        prefix_cached_tokens=(meta.get("engine") or {}).get("prefix_cache", {}).get("cached_tokens"),
        mean_margin=float("nan") if mean_margin is None else float(mean_margin),
        cv_margin=float(std_margin / mean_margin) if mean_margin and std_margin is not None else float("nan"),
        **endpoint_columns(meta))


def triggered_prompts(table: pa.Table) -> set[str]:
    """Prompts on which an intervention fired at least once."""
    column = table.column("intervened").combine_chunks()
    flat = np.asarray(pc.list_flatten(column).to_numpy(zero_copy_only=False), dtype=bool)
    parents = np.asarray(pc.list_parent_indices(column))
    hit = np.zeros(table.num_rows, dtype=bool)
    hit[parents[flat]] = True
    return {pid for pid, fired in zip(table.column("prompt_id").to_pylist(), hit) if fired}


def cell_rows(config: dict[str, Any], layout: RunLayout, checked: Checked,
              cells: list[Cell] | None = None) -> tuple[list[dict], dict[str, dict]]:
    """One row per planned cell (missing ones included), and the metadata of the usable ones
    (with the prompts its intervention fired on, under `_triggered`)."""
    rows, metas, inputs = [], {}, {}
    none = no_intervention_labels(config)
    cells = cells if cells is not None else expand_cells(config)
    run_again = {cell.id for runs in settings_run_again(cells) for cell in runs}
    for cell in cells:
        path = layout.cell(cell.id)
        row: dict[str, Any] = {"cell_id": cell.id, **cell.fields(), "no_intervention": cell.intervention in none,
                               "status": "missing"}
        if Path(path).exists():
            try:
                table, meta = check_cell(path, cell, cell_job(config, cell).to_json(),
                                         current_inputs(config, cell.benchmark, inputs))
                row.update(cell_row(cell, table, meta))
                metas[cell.id] = {**meta, "_triggered": triggered_prompts(table)}
                if cell.id in run_again:  # its completions, to count the distinct ones over its runs
                    metas[cell.id]["_streams"] = streams_of(table)
            except ResultError as exc:
                checked.refuse(path, str(exc))
                row.update(status="refused", error=str(exc))
        rows.append(row)
    return rows, metas


def _pair_base(pair: Pair, none: tuple[str, ...]) -> dict[str, Any]:
    """A pair's identity and shared settings; `no_intervention`: both cells run without
    one (an intervention of kind `none`, whatever the config calls it)."""
    shared = {axis: (None if axis == pair.axis else pair.a.value(axis)) for axis in AXES}
    return {"pair_id": pair.id, "label": pair.label, "axis": pair.axis, "model": pair.a.model,
            "no_intervention": pair.axis != "intervention" and pair.a.intervention in none,
            "benchmark": pair.a.benchmark, "a": str(pair.a.value(pair.axis)), "b": str(pair.b.value(pair.axis)),
            "context": pair.context, "cell_a": pair.a.id, "cell_b": pair.b.id, **shared, "status": "missing"}


def check_pair(path: str, pair: Pair, cell_metas: dict[str, dict]) -> tuple[pa.Table, dict[str, Any]]:
    """The pair file at `path`, if it compares exactly the two cells now on disk."""
    try:
        table, meta = storage.read_table(path, kind="pair")
    except storage.StorageError as exc:
        raise ResultError(f"{exc}; {_redo(path)}") from None
    missing = [c for c in compare.PER_PROMPT_COLUMNS if c not in table.column_names]
    if missing:
        raise ResultError(f"{path}: made by an earlier tokenflip (no column {missing[0]!r}); {_redo(path)}")
    if meta.get("pair", {}).get("id") != pair.id:
        raise ResultError(f"{path}: holds pair {meta.get('pair', {}).get('id')!r}, not {pair.id!r}; {_redo(path)}")
    for side, cell in (("a", pair.a), ("b", pair.b)):
        current = cell_metas.get(cell.id)
        if current is None:
            raise ResultError(f"{path}: its cell {side} ({cell.id}) is missing or refused; {_redo(path)}")
        if meta.get("digests", {}).get(side) != current["token_stream_sha256"]:
            raise ResultError(f"{path}: made from another version of cell {side} ({cell.id}: token-stream digest "
                              f"{str(meta.get('digests', {}).get(side))[:12]}… vs "
                              f"{current['token_stream_sha256'][:12]}… now); {_redo(path)}")
    return table, meta


def pair_rows(config: dict[str, Any], layout: RunLayout, cell_metas: dict[str, dict], checked: Checked,
              pairs: list[Pair] | None = None
              ) -> tuple[list[dict], list[dict], dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """One row per planned pair; the first-divergence rows; each usable pair's per-prompt
    agreement (for the interventions table) and first divergence with lengths (for the
    first-divergence curve)."""
    rows, first_div, agreement, per_prompt = [], [], {}, {}
    none = no_intervention_labels(config)
    for pair in pairs if pairs is not None else expand_pairs(config, expand_cells(config)):
        path = layout.pair(pair.id)
        row = _pair_base(pair, none)
        if Path(path).exists():
            try:
                table, meta = check_pair(path, pair, cell_metas)
            except ResultError as exc:
                checked.refuse(path, str(exc))
                row.update(status="refused", error=str(exc))
            else:
                # The pair figures are derived from the per-prompt table here, not taken from
                # the file's stored summary: a pair file made by an earlier tokenflip (whose
                # summary lacks a newer figure) then reports like a new one.
                row.update(status="done", **compare.summarize(table), machine_a=meta["machines"]["a"],
                           machine_b=meta["machines"]["b"],
                           n_agree_without_answer=texts.answerless_agreements(table.to_pandas()))
                df = table.select(["prompt_id", "identical", *FIRST_DIV_FIELDS, "n_tokens_a", "n_tokens_b",
                                   "correct_a", "correct_b"]).to_pandas()
                agreement[pair.id] = df.set_index("prompt_id")[["identical"]].rename(columns={"identical": "agree"})
                per_prompt[pair.id] = df
                for rec in df[df["first_div_step"].notna()][["prompt_id", *FIRST_DIV_FIELDS]].to_dict("records"):
                    first_div.append({"pair_id": pair.id, "label": pair.label, "axis": pair.axis,
                                      "context": pair.context, "model": pair.a.model,
                                      "benchmark": pair.a.benchmark, **rec})
        rows.append(row)
    return rows, first_div, agreement, per_prompt


def probe_frames(config: dict[str, Any], layout: RunLayout, checked: Checked,
                 pairs: list[Pair] | None = None) -> dict[str, pd.DataFrame]:
    """Every probe table of every model × benchmark, concatenated per probe and table and
    reduced as the probe says; a table made with other settings is refused."""
    from tokenflip.run.probes import PROBES

    frames: dict[str, list[pd.DataFrame]] = {name: [] for probe in PROBES.values()
                                             for name in probe.summary_tables()}
    for probe_name, model, bench in probe_targets(config):
        probe = PROBES[probe_name]
        expected = probe_job(config, probe_name, model, bench, pairs).to_json()
        for table_name in probe.tables:
            path = layout.probe_table(probe_name, model, bench, table_name)
            if not Path(path).exists():
                continue
            try:
                table, meta = storage.read_table(path, kind="probe")
            except storage.StorageError as exc:
                checked.refuse(path, f"{exc}; {_redo(path)}")
                continue
            diff = first_difference(meta.get("settings"), expected)
            if diff is not None:
                checked.refuse(path, f"{path}: made with settings.{diff[0]} = {diff[1]!r}, but the config asks "
                                     f"for {diff[2]!r}; {_redo(path)}")
                continue
            frames[f"{probe.summary_prefix}_{table_name}"].append(
                table.to_pandas().assign(model=model, benchmark=bench))
    out = {}
    for probe in PROBES.values():
        for table_name in probe.tables:
            key = f"{probe.summary_prefix}_{table_name}"
            df = pd.concat(frames[key], ignore_index=True) if frames[key] else pd.DataFrame()
            if not df.empty and table_name in probe.aggregate:
                df = probe.aggregate[table_name](df)
            out[key] = df
    return out


def environment_rows(cell_metas: dict[str, dict]) -> list[dict[str, Any]]:
    """The run's provenance, once per kind of thing: software, device and determinism per
    machine, and each model's and benchmark's description (JSON), so that the report needs
    nothing but the summaries."""
    rows, seen = [], set()
    for cell_id, meta in sorted(cell_metas.items()):
        model, bench = cell_id.split("/")[:2]
        env = meta["environment"]
        for kind, name, value in (("software", env["device"]["name"], env["software"]),
                                  ("device", env["device"]["name"], env["device"]),
                                  ("determinism", env["device"]["name"], env["determinism"]),
                                  ("model", model, meta["model"]), ("benchmark", bench, meta["benchmark"]),
                                  ("engine", meta.get("engine", {}).get("name", "transformers"), meta.get("engine"))):
            if (kind, name) not in seen:
                seen.add((kind, name))
                rows.append({"kind": kind, "name": name, "json": json.dumps(value, sort_keys=True, default=str)})
    return rows


def with_server_defaults(rows: list[dict], metas: dict[str, dict]) -> list[dict]:
    """Each pair row with `server_defaults`: what either cell's server did at temperature 0
    beyond its numerics (`endpoint.server.server_defaults`), also said in the verdict's words
    ("server defaults differ"), so that a parting a server's own penalty made does not read
    as a numerical difference. The verdict itself is the decision rule's, unchanged."""
    from tokenflip.run.engines.endpoint.server import server_defaults

    out = []
    for row in rows:
        said = [w for cell in (row["cell_a"], row["cell_b"]) if (w := server_defaults(cell, metas.get(cell) or {}))]
        row = {**row, "server_defaults": "; ".join(said) or None}
        if said and row.get("verdict_words"):
            row["verdict_words"] += (f" — server defaults differ: {'; '.join(said)} (a penalty or bias applied after "
                                     f"its scores), so the parting may be the server's sampling, not numerics")
        out.append(row)
    return out


def collect(config: dict[str, Any], layout: RunLayout) -> tuple[dict[str, pd.DataFrame], Checked]:
    """Every summary table of the run, and what was refused."""
    checked = Checked()
    planned_cells = expand_cells(config)
    planned_pairs = expand_pairs(config, planned_cells)
    cells, metas = cell_rows(config, layout, checked, planned_cells)
    cells_df = pd.DataFrame(cells)
    pairs, first_div, agreement, per_prompt = pair_rows(config, layout, metas, checked, planned_pairs)
    first_div = pd.DataFrame(first_div, columns=[
        "pair_id", "label", "axis", "context", "model", "benchmark", "prompt_id", *FIRST_DIV_FIELDS])
    diverged = texts.diverged_frame(planned_pairs, first_div, layout, metas, checked.refuse)
    frames = {
        "cells": cells_df,
        "pairs": pd.DataFrame(with_server_defaults(verdict_rows(config, pairs, per_prompt, planned_pairs,
                                                                stopped_at_budget(config, layout)), metas)),
        "first_divergence": first_div,
        "still_identical": pd.DataFrame(still_identical_rows(planned_pairs, per_prompt),
                                        columns=STILL_IDENTICAL_COLUMNS),
        "repeats": pd.DataFrame(repeat_rows(planned_cells, metas), columns=REPEAT_COLUMNS),
        "diverged": diverged,
        "texts": texts.prompt_texts_frame(config, planned_cells, metas, layout.cell),
        "interventions": pd.DataFrame(intervention_rows(config, agreement, cells_df, metas, planned_pairs)),
        "environment": pd.DataFrame(environment_rows(metas), columns=["kind", "name", "json"]),
        **probe_frames(config, layout, checked, planned_pairs),
    }
    return frames, checked


def write_summaries(config: dict[str, Any], layout: RunLayout, out_dir: str | Path | None = None,
                    strict: bool = True) -> Checked:
    """Write every summary table into `out_dir` (default: the run's summary folder). With
    `strict`, any refused result is an error listing each file and why; otherwise (the
    partial report after a failed run) refused results are listed as such."""
    frames, checked = collect(config, layout)
    if strict and checked.refused:  # the summary before is of other results: removed, never read as this one's
        for name in frames:
            (Path(out_dir or layout.summary_dir) / f"{name}.parquet").unlink(missing_ok=True)
        raise ResultError(f"{len(checked.refused)} result file(s) are not what the config asks for (the run's "
                          f"summary before is removed):\n  " + "\n  ".join(checked.refused.values()))
    out_dir = Path(out_dir or layout.summary_dir)
    for name, df in frames.items():
        storage.write_table(pa.Table.from_pandas(df, preserve_index=False), out_dir / f"{name}.parquet",
                            # the study's declared CI gate travels with its pairs (`tokenflip gate`)
                            {"kind": "summary", "table": name, "run": config["run"], "gate": config.get("gate")})
    return checked
