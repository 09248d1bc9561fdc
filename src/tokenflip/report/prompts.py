"""The section "Your prompts": what a user's own prompts (benchmarks of kind `prompts`) said
and what each engine's default cell answered, shown even where nothing diverged: an audit
of a live server is first read as its answers."""

from __future__ import annotations

from typing import Any

import pandas as pd

# Characters of a text shown before the rest is folded behind a <details>.
SHOWN_CHARS = 300


def _text(text: Any, cut: Any) -> dict[str, Any]:
    text = text if isinstance(text, str) else ""
    return {"text": text, "head": text[:SHOWN_CHARS], "long": len(text) > SHOWN_CHARS, "cut": bool(cut)}


def _column_labels(group: pd.DataFrame) -> dict[str, str]:
    """Cell id -> its column's name: the engine, with the precision where one engine ran in several."""
    precisions = group.groupby("engine")["precision"].nunique()
    cells = group.drop_duplicates("cell_id").sort_values(["engine", "precision"])
    return {r.cell_id: r.engine if precisions[r.engine] == 1 else f"{r.engine} · {r.precision}"
            for r in cells.itertuples()}


def prompt_groups(texts: pd.DataFrame) -> list[dict[str, Any]]:
    """One table per model and benchmark: a row per prompt (in the benchmark's order), its
    text, and one column per engine's completion (None where that cell lacks the prompt)."""
    if texts.empty:
        return []
    groups = []
    for (model, benchmark), group in texts.groupby(["model", "benchmark"], sort=False):
        columns = _column_labels(group)
        by_prompt = {}
        for r in group.sort_values("prompt_index").to_dict("records"):
            row = by_prompt.setdefault(r["prompt_id"], {"prompt_id": r["prompt_id"],
                                                        "prompt": _text(r["prompt"], r["prompt_cut"]), "by_cell": {}})
            row["by_cell"][r["cell_id"]] = {**_text(r["completion"], r["completion_cut"]),
                                            "finish_reason": r["finish_reason"], "n_tokens": int(r["n_tokens"])}
        rows = [{"prompt_id": row["prompt_id"], "prompt": row["prompt"],
                 "completions": [row["by_cell"].get(cell) for cell in columns]} for row in by_prompt.values()]
        groups.append({"model": model, "benchmark": benchmark, "columns": list(columns.values()), "rows": rows})
    return groups
