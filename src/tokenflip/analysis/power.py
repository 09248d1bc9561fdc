"""What a study's prompt counts can show, before it runs (`tokenflip plan`), in the figures of
the rule the verdicts use (`analysis/paired.py`): per comparison, the rate a zero result
would bound it at, the smallest rise above a floor of zero the paired exact test detects at
80% power (summed exactly, not by a normal approximation), and, where the config states
them (`verdict.bound`, `verdict.rise`), the prompts each takes."""

from __future__ import annotations

from typing import Any

POWER = 0.8


def power_lines(config: dict[str, Any], pairs) -> list[str]:
    from tokenflip.analysis.paired import detectable_rise, prompts_for_power
    from tokenflip.analysis.verdict import prompts_for_bound, upper_bound

    lines = []
    wanted = config.get("verdict") or {}
    for comp in config["comparisons"]:
        axis, a, b = comp["axis"], str(comp["a"]), str(comp["b"])
        mine = [p for p in pairs if p.axis == axis and str(p.a.value(axis)) == a and str(p.b.value(axis)) == b]
        counts = sorted({config["benchmarks"][p.a.benchmark].get("n") for p in mine}, key=lambda n: (n is None, n))
        where = f"comparison {axis}: {a} vs {b}"
        for n in counts:
            if n is None:
                lines.append(f"{where}: a benchmark without `n` (its prompts are counted when it is read)")
                continue
            rise = detectable_rise(n, 0.0, POWER)
            lines.append(f"{where}: {n} prompts a pair: 0 parted would bound the rate at {upper_bound(0, n):.1%} "
                         f"(95%); against a floor of 0 the paired exact test "
                         + (f"detects a rise of {rise:.1%} at 80% power" if rise is not None else
                            "detects no rise at 80% power (too few prompts)"))
        if wanted.get("bound") is not None and mine:
            needed = prompts_for_bound(wanted["bound"])
            lines.append(f"{where}: bounding the rate at {wanted['bound']:.1%} takes {needed} prompts a pair")
        if wanted.get("rise") is not None and mine:
            needed = prompts_for_power(wanted["rise"], 0.0, POWER)
            lines.append(f"{where}: detecting a rise of {wanted['rise']:.1%} above a floor of 0 at 80% power takes "
                         + (f"{needed} prompts a pair" if needed else "more than 20,000 prompts a pair"))
    return lines
