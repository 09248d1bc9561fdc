"""What a study's prompt counts can show, before it runs (`tokenflip plan`): per comparison,
the rate a zero result would bound it at, the smallest rise above a floor of zero its prompts
detect at 80% power, and, where the config states the rate it wants to bound
(`verdict.bound`), the prompts that takes (`tokenflip.analysis.verdict`)."""

from __future__ import annotations

from typing import Any


def power_lines(config: dict[str, Any], pairs) -> list[str]:
    from tokenflip.analysis.verdict import detectable_difference, prompts_for_bound, upper_bound

    lines = []
    bound = (config.get("verdict") or {}).get("bound")
    for comp in config["comparisons"]:
        axis, a, b = comp["axis"], str(comp["a"]), str(comp["b"])
        mine = [p for p in pairs if p.axis == axis and str(p.a.value(axis)) == a and str(p.b.value(axis)) == b]
        counts = sorted({config["benchmarks"][p.a.benchmark].get("n") for p in mine}, key=lambda n: (n is None, n))
        for n in counts:
            where = f"comparison {axis}: {a} vs {b}"
            if n is None:
                lines.append(f"{where}: a benchmark without `n` (its prompts are counted when it is read)")
                continue
            lines.append(f"{where}: {n} prompts a pair: 0 parted would bound the rate at "
                         f"{upper_bound(0, n):.1%} (95%); it detects a rise of {detectable_difference(n):.1%} above "
                         f"a floor of 0 at 80% power")
        if bound is not None and mine:
            lines.append(f"comparison {axis}: {a} vs {b}: bounding the rate at {bound:.1%} takes "
                         f"{prompts_for_bound(bound)} prompts a pair")
    return lines
