"""The summary's pair rows, each with its one verdict and the words the report, the rounds'
records and the gate show."""

from __future__ import annotations

import json

from tokenflip.analysis.decision.forecast import MOST_PROMPTS, prompts_needed
from tokenflip.analysis.decision.rule import (
    ALPHA,
    MARGIN,
    Decision,
    Look,
    accuracy_drops,
    decide,
    gated,
    guarantee,
    interval,
)


def repeat_floors(rows: list[dict]) -> dict[str, list[dict]]:
    """Every finished repeat pair, under each of its two runs' cell ids: the floors a cell's
    comparisons are judged against."""
    floors: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("axis") == "repeat" and row.get("status") == "done":
            for cell in (row["cell_a"], row["cell_b"]):  # a floor of both runs
                floors.setdefault(cell, []).append(row)
    return floors


def outcome_sequence(order: list, parted: set, floor_order: list, floor_parted: set) -> list[int]:
    """The comparison's outcome minus its floor's on each prompt both measured, in the
    comparison's order (1: only the comparison parted, −1: only the floor)."""
    shared = set(floor_order)
    return [int(p in parted) - int(p in floor_parted) for p in order if p in shared]


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def _needed(look: Look, margin: float, intervals: int, judged: int) -> int | None:
    """Prompts needed at the rates seen against the floor that decides (the smallest e-value)."""
    u, _, w = look.deciding()
    n = max(1, look.n)
    return prompts_needed(u / n, w / n, "verdict", start=look.n, margin=margin, intervals=intervals, judged=judged)


def verdict_words(decision: Decision, parted: int, margin: float, needed: int | None,
                  budget: str | None = None) -> str:
    """The verdict in words; `budget`: the study's time budget, where its rounds stopped this
    comparison undecided."""
    look = decision.look
    taken = decision.decided_n or look.n
    where = (f"in round {decision.round} of {decision.rounds}, after {taken} prompts" if decision.rounds > 1 else
             f"after {taken} prompts")
    span = f"its excess over the noise floor {_pct(look.low)} to {_pct(look.high)}"
    later = (f"; it went on to {look.n} prompts for the gate at {decision.gate:.0%}"
             if decision.gate is not None and look.n > taken else "")
    if decision.verdict == "changes outputs":
        e = decision.e_value if decision.e_value is not None else look.e_changes
        return (f"changes outputs: shown {where} (e-value {e:.3g}, e-BH at 5%){later} ({parted} of "
                f"{look.n} parted; {span}, every interval of the study holding at once)")
    if decision.verdict == "within noise":
        return (f"within noise: within ±{margin:.0%} of the noise floor, shown {where}{later} ({parted} of {look.n} "
                f"parted; {span})")
    why = (f"stopped after {look.n} prompts: no continuation to its maximum of {decision.maximum} could decide it"
           if decision.stopped_early else
           f"stopped at the study's time budget ({budget}) after {look.n} prompts" if budget else
           f"at its maximum of {look.n} prompts")
    more = (f"about {needed} prompts in all would decide it at the rates seen" if needed else
            f"more than {MOST_PROMPTS:,} prompts would be needed at the rates seen")
    return f"undecided {why} ({parted} parted; {span}): {more}"


def with_decisions(rows: list[dict], outcomes: dict[str, tuple[list, set]], looks_of, margin: float = MARGIN,
                   alpha: float = ALPHA, judged: int | None = None, intervals: int | None = None,
                   correct: dict[str, list[tuple[str, bool, bool]]] | None = None,
                   gate: dict | None = None, budget: dict[str, tuple[int, str]] | None = None) -> list[dict]:
    """The summary's pair rows, each with its one verdict. `outcomes`: each pair's prompts in
    drawn order and those that parted; `looks_of(row)`: the prompts its benchmark has at each
    round (`[n]` without rounds); `judged` and `intervals`: the study's families (its planned
    judged comparisons and its planned pairs); `correct`: per pair, (prompt, a right, b right)
    for the scored prompts, for the accuracy rule; `gate`: the study's declared gate (its
    comparisons go on after their verdict until the gate is decided, as the rounds did);
    `budget`: the comparisons the rounds stopped at the study's time budget, each with the round
    and the budget ("10 min")."""
    floors = repeat_floors(rows)
    comparisons, looks, floor_rows = {}, {}, {}
    for row in rows:
        if row.get("status") != "done" or row.get("axis") == "repeat" or not int(row["n_prompts"]):
            continue
        order, parted = outcomes[row["pair_id"]]
        mine = {f["pair_id"]: f for f in [*floors.get(row["cell_a"], []), *floors.get(row["cell_b"], [])]}
        # a floor measured on other prompts says nothing of these: left out, its row with it
        paired = [(f, s) for f, s in ((f, outcome_sequence(order, parted, *outcomes[pid])) for pid, f in mine.items())
                  if s]
        if paired:
            comparisons[row["pair_id"]] = [s for _, s in paired]
            looks[row["pair_id"]] = [min(n, min(len(s) for _, s in paired)) for n in looks_of(row)]
            floor_rows[row["pair_id"]] = [f for f, _ in paired]
    names = {r["pair_id"]: (r["axis"], r.get("label")) for r in rows}
    gates = {pid: bound for pid in comparisons if (bound := gated(gate, *names[pid])) is not None}
    judged = max(judged or 0, len(comparisons))
    intervals = max(intervals or 0, len(rows), judged)
    budget = budget or {}
    decisions = decide(comparisons, looks, margin, alpha, intervals, gates,
                       stops={pid: number for pid, (number, _) in budget.items()})
    drops = accuracy_drops({pid: _accuracy_counts(scored, decisions[pid].look.n if pid in decisions else None,
                                                   outcomes[pid][0])
                            for pid, scored in (correct or {}).items() if scored}, alpha)
    out = []
    for row in rows:
        row = {**row, "verdict": None, "verdict_words": None, "floor_rate": None, "excess": None,
               "interval_low": None, "interval_high": None, "interval_of": None, "e_value": None,
               "comparisons_tested": None, "floors_paired": None, "round_decided": None, "prompts_decided": None,
               "prompts_needed": None, "stopped_early": None, "accuracy_dropped": row.get("pair_id") in drops,
               "intervals": intervals, "guarantee": guarantee(intervals, judged, alpha)}
        if row.get("status") != "done":
            out.append(row)
            continue
        k, n, pid = int(row["n_diverged"]), int(row["n_prompts"]), row["pair_id"]
        if pid in decisions:
            d = decisions[pid]
            u, l, w = d.look.deciding()
            floor = floor_rows[pid][d.look.counts.index((u, l, w))]
            needed = None if d.verdict else _needed(d.look, margin, intervals, judged)
            parted_then = sum(p in outcomes[pid][1] for p in outcomes[pid][0][: d.look.n])  # at its last look
            row.update(verdict=d.verdict or "undecided", verdict_words=verdict_words(d, parted_then, margin, needed,
                                                                               budget.get(pid, (0, None))[1]),
                       floor_rate=(int(floor["n_diverged"]) / int(floor["n_prompts"])) if floor else None,
                       excess=(u - w) / max(1, d.look.n), interval_low=d.look.low, interval_high=d.look.high,
                       interval_of="excess",
                       e_value=d.e_value if d.e_value is not None else d.look.e_changes, comparisons_tested=judged,
                       floors_paired=json.dumps([{"floor": f["pair_id"], "n": d.look.n, "only_comparison": a,
                                                  "neither_or_both": b, "only_floor": c}
                                                 for f, (a, b, c) in zip(floor_rows[pid], d.look.counts)]),
                       round_decided=d.round, prompts_decided=d.decided_n or d.look.n, prompts_needed=needed,
                       stopped_early=d.stopped_early)
            out.append(row)
            continue
        low, high = interval(k, n - k, 0, intervals, alpha)  # a noise floor, or no floor: its own rate
        low = max(0.0, low)  # a rate is never below 0
        row.update(interval_low=low, interval_high=high, interval_of="rate")
        if row.get("axis") == "repeat":
            row.update(verdict="noise floor", floor_rate=k / n if n else None,
                       verdict_words=f"noise floor: {k} of {n} prompts parted when the same setting ran again "
                                     f"(the rate {low:.1%} to {high:.1%})")
        elif k == 0:
            row.update(verdict="none parted", verdict_words=f"none parted: 0 of {n} prompts, and no repeat measured "
                                                            f"this engine's noise (the rate at most {high:.1%})")
        else:
            row.update(verdict="no floor", verdict_words=f"no floor: {k} of {n} prompts parted; no repeat measured "
                                                         f"this engine's own noise, so whether that is more than its "
                                                         f"noise is not known (add repeat: [default, 2])")
        out.append(row)
    return out


def _accuracy_counts(scored: list[tuple[str, bool, bool]], n: int | None, order: list) -> tuple[int, int, int]:
    """(a right and b wrong, same, a wrong and b right) on the scored prompts among the first n."""
    kept = set(order[:n]) if n is not None else None
    pairs = [(a, b) for p, a, b in scored if kept is None or p in kept]
    return sum(a and not b for a, b in pairs), sum(a == b for a, b in pairs), sum(b and not a for a, b in pairs)
