"""Rounds: after each block of prompts (`study.rounds`), every comparison still open is
judged by the anytime-valid paired rule of `sequential` against each of its noise floors;
a decided one stops, and only the cells of the others (and of their floors) get the next
block, up to the maximum. Snakemake's checkpoint `decide_round` writes each round's
decisions (`decide_round`); the summary then gives each comparison the verdict of the
round it was decided in (`with_round_verdicts`), the same whether the prompts came in
rounds or at once: a decision is a function of the paired outcomes in prompt order only.

"Changes outputs" is shown at α / (the study's judged comparisons) (Bonferroni, valid at
every look); "within noise" as the fixed-n rule, at 1 − 2α per comparison.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenflip.analysis import sequential
from tokenflip.analysis.verdict import ALPHA
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


def question(config: dict[str, Any], judged: Judged, number: int) -> dict[str, Any]:
    """What round `number` decides and how: the comparisons open to it, the prompts each
    benchmark has by then, the margin and levels (a changed one decides the round again)."""
    ends = {b: block_ends(config, b) for b in config["benchmarks"]}
    return {"round": number, "margin": config["verdict"]["margin"], "alpha": ALPHA, "tested": len(judged),
            "prompts": {b: e[number - 1] for b, e in ends.items() if len(e) >= number},
            "rounds": {b: len(e) for b, e in ends.items()},  # a raised maximum decides its last round again
            "comparisons": {pair.id: [f.id for f in floors] for pair, floors in judged}}


def _parted(tables: dict[str, dict[str, list]], pair: Pair, prompts: int) -> dict[str, bool]:
    """Whether each of the pair's first `prompts` prompts parted (token ids not identical)."""
    a, b = tables[pair.a.id], tables[pair.b.id]
    return {pid: a[pid] != b[pid] for pid in list(a)[:prompts]}


def outcome_sequences(parted: dict[str, bool], floors: list[dict[str, bool]]) -> list[list[int]]:
    """Per floor, the comparison's outcome minus the floor's on each prompt both measured, in
    prompt order (1: only the comparison parted, −1: only the floor)."""
    return [[int(parted[p]) - int(floor[p]) for p in parted if p in floor] for floor in floors]


def decide_round(config: dict[str, Any], layout: RunLayout, number: int, judged: Judged,
                 previous: str | None, out_path: str | Path) -> dict[str, Any]:
    """Round `number`: judge every comparison still open on the prompts its benchmark has by
    now (its cells' blocks so far), stop those that could not be decided within their maximum
    even at best (`sequential.decidable_within`), and name the cells that go on to the next
    block."""
    asked = question(config, judged, number)
    before = json.loads(Path(previous).read_text()) if previous else {"decided": {}, "stopped": {}, "open": None}
    decided, stopped = dict(before["decided"]), dict(before["stopped"])
    still = [(pair, floors) for pair, floors in judged
             if pair.id not in decided and pair.id not in stopped
             and (before["open"] is None or pair.id in before["open"])
             and pair.a.benchmark in asked["prompts"]]
    tables: dict[str, dict[str, list]] = {}
    for cell_id in cells_of(still):
        model, bench, name = cell_id.split("/")
        rows: dict[str, list] = {}
        ends = block_ends(config, bench)
        for first, end in zip([0, *ends], ends[:number]):
            table, _ = storage.read_cell(layout.block(cell_id, first, end))
            rows.update(zip(table.column("prompt_id").to_pylist(), table.column("token_ids").to_pylist()))
        tables[cell_id] = rows
    open_now, go_on = [], set()
    for pair, floors in still:
        prompts = asked["prompts"][pair.a.benchmark]
        parted = _parted(tables, pair, prompts)
        d = outcome_sequences(parted, [_parted(tables, f, prompts) for f in floors])
        label, taken = sequential.decided_against(d, asked["margin"], ALPHA, asked["tested"])
        if label is not None:
            decided[pair.id] = {"verdict": label, "prompts": taken, "round": number}
            continue
        ends = block_ends(config, pair.a.benchmark)
        if len(ends) > number and not sequential.decidable_within(d, ends[-1] - prompts, asked["margin"], ALPHA,
                                                                  asked["tested"]):
            stopped[pair.id] = {"prompts": prompts, "round": number, "maximum": ends[-1]}
            continue
        open_now.append(pair.id)
        if len(ends) > number:
            go_on.update(c.id for p in (pair, *floors) for c in (p.a, p.b))
    record = {**asked, "decided": decided, "stopped": stopped, "open": open_now, "continue": sorted(go_on)}
    storage.write_json(out_path, record)
    return record


def with_round_verdicts(rows: list[dict], order: dict[str, list[str]], outcomes: dict[str, tuple[set, set]],
                        config: dict[str, Any], judged: Judged) -> list[dict]:
    """The summary's pair rows (with their fixed-n verdicts) given the rounds' verdicts: each
    comparison judged on its prompts in order (`order`, per pair id) by the rule every
    round applied, with the round it was decided in and the prompts it took; one stopped at
    its maximum undecided says about how many prompts it would still need."""
    margin, tested = config["verdict"]["margin"], len(judged)
    floors_of = {pair.id: [f.id for f in floors] for pair, floors in judged}
    out = []
    for row in rows:
        row = {**row, "round_decided": None, "prompts_decided": None, "prompts_needed": None}
        pid = row.get("pair_id")
        if row.get("status") != "done" or pid not in floors_of or not int(row["n_prompts"]):
            out.append(row)
            continue
        parted = {p: p in outcomes[pid][1] for p in order[pid]}
        floors = [{p: p in outcomes[f][1] for p in order[f]} for f in floors_of[pid] if f in outcomes]
        d = [x for x in outcome_sequences(parted, floors) if x]  # a floor that shares no prompt says nothing
        if not d:
            out.append(row)
            continue
        label, taken = sequential.decided_against(d, margin, ALPHA, tested)
        ends = block_ends(config, row["benchmark"])
        # the anytime p of the e-process the rule runs (at α/tested): adjusted ≤ α exactly when it decides
        ps = [sequential.anytime_p(x, ALPHA / tested) for x in d]
        p, deciding = max(ps), d[max(range(len(d)), key=ps.__getitem__)]
        k, n = int(row["n_diverged"]), len(deciding)
        row.update(p_above=p, p_adjusted=min(1.0, p * tested), comparisons_tested=tested)
        if label is not None:
            rnd = next(i + 1 for i, e in enumerate(ends) if e is None or e >= taken)
            low, high = sequential.excess_sequence(deciding[:taken], 2 * ALPHA)
            row.update(verdict=label, round_decided=rnd, prompts_decided=ends[rnd - 1] or n,
                       excess_low=float(low[-1]), excess_high=float(high[-1]),
                       verdict_words=f"{label}: decided in round {rnd} of {len(ends)}, after {ends[rnd - 1] or n} "
                                     f"prompts ({k} of {row['n_prompts']} parted; the excess over the floor "
                                     f"{float(low[-1]):+.1%} to {float(high[-1]):+.1%}; anytime p = {p:.3g}, "
                                     f"{min(1.0, p * tested):.3g} over {tested} comparisons)")
        elif k == 0:
            row.update(verdict="none parted")
        else:
            more = sum(x == 1 for x in deciding) / n
            less = sum(x == -1 for x in deciding) / n
            need = sequential.prompts_to_decide(more, less, margin, ALPHA, tested)
            maximum = ends[-1] or n
            where = (f"at its maximum of {n} prompts" if n >= maximum else
                     f"after {n} prompts, stopped: not even the best case of the {maximum - n} left to its maximum "
                     f"of {maximum} could decide it")
            row.update(verdict="undecided", prompts_needed=need,
                       verdict_words=f"undecided {where} ({k} parted; anytime p = {p:.3g}): "
                                     + (f"about {need} prompts in all would decide it (the median of simulated "
                                        f"runs at the rates seen)" if need else
                                        "more than 4,000 prompts would be needed at the rates seen"))
        out.append(row)
    return out
