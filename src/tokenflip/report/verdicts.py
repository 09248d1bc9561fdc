"""The report's verdict section: each comparison's verdict against the engine's own noise
floor, the floors themselves (with the distinct completions each prompt got over its runs),
why each pair's prompts parted, and the first-divergence curve."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.ticker import MaxNLocator

from tokenflip.analysis.causes import CAUSES
from tokenflip.analysis.compare import cause_column
from tokenflip.analysis.decision import repeat_floors
from tokenflip.analysis.verdict import floor_counts, larger_floor, upper_bound
from tokenflip.report.common import _svg, first_runs, in_words

# The order the verdicts are listed in: what a release engineer acts on first.
VERDICT_ORDER = ("changes outputs", "undecided", "no floor", "within noise", "none parted", "noise floor")


def why_parted(pair: dict[str, Any]) -> str:
    """A pair's diverged prompts by label ("2 near-tie, 1 drift; 1 rejoined; 2 final answers
    differ"), empty where none parted or the summary predates the labels."""
    def count(key: str) -> int:
        value = pair.get(key)
        return 0 if value is None or pd.isna(value) else int(value)

    if pair.get("status") != "done" or not count("n_diverged") or cause_column(CAUSES[0]) not in pair:
        return ""
    labels = ", ".join(f"{count(cause_column(c))} {c}" for c in CAUSES if count(cause_column(c)))
    answers = count("n_answer_differs")
    return (f"{labels}; {count('n_rejoined')} rejoined; "
            f"{answers} final answer{'s' if answers != 1 else ''} differ{'s' if answers == 1 else ''}")


def verdict_counts(pairs: pd.DataFrame) -> list[dict[str, Any]]:
    """How many pairs got each verdict, in VERDICT_ORDER (first runs only: a setting's
    second run repeats its pairs on the same prompts)."""
    if pairs.empty or "verdict" not in pairs:
        return []
    counts = first_runs(pairs)["verdict"].dropna().value_counts()
    return [{"verdict": v, "n": int(counts[v])} for v in VERDICT_ORDER if v in counts]


def comparison_counts(pairs: pd.DataFrame) -> dict[str, int]:
    """What the header and the verdicts count, from one frame: the comparisons (the pairs
    between first runs, and the repeat pairs: `first_runs`), those finished (each has a
    verdict) and not, the pairs between second runs the pairs table lists beside them, and
    how many were judged against a floor (the e-BH family)."""
    if pairs.empty:
        return {"total": 0, "finished": 0, "unfinished": 0, "second_runs": 0, "tested": 0}
    first = first_runs(pairs)
    finished = int((first["status"] == "done").sum())
    tested = pairs["comparisons_tested"].dropna() if "comparisons_tested" in pairs else pd.Series(dtype=float)
    return {"total": len(first), "finished": finished, "unfinished": len(first) - finished,
            "second_runs": len(pairs) - len(first), "tested": int(tested.max()) if len(tested) else 0}


def decided_lines(pairs: pd.DataFrame) -> list[dict[str, Any]]:
    """The report's first screen: one sentence per judged comparison (first runs), the
    decided first, each with the verdict's own words (`analysis.decision`)."""
    if pairs.empty or "verdict_words" not in pairs:
        return []
    judged = first_runs(pairs)
    judged = judged[(judged["status"] == "done") & judged["comparisons_tested"].notna()]
    rank = {"changes outputs": 0, "within noise": 1, "undecided": 2}
    rows = [{"pair_id": r["pair_id"], "verdict": r["verdict"],
             "comparison": f"{r['axis']}: {r['a']} vs {r['b']}", "where": f"{r['model']} · {r['benchmark']}",
             "words": r["verdict_words"]} for r in judged.to_dict("records")]
    return sorted(rows, key=lambda r: (rank.get(r["verdict"], 3), r["comparison"], r["where"]))


def round_rows(pairs: pd.DataFrame) -> list[dict[str, Any]]:
    """In a study of rounds, each judged comparison (first runs): the round it was decided
    in and the prompts that took, or, stopped undecided, the prompts it had and about
    how many it would need (`analysis.rounds`)."""
    if pairs.empty or "round_decided" not in pairs:
        return []
    judged = first_runs(pairs)
    judged = judged[(judged["status"] == "done") & judged["comparisons_tested"].notna()]
    rows = []
    for r in judged.to_dict("records"):
        decided = r["round_decided"] is not None and not pd.isna(r["round_decided"])
        needed = r.get("prompts_needed")
        rows.append({"pair_id": r["pair_id"], "model": r["model"], "benchmark": r["benchmark"],
                     "comparison": f"{r['axis']}: {r['a']} vs {r['b']}", "context": r["context"],
                     "verdict": r["verdict"], "round": int(r["round_decided"]) if decided else None,
                     "prompts": int(r["prompts_decided"]) if not pd.isna(r.get("prompts_decided"))
                     else int(r["n_prompts"]),
                     "stopped_at_maximum": not decided,
                     "prompts_needed": int(needed) if needed is not None and not pd.isna(needed) else None,
                     "words": r["verdict_words"]})
    return rows


def noise_floor_rows(repeats: pd.DataFrame, pairs: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per setting run more than once: its runs, the prompts whose runs did not all
    give one completion, the most distinct completions of a prompt, and the floor (the
    repeat pairs' divergence, with the bound a zero gives)."""
    if repeats.empty:
        return []
    floors = repeat_floors(pairs.to_dict("records"))
    # whether a setting runs without an intervention is known by its kind, which its pairs hold
    # (an intervention pair's says whether both sides run without one: not this)
    none = {r["cell_a"]: r.get("no_intervention") for r in pairs.to_dict("records")
            if r.get("axis") != "intervention"} if not pairs.empty else {}
    rows = []
    for rep in repeats.to_dict("records"):
        runs = rep.get("run_cell_ids") if rep.get("run_cell_ids") is not None else [rep["cell_id"]]
        # the largest of its runs' floors (the verdicts judge against each, `verdict.with_verdicts`)
        floor = larger_floor([f for cell in runs for f in floor_counts(floors.get(cell, []))])
        k, n = floor if floor else (None, None)
        setting = in_words({**rep, "no_intervention": none.get(rep["cell_id"])})
        rows.append({"model": rep["model"], "benchmark": rep["benchmark"], "setting": setting,
                     "cell_id": rep["cell_id"], "runs": int(rep["runs"]), "n_prompts": int(rep["n_prompts"]),
                     "n_varied": int(rep["n_varied"]), "max_distinct": int(rep["max_distinct"]),
                     "floor_diverged": k, "floor_prompts": n,
                     "floor_bound": upper_bound(k, n) if k is not None else None})
    return rows


def still_identical_figure(curves: pd.DataFrame) -> str | None:
    """The share of prompts still identical after t generated tokens (a prompt that ended
    identical stays identical: each line ends at 1 − parted/n), one line per comparison, a
    panel per model and benchmark."""
    if curves.empty:
        return None
    panels = list(curves.groupby(["model", "benchmark"], sort=True))
    names = sorted(curves["comparison"].unique())
    # one colour and dash per comparison across the panels (husl: as many distinct hues as needed)
    colours = dict(zip(names, sns.color_palette("husl", len(names))))
    dashes = dict(zip(names, [(0, ()), (0, (5, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2))] * len(names)))
    fig, axes = plt.subplots(len(panels), 1, figsize=(6.0, 3.2 * len(panels)), squeeze=False)
    fig.subplots_adjust(hspace=0.45)
    for ax, ((model, bench), data) in zip(axes[:, 0], panels):
        # Curves that never part lie on top of each other at 1: the legend says where each ends.
        for comparison, line in data.groupby("comparison", sort=True):
            end = float(line["still_identical"].iloc[-1])
            ax.step(line["tokens"], line["still_identical"], where="post", color=colours[comparison], linewidth=1.6,
                    linestyle=dashes[comparison],
                    label=f"{comparison} ({int(line['n_prompts'].iloc[0])} prompts; {end:.0%} at the end)")
        ax.set_ylim(-0.02, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("generated tokens")
        ax.set_ylabel("share still identical")
        if len(panels) > 1:
            ax.set_title(f"{model} · {bench}", fontsize=10)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8)
    return _svg(fig)
