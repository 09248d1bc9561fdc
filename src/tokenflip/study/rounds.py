"""Blocks and rounds: a study that declares `blocks` (or `rounds`) generates a cell's
prompts in blocks of the benchmark's order (prompts [0, 16), [16, 32), [32, 64), ... with
the defaults), each block a job and a file of its own, joined into the cell's file. A
block's job depends on its own prompts only, never on the benchmark's n, so raising n (or a
later round) generates only the new blocks; the last block, cut at n, is the one made again
when n grows past it.

Block ends are multiples of the first block, which every batch size divides, so each
batch holds the same prompts as in a cell made at once (a batch's composition is an axis:
it changes the numbers).

With `rounds`, the blocks are rounds: after each, `analysis.rounds` decides every
comparison it can (an anytime-valid test, so looking after each round keeps its error
rate), and only the cells of undecided comparisons (and their floors) get the next block,
up to `rounds.max_prompts` or the benchmark's n.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterator

from tokenflip.core.specs import Cell

DEFAULT_FIRST = 16


def in_blocks(config: dict[str, Any]) -> bool:
    """Whether the study generates its cells in blocks (it declares `blocks` or `rounds`);
    otherwise each cell is one job, its n one block."""
    return config.get("blocks") is not None or rounds_on(config)


def rounds_on(config: dict[str, Any]) -> bool:
    """Whether the study decides in rounds (it declares `rounds`)."""
    return config.get("rounds") is not None


def batch_sizes(config: dict[str, Any]) -> set[int]:
    """Every batch size a grid lists."""
    return {int(size) for grid in config["grids"] for size in grid.get("batch_size", [1])}


def first_block(config: dict[str, Any]) -> int:
    """The prompts of a first block: the study's `blocks.first`, else the least multiple of
    16 that every batch size divides."""
    given = config.get("blocks", {}).get("first")
    return int(given) if given is not None else math.lcm(DEFAULT_FIRST, *batch_sizes(config))


UNIT_SECONDS = {"s": 1, "min": 60, "h": 3600}
# What `rounds.budget` takes (the config schema's pattern is this one): "10 min", "90 s", "1.5h".
BUDGET_PATTERN = r"^[0-9]+(\.[0-9]+)? ?(s|min|h)$"


def budget_seconds(config: dict[str, Any]) -> float | None:
    """`rounds.budget` in seconds ("10 min" is 600), None where the rounds have none."""
    text = (config.get("rounds") or {}).get("budget")
    if not text:
        return None
    found = re.fullmatch(BUDGET_PATTERN.strip("^$"), text)  # JSON Schema's `$` also takes a final newline
    if found is None:
        raise ValueError(f"rounds.budget: {text!r} is no time such as '10 min', '90 s' or '2 h'")
    return float(text[: found.start(2)]) * UNIT_SECONDS[found.group(2)]


def max_prompts(config: dict[str, Any], benchmark: str) -> int | None:
    """The most prompts a cell of `benchmark` generates (None: every item of the benchmark)."""
    n = config["benchmarks"][benchmark].get("n")
    cap = (config.get("rounds") or {}).get("max_prompts")
    return min(v for v in (n, cap) if v is not None) if n is not None or cap is not None else None


def block_ends(config: dict[str, Any], benchmark: str) -> list[int | None]:
    """Where each block of `benchmark` ends: first, first·growth, first·growth², ..., and the
    maximum (None: the benchmark's last item, one block); one block, the whole cell, in a
    study not made in blocks."""
    cap = max_prompts(config, benchmark)
    if cap is None or not in_blocks(config):
        return [None]
    first, growth = first_block(config), int(config.get("blocks", {}).get("growth", 2))
    ends, end = [], first
    while end < cap:
        ends.append(end)
        end *= growth
    return [*ends, cap]


def blocks_of(config: dict[str, Any], benchmark: str) -> list[tuple[int, int | None]]:
    """Every block of `benchmark` as [first, end) of its prompts."""
    ends = block_ends(config, benchmark)
    return list(zip([0, *ends[:-1]], ends))


def problems(config: dict[str, Any]) -> Iterator[str]:
    """Blocks no batch can fill the same way, and rounds that cannot end or decide nothing."""
    first = config.get("blocks", {}).get("first")
    if first is not None:
        uneven = sorted(size for size in batch_sizes(config) if first % size)
        if uneven:
            yield (f"blocks.first: {first} prompts is not a multiple of batch size {uneven[0]}: a block would cut "
                   f"a batch, whose prompts are then decoded with others than in a cell made at once (use "
                   f"{math.lcm(first, *uneven)})")
    budget = (config.get("rounds") or {}).get("budget")
    if isinstance(budget, str) and not re.fullmatch(BUDGET_PATTERN.strip("^$"), budget):
        yield f"rounds.budget: {budget!r} is no time such as '10 min', '90 s' or '2 h'"
    if rounds_on(config):
        for name in config["benchmarks"]:
            if max_prompts(config, name) is None:
                yield (f"rounds: benchmark {name!r} states no n and rounds.max_prompts is not set: rounds need a "
                       f"maximum (set either)")


def worst_case(config: dict[str, Any], cells: list[Cell]) -> dict[str, int]:
    """What a study generates at most: its blocks and prompts, and its rounds (every block
    of every cell, as when no comparison decides before its maximum)."""
    blocks = [blocks_of(config, cell.benchmark) for cell in cells]
    prompts = sum((max_prompts(config, cell.benchmark) or 0) for cell in cells)
    return {"blocks": sum(map(len, blocks)), "prompts": prompts, "rounds": max(map(len, blocks), default=0)}


def plan_lines(config: dict[str, Any], cells: list[Cell]) -> list[str]:
    """What `tokenflip plan` says of blocks and rounds: each benchmark's blocks, and the worst
    case of a study of rounds."""
    if not in_blocks(config):
        return []
    lines = [f"blocks {name}: " + ", ".join(f"[{first}, {'end' if end is None else end})"
                                            for first, end in blocks_of(config, name)) for name in config["benchmarks"]]
    worst = worst_case(config, cells)
    if rounds_on(config):
        lines.append(f"rounds: at most {worst['rounds']}, {worst['blocks']} blocks, {worst['prompts']} prompts in all "
                     f"(every comparison undecided to its maximum); decided comparisons stop after the round that "
                     f"decides them")
        if (budget := budget_seconds(config)) is not None:
            lines.append(f"rounds: a budget of {config['rounds']['budget']} ({budget:g} s) of the judged cells' "
                         f"generate jobs: no round starts that their own measured seconds a prompt predict would "
                         f"pass it; what is open then stops, undecided at the budget")
    return lines
