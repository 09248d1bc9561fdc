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
from typing import Any

from tokenflip.analysis import decision
from tokenflip.analysis.decision import ALPHA
from tokenflip.core import storage
from tokenflip.core.layout import RunLayout
from tokenflip.core.specs import Pair
from tokenflip.study.rounds import block_ends

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
            "prompts": {b: e[number - 1] for b, e in ends.items() if len(e) >= number},
            "rounds": {b: len(e) for b, e in ends.items()},  # a raised maximum decides its last round again
            "comparisons": {pair.id: [f.id for f in floors] for pair, floors in judged}}


def _streams(layout: RunLayout, config: dict[str, Any], cell_id: str, number: int) -> dict[str, list]:
    """A cell's prompts (drawn order) and their token ids, over the blocks it has by round
    `number` (a cell whose comparisons all stopped has fewer)."""
    _, bench, _ = cell_id.split("/")
    rows: dict[str, list] = {}
    ends = block_ends(config, bench)
    for first, end in zip([0, *ends], ends[:number]):
        path = layout.block(cell_id, first, end)
        if not Path(path).is_file():
            break
        table, _ = storage.read_cell(path)
        rows.update(zip(table.column("prompt_id").to_pylist(), table.column("token_ids").to_pylist()))
    return rows


def _parted(tables: dict[str, dict[str, list]], pair: Pair) -> tuple[list, set]:
    """The pair's prompts both cells have, in drawn order, and those whose token ids differ."""
    a, b = tables[pair.a.id], tables[pair.b.id]
    order = [p for p in a if p in b]
    return order, {p for p in order if a[p] != b[p]}


def decide_round(config: dict[str, Any], layout: RunLayout, number: int, judged: Judged,
                 previous: str | None, out_path: str | Path, pairs: int | None = None) -> dict[str, Any]:
    """Round `number`: the rule replayed over rounds 1 to `number` on every judged comparison
    (`decision.decide`), and the cells that go on to the next block: those of comparisons still
    open. `previous` (the round before's record) is read only to check it agrees."""
    asked = question(config, judged, number, pairs)
    tables = {cell_id: _streams(layout, config, cell_id, number) for cell_id in cells_of(judged)}
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
    if previous:
        before = json.loads(Path(previous).read_text())
        changed = [k for k, v in before.get("decided", {}).items() if decided.get(k, {}).get("verdict") != v["verdict"]]
        if changed:
            raise RuntimeError(f"round {number}: comparisons {changed} were decided otherwise by the round before; "
                               f"remove results/{config['run']}/rounds to decide again")
    record = {**asked, "decided": decided, "stopped": stopped, "open": open_now, "continue": sorted(go_on)}
    storage.write_json(out_path, record)
    return record
