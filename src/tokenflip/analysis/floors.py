"""The summary's tables behind the verdicts: each setting's noise floor as the distinct
completions its prompts got over its runs (the `repeat` axis), and each comparison's
first-divergence curve."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tokenflip.core.axes import AXES, FURTHER_AXES
from tokenflip.core.specs import Cell, Pair

STILL_IDENTICAL_COLUMNS = ["model", "benchmark", "axis", "a", "b", "comparison", "n_prompts", "tokens",
                           "still_identical"]


def streams_of(table: pa.Table) -> dict[str, str]:
    """Each prompt's generated token ids as a short digest, to count distinct completions."""
    return {pid: hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]
            for pid, ids in zip(table.column("prompt_id").to_pylist(), table.column("token_ids").to_pylist())}


# A setting run more than once (the `repeat` axis): how many distinct completions each prompt
# got over its runs, the "unique outputs in N runs" figure of determinism tests.
REPEAT_COLUMNS = ["cell_id", "run_cell_ids", "model", "benchmark", *(a for a in AXES if a != "repeat"), "runs", "n_prompts",
                  "n_varied", "max_distinct", "mean_distinct"]


def settings_run_again(cells: list[Cell]) -> list[list[Cell]]:
    """The cells grouped by setting (every axis but `repeat`), where a setting has two runs or
    more: only their completions are needed to count distinct ones."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(tuple((k, str(v)) for k, v in sorted(cell.as_dict().items()) if k != "repeat"),
                          []).append(cell)
    return [runs for runs in groups.values() if len(runs) > 1]


def repeat_rows(cells: list[Cell], metas: dict[str, dict]) -> list[dict[str, Any]]:
    """One row per setting with at least two finished runs (cells that differ only in
    `repeat`), under the first run's id: prompts whose runs did not all give one completion
    (`n_varied`), and the most and mean distinct completions per prompt."""
    rows = []
    for runs in settings_run_again(cells):
        runs = [c for c in runs if c.id in metas]
        if len(runs) < 2:
            continue
        runs = sorted(runs, key=lambda c: str(c.repeat) != str(FURTHER_AXES["repeat"]))  # the first run first
        streams = [metas[c.id]["_streams"] for c in runs]
        prompts = sorted(set.intersection(*(set(s) for s in streams)))
        distinct = np.array([len({s[p] for s in streams}) for p in prompts])
        first = runs[0]
        rows.append({"cell_id": first.id, "run_cell_ids": [c.id for c in runs],
                     **{k: v for k, v in first.fields().items() if k != "repeat"},
                     "runs": len(runs), "n_prompts": len(prompts), "n_varied": int((distinct > 1).sum()),
                     "max_distinct": int(distinct.max()) if len(prompts) else 0,
                     "mean_distinct": float(distinct.mean()) if len(prompts) else float("nan")})
    return rows


def still_identical_rows(pairs: list[Pair], per_prompt: dict[str, pd.DataFrame]) -> list[dict[str, Any]]:
    """The first-divergence curve of each comparison (its pairs' prompts pooled), per model
    and benchmark: the share of prompts still identical after t generated tokens
    (`verdict.still_identical`: it ends at 1 − parted/n), as steps from (0, 1) to the longest stream; one
    curve per engine where the engine is not the compared axis."""
    from tokenflip.analysis.verdict import still_identical

    pooled: dict[tuple, list[pd.DataFrame]] = {}
    first_run, default_engine = str(FURTHER_AXES["repeat"]), str(FURTHER_AXES["engine"])
    for pair in pairs:
        # the first runs only (a setting's second run holds the same prompts again), and never
        # two engines in one curve
        if pair.id in per_prompt and (pair.axis == "repeat" or str(pair.a.repeat) == first_run):
            engine = "" if pair.axis == "engine" or str(pair.a.engine) == default_engine else str(pair.a.engine)
            key = (pair.a.model, pair.a.benchmark, pair.axis, str(pair.a.value(pair.axis)),
                   str(pair.b.value(pair.axis)), engine)
            pooled.setdefault(key, []).append(per_prompt[pair.id])
    rows = []
    for (model, bench, axis, a, b, engine), frames in pooled.items():
        df = pd.concat(frames, ignore_index=True)
        first = [None if pd.isna(t) else int(t) for t in df["first_div_step"]]
        length = df[["n_tokens_a", "n_tokens_b"]].min(axis=1).astype(int).tolist()
        times, share = still_identical(first)
        points = [(0, 1.0), *zip(times, share)]
        points.append((max([*length, *times, 0]), points[-1][1]))
        rows += [{"model": model, "benchmark": bench, "axis": axis, "a": a, "b": b, "comparison": f"{axis}: {a} vs {b}" + (f" · {engine}" if engine else ""),
                  "n_prompts": len(df), "tokens": int(t), "still_identical": float(p)} for t, p in points]
    return rows
