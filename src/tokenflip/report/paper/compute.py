"""One function computes every row: its population selected from the summary tables (every
axis the row does not name at its default; the paper's models, else each model as a
stand-in), grouped as the paper gives the figure, the statistic applied."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from tokenflip.report.paper.formats import ANY, _missing
from tokenflip.report.paper.rows import ROWS
from tokenflip.report.paper.study import FRAMES, Row, Study, Tables, paper_models
from tokenflip.study.plan import plain_values


def _matches(column: pd.Series, value: Any) -> pd.Series:
    if isinstance(value, (tuple, list, set, frozenset)):
        return pd.concat([_matches(column, v) for v in value], axis=1).any(axis=1)
    if isinstance(value, int) and not isinstance(value, bool):  # batch_size: a float column in pair tables
        return pd.to_numeric(column, errors="coerce") == value
    return column.astype(str) == str(value)


def _at_defaults(frame: pd.DataFrame, row: Row, study: Study) -> pd.DataFrame:
    """The rows of an axis-carrying table whose axes are as the row asks: the named
    values, and every other axis at its default (or, for a pair, the compared axis)."""
    select = dict(row.select)
    if select.get("intervention") == "C":
        select["intervention"] = tuple(study.c_labels) or ("<none>",)
    defaults: dict[str, Any] = plain_values(study.greedy, study.none)
    defaults["decoding"] = defaults["decoding"] or ("<none>",)
    keep = pd.Series(True, index=frame.index)
    between = select.pop("between", None)
    if between is not None:
        a, b = between
        keep &= ((frame["a"] == a) & (frame["b"] == b)) | ((frame["a"] == b) & (frame["b"] == a))
    axis = select.get("axis")
    for key, value in {**defaults, **select}.items():
        if value is ANY or key not in frame or key == axis:
            continue
        keep &= _matches(frame[key], value)
    return frame[keep]


def _restrict(frame: pd.DataFrame, row: Row, study: Study) -> tuple[pd.DataFrame, list[str]]:
    """The row's models and benchmarks; where the run has none of the paper's, every one
    of the run's, with a note of what they stand in for."""
    notes = []
    if row.exclude and "model" in frame:
        out = [m for m in frame["model"].unique()
               if any(re.search(p, f"{m} {study.identity.get(m, m)}", re.I) for p in row.exclude)]
        frame = frame[~frame["model"].isin(out)]
    if row.models and "model" in frame:
        ours = [m for m in frame["model"].unique()
                if paper_models(m, study.identity.get(m, m)) & set(row.models)]
        if ours:
            frame = frame[frame["model"].isin(ours)]
        elif len(frame):
            stand_in = ", ".join(sorted(frame["model"].unique()))
            notes.append(f"{stand_in}, in place of {', '.join(row.models)}")
    if "benchmark" in frame and (row.benchmarks or row.bare):
        names = frame["benchmark"].unique()
        ours = [b for b in names if (not row.benchmarks or study.kind.get(b, b) in row.benchmarks)
                and (not row.bare or study.format.get(b, "chat") == "bare")]
        if ours or not row.stand_in:
            frame = frame[frame["benchmark"].isin(ours)]
        elif len(frame):
            wanted = ", ".join(row.benchmarks) or "a benchmark"
            notes.append(f"{', '.join(sorted(names))}, in place of {wanted}{' (bare prompts)' if row.bare else ''}")
    return frame, notes


def _groups(frame: pd.DataFrame, row: Row) -> list[tuple[str, pd.DataFrame]]:
    by = [c for c in row.by if c in frame]
    if not by:
        return [("", frame)]
    return [(" / ".join(map(_label, key if isinstance(key, tuple) else (key,))), g)
            for key, g in frame.groupby(by, sort=True)]


def _label(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _compute(row: Row, tables: Tables, study: Study) -> tuple[str, str]:
    frame = FRAMES[row.source](tables)
    if frame.empty:
        raise KeyError("no data")
    frame = _at_defaults(frame, row, study)
    frame, notes = _restrict(frame, row, study)
    if frame.empty:
        raise KeyError("no data")
    if row.across is not None:
        values = row.across(frame, study)
    else:
        values = {}
        for name, group in _groups(frame, row):
            try:
                value = row.value(group)
            except (KeyError, ValueError, ZeroDivisionError, IndexError):
                continue
            if not _missing(value) and value != "–":
                values[name] = value
    if not values:
        raise KeyError("no data")
    if row.show == "range" and len(values) > 1:
        ordered = sorted(values.values())
        lo, hi = row.fmt(ordered[0]), row.fmt(ordered[-1])
        ours = lo if lo == hi else f"{lo} to {hi}"
    elif len(values) == 1:
        ours = row.fmt(next(iter(values.values())))
    else:
        ours = "; ".join(f"{name}: {row.fmt(v)}" for name, v in values.items())
    models = sorted(frame["model"].unique()) if "model" in frame else []
    what = notes if notes else ([", ".join(models)] if models else [])
    spread = f"over {len(values)} {' × '.join(row.by)} group(s)" if row.show == "range" and len(values) > 1 else ""
    detail = row.detail(frame) if row.detail else ""
    return ours, "; ".join(x for x in [*what, spread, detail] if x)


def comparison_rows(tables: Tables, study: Study, device: str) -> list[dict[str, str]]:
    """Rows of (paper, claim, paper's figure and conditions, ours and our conditions, the
    population). A row whose data this run does not have says so instead of a number."""
    out = []
    for row in ROWS:
        if row.unmeasured:
            ours, conditions = "–", row.unmeasured
        else:
            try:
                ours, conditions = _compute(row, tables, study)
                conditions = f"{conditions}; {device}"
            except (KeyError, ValueError, ZeroDivisionError):
                ours, conditions = "–", "not in this run"
        out.append({"paper": row.paper, "claim": row.claim, "paper_figure": row.figure,
                    "paper_conditions": row.conditions, "ours": ours, "our_conditions": conditions,
                    "population": row.population()})
    return out
