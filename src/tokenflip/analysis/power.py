"""What a study's rule can decide, before it runs (`tokenflip plan`), in the figures of the
rule it runs (`analysis.decision`: its looks at the rounds' ends, its families, its margin),
summed exactly over the counts at each look, not simulated: per comparison, the chance of
deciding "changes outputs" by its maximum when it parts on a stated share of prompts more than
a floor that parts on none (`verdict.rise`, else 10%), whether and when "within noise" is
decided when nothing parts, and the prompts each needs (the one estimate every reader uses)."""

from __future__ import annotations

from typing import Any

RISE = 0.10


def looks(config: dict[str, Any], benchmark: str) -> list[int] | None:
    """The prompts a comparison of `benchmark` is looked at after (None: its n is not known
    before the benchmark is read)."""
    from tokenflip.study.rounds import block_ends, rounds_on

    n = config["benchmarks"][benchmark].get("n")
    ends = block_ends(config, benchmark) if rounds_on(config) else [n]
    return None if None in ends else [int(e) for e in ends]


def power_lines(config: dict[str, Any], pairs) -> list[str]:
    from tokenflip.analysis.decision import ALPHA, power, prompts_needed
    from tokenflip.analysis.rounds import judged_pairs

    judged, intervals = len(judged_pairs(pairs)), len(pairs)
    margin = config["verdict"]["margin"]
    rise = (config.get("verdict") or {}).get("rise") or RISE
    levels = {"margin": margin, "intervals": intervals, "judged": max(1, judged)}
    lines = [f"the rule: {judged} comparisons judged against their noise floors (e-BH at {ALPHA:.0%} for \"changes "
             f"outputs\"), {intervals} intervals each at {ALPHA / (2 * max(1, intervals)):.2g} a side (\"within "
             f"±{margin:.0%}\" and the gate)"]
    seen = set()
    for comp in config["comparisons"]:
        axis, a, b = comp["axis"], str(comp["a"]), str(comp["b"])
        if axis == "repeat":  # a noise floor: what the others are judged against, not judged itself
            continue
        mine = [p for p in pairs if p.axis == axis and str(p.a.value(axis)) == a and str(p.b.value(axis)) == b]
        for bench in sorted({p.a.benchmark for p in mine}):
            if (axis, a, b, bench) in seen:
                continue
            seen.add((axis, a, b, bench))
            where = f"comparison {axis}: {a} vs {b} on {bench}"
            at = looks(config, bench)
            if at is None:
                lines.append(f"{where}: a benchmark without `n` (its prompts are counted when it is read)")
                continue
            chance = power(at, rise, 0.0, "changes", **levels)
            need_change = prompts_needed(rise, 0.0, "changes", **levels)
            need_level = prompts_needed(0.0, 0.0, "within", **levels)
            lines.append(
                f"{where}: at most {at[-1]} prompts, looked at after {', '.join(map(str, at))}: parting on "
                f"{rise:.0%} more prompts than a floor of 0, \"changes outputs\" is decided by then with probability "
                f"{chance:.0%} ({_about(need_change)} for even odds); parting on none, \"within ±{margin:.0%}\" "
                + (f"is decided after {need_level} prompts" if need_level and need_level <= at[-1] else
                   f"needs {_about(need_level)}: not within this maximum"))
            for what, bound in (("verdict.bound", (config.get("verdict") or {}).get("bound")),
                                ("the gate", (config.get("gate") or {}).get("max_divergence"))):
                if bound:
                    need = prompts_needed(0.0, 0.0, "gate", bound=bound, **levels)
                    lines.append(f"{where}: parting on none, shown at most {bound:.0%} above its floor ({what}) "
                                 f"after {_about(need)}" + ("" if need and need <= at[-1] else
                                                            ": not within this maximum"))
    return lines


def _about(n: int | None) -> str:
    return f"{n} prompts" if n else "more than 100,000 prompts"


def budget_lines(config: dict[str, Any], pairs, per_cell: dict[str, float | None], hours: str) -> list[str]:
    """What a study's time budget (`rounds.budget`) is expected to decide on the device the
    cost model priced (`plan --cost`): the prompts a judged cell gets when every judged cell
    takes each block (its priced seconds over its prompts, so a load counts again in each:
    the estimate errs short), against the prompts a verdict needs (`power_lines`' figures)."""
    from tokenflip.analysis.decision import prompts_needed
    from tokenflip.analysis.rounds import judged_pairs
    from tokenflip.study.rounds import budget_seconds

    budget = budget_seconds(config)
    judged = judged_pairs(pairs)  # (comparison, its floors)
    cells = {c.id: c for pair, floors in judged for p in (pair, *floors) for c in (p.a, p.b)}
    rates = [per_cell.get(cid) / n for cid, cell in cells.items()
             if per_cell.get(cid) and (n := (config["benchmarks"][cell.benchmark].get("n") or 0))]
    if budget is None or not rates or len(rates) < len(cells):
        return [] if budget is None else [f"rounds.budget {config['rounds']['budget']}: not priced here (a judged "
                                          f"cell of another engine, or a benchmark without `n`)"]
    affordable = int(budget / sum(rates))
    margin = config["verdict"]["margin"]
    levels = {"margin": margin, "intervals": len(pairs), "judged": max(1, len(judged))}
    need_level = prompts_needed(0.0, 0.0, "within", **levels)
    need_change = prompts_needed((config.get("verdict") or {}).get("rise") or RISE, 0.0, "changes", **levels)
    fits = lambda n: "within it" if n and n <= affordable else "beyond it"  # noqa: E731
    return [f"rounds.budget {config['rounds']['budget']} ({budget:g} s) on this device: about {affordable} prompts a "
            f"judged cell ({len(cells)} cells, {sum(rates):.3g} s a prompt together at the priced figures, in "
            f"{hours} seconds); a comparison that parts on none is decided \"within ±{margin:.0%}\" after "
            f"{_about(need_level)} ({fits(need_level)}), one that parts on {RISE:.0%} more prompts than its floor "
            f"\"changes outputs\" at even odds after {_about(need_change)} ({fits(need_change)})"]
