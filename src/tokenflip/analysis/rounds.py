"""Rounds: after each block of prompts (`study.rounds`), every judged comparison is looked at
by the one rule of `decision` against each of its noise floors; a decided one stops, one that
no continuation to its maximum could decide stops too, and only the cells of the others (and
of their floors) get the next block. Snakemake's checkpoint `decide_round` writes each round's
record (`decide_round`); the summary replays the same rule on the same looks
(`decision.with_decisions`), so the two cannot disagree: a decision depends on the counts of
paired outcomes at each look only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenflip.analysis import decision
from tokenflip.analysis.decision import ALPHA
from tokenflip.core import storage
from tokenflip.core.layout import RunLayout
from tokenflip.core.specs import Pair
from tokenflip.study.rounds import block_ends

if TYPE_CHECKING:
    import pandas as pd

Judged = list[tuple[Pair, list[Pair]]]  # each comparison with its noise floors (repeat pairs)


def judged_pairs(pairs: list[Pair]) -> Judged:
    """Every comparison that has a noise floor, with its floors: every repeat pair either
    run of which is one of its two cells (as `verdict.with_verdicts` pairs them)."""
    floors: dict[str, list[Pair]] = {}
    for pair in pairs:
        if pair.axis == "repeat":
            for cell in (pair.a, pair.b):
                floors.setdefault(cell.id, []).append(pair)
    out = []
    for pair in pairs:
        mine = list({p.id: p for p in [*floors.get(pair.a.id, []), *floors.get(pair.b.id, [])]}.values())
        if pair.axis != "repeat" and mine:
            out.append((pair, mine))
    return out


def cells_of(judged: Judged) -> list[str]:
    """The cell ids a set of comparisons and their floors read."""
    return sorted({c.id for pair, floors in judged for p in (pair, *floors) for c in (p.a, p.b)})


def question(config: dict[str, Any], judged: Judged, number: int, pairs: int | None = None) -> dict[str, Any]:
    """What round `number` decides and how: the comparisons open to it, the prompts each
    benchmark has by then, the margin and levels (a changed one decides the round again)."""
    ends = {b: block_ends(config, b) for b in config["benchmarks"]}
    return {"round": number, "margin": config["verdict"]["margin"], "alpha": ALPHA, "tested": len(judged),
            "intervals": max(pairs or 0, len(judged)), "gate": config.get("gate"),
            "budget": (config.get("rounds") or {}).get("budget"),
            "prompts": {b: e[number - 1] for b, e in ends.items() if len(e) >= number},
            "rounds": {b: len(e) for b, e in ends.items()},  # a raised maximum decides its last round again
            "comparisons": {pair.id: [f.id for f in floors] for pair, floors in judged}}


def _streams(layout: RunLayout, config: dict[str, Any], cell_id: str, number: int,
             seconds: dict[str, list[tuple[int, float]]] | None = None) -> dict[str, list]:
    """A cell's prompts (drawn order) and their token ids, over the blocks it has by round
    `number` (a cell whose comparisons all stopped has fewer); `seconds` gets each block's
    (prompts, job seconds)."""
    _, bench, _ = cell_id.split("/")
    rows: dict[str, list] = {}
    ends = block_ends(config, bench)
    for first, end in zip([0, *ends], ends[:number]):
        path = layout.block(cell_id, first, end)
        if not Path(path).is_file():
            break
        table, meta = storage.read_cell(path)
        rows.update(zip(table.column("prompt_id").to_pylist(), table.column("token_ids").to_pylist()))
        if seconds is not None:
            seconds.setdefault(cell_id, []).append((table.num_rows, float(meta.get("job_seconds") or 0.0)))
    return rows


def budget_check(config: dict[str, Any], number: int, seconds: dict[str, list[tuple[int, float]]],
                 going_on: set[str]) -> dict[str, Any] | None:
    """Where the study has a time budget (`rounds.budget`): what its judged cells' jobs spent
    by round `number`, what the next round's would take (each cell going on: its next block's
    prompts at its own seconds a prompt so far, its job's start and model load included, so
    the prediction errs long), and whether the next round is not started for it."""
    from tokenflip.study.rounds import budget_seconds

    budget = budget_seconds(config)
    if budget is None:
        return None
    spent = sum(s for blocks in seconds.values() for _, s in blocks)
    predicted = 0.0
    for cell_id in going_on:
        done = seconds.get(cell_id) or [(1, 0.0)]
        ends = block_ends(config, cell_id.split("/")[1])
        start, end = (ends[number - 1] or 0), ends[number] if len(ends) > number else None
        prompts = (end - start) if end is not None and start else max(p for p, _ in done)
        predicted += prompts * sum(s for _, s in done) / max(1, sum(p for p, _ in done))
    return {"budget": config["rounds"]["budget"], "seconds": budget, "spent_seconds": round(spent, 3),
            "next_round_seconds": round(predicted, 3), "stops": bool(going_on) and spent + predicted > budget}


def _parted(tables: dict[str, dict[str, list]], pair: Pair) -> tuple[list, set]:
    """The pair's prompts both cells have, in drawn order, and those whose token ids differ."""
    a, b = tables[pair.a.id], tables[pair.b.id]
    order = [p for p in a if p in b]
    return order, {p for p in order if a[p] != b[p]}


def stopped_at_budget(config: dict[str, Any], layout: RunLayout) -> dict[str, tuple[int, str]]:
    """The comparisons the rounds stopped at the study's time budget, each with the round and
    the budget ("10 min"), from the rounds' own records."""
    out: dict[str, tuple[int, str]] = {}
    number = 1
    while Path(layout.round(number)).is_file():
        record = json.loads(Path(layout.round(number)).read_text())
        out.update({pid: (number, s["budget"]) for pid, s in record.get("stopped", {}).items() if s.get("budget")})
        number += 1
    return out


def decide_round(config: dict[str, Any], layout: RunLayout, number: int, judged: Judged,
                 previous: str | None, out_path: str | Path, pairs: int | None = None) -> dict[str, Any]:
    """Round `number`: the rule replayed over rounds 1 to `number` on every judged comparison
    (`decision.decide`), and the cells that go on to the next block: those of comparisons still
    open. `previous` (the round before's record) is read only to check it agrees."""
    asked = question(config, judged, number, pairs)
    seconds: dict[str, list[tuple[int, float]]] = {}
    tables = {cell_id: _streams(layout, config, cell_id, number, seconds) for cell_id in cells_of(judged)}
    comparisons, looks = {}, {}
    for pair, floors in judged:
        order, parted = _parted(tables, pair)
        seqs = [decision.outcome_sequence(order, parted, *_parted(tables, f)) for f in floors]
        ends = block_ends(config, pair.a.benchmark)
        comparisons[pair.id] = seqs
        looks[pair.id] = [len(order) if e is None else e for e in ends]
    gates = {pair.id: bound for pair, _ in judged
             if (bound := decision.gated(config.get("gate"), pair.axis, pair.label)) is not None}
    decisions = decision.decide(comparisons, looks, asked["margin"], ALPHA, asked["intervals"], gates, through=number)
    decided, stopped, open_now, go_on = {}, {}, [], set()
    for pair, floors in judged:
        d = decisions.get(pair.id)
        ends = block_ends(config, pair.a.benchmark)
        if d is None:
            continue
        if d.verdict is not None:
            decided[pair.id] = {"verdict": d.verdict, "prompts": d.decided_n, "round": d.round}
        if d.open and len(ends) > number:  # undecided, or decided and its gate not yet
            open_now.append(pair.id)
            go_on.update(c.id for p in (pair, *floors) for c in (p.a, p.b))
        elif d.verdict is None:
            stopped[pair.id] = {"prompts": d.look.n, "round": number, "maximum": ends[-1]}
    spending = budget_check(config, number, seconds, go_on)
    if spending and spending["stops"]:  # the next round would pass the budget: what is open stops here
        for pid in open_now:
            pair = next(p for p, _ in judged if p.id == pid)
            stopped[pid] = {"prompts": decisions[pid].look.n, "round": number,
                            "maximum": block_ends(config, pair.a.benchmark)[-1], "budget": spending["budget"]}
        open_now, go_on = [], set()
    if previous:
        before = json.loads(Path(previous).read_text())
        changed = [k for k, v in before.get("decided", {}).items() if decided.get(k, {}).get("verdict") != v["verdict"]]
        if changed:
            raise RuntimeError(f"round {number}: comparisons {changed} were decided otherwise by the round before; "
                               f"remove results/{config['run']}/rounds to decide again")
    record = {**asked, "decided": decided, "stopped": stopped, "open": open_now, "continue": sorted(go_on),
              **({"budget": spending} if spending else {})}
    storage.write_json(out_path, record)
    return record


def paired_outcomes(per_prompt: dict[str, pd.DataFrame]) -> dict[str, tuple[list, set]]:
    """Each compared pair's prompts (in drawn order) and those that parted: what pairs a
    comparison with its noise floor prompt by prompt (`decision.with_decisions`)."""
    return {pid: (list(df["prompt_id"]), set(df.loc[~df["identical"].astype(bool), "prompt_id"]))
            for pid, df in per_prompt.items()}


def verdict_rows(config: dict[str, Any], pairs: list[dict], per_prompt: dict[str, pd.DataFrame],
                 planned_pairs: list, budget: dict[str, tuple[int, str]] | None = None) -> list[dict]:
    """The pair rows, each with its one verdict from the decision module at the rounds' looks
    (`budget`: the comparisons the rounds stopped at the study's time budget, each closed in
    the round it stopped in, its maximum still the benchmark's)."""
    import pandas as pd

    from tokenflip.study.rounds import rounds_on

    outcomes = paired_outcomes(per_prompt)
    ends = {b: block_ends(config, b) if rounds_on(config) else [None] for b in config["benchmarks"]}
    correct = {pid: [(p, bool(a), bool(b)) for p, a, b in zip(df["prompt_id"], df["correct_a"], df["correct_b"])
                     if a is not None and b is not None and not pd.isna(a) and not pd.isna(b)]
               for pid, df in per_prompt.items() if {"correct_a", "correct_b"} <= set(df.columns)}
    return decision.with_decisions(pairs, outcomes, lambda row: [e or len(outcomes[row["pair_id"]][0])
                                                                 for e in ends[row["benchmark"]]],
                                   config["verdict"]["margin"], judged=len(judged_pairs(planned_pairs)),
                                   intervals=len(planned_pairs), correct=correct, gate=config.get("gate"),
                                   budget=budget)
