"""How many model loads a study's generation jobs cost, with each job loading its own model
and with loads shared (`tokenflip.run.shared_loads`), counted from its plan: every cell's
blocks (all of its rounds: the worst case, when no comparison is decided early), one job per
block; shared, one load per load setting in each round where the jobs of a round run one at a
time (one GPU) in the order of their priorities (`study.plan.job_priorities` keeps the jobs of
one load together), and one per job whose load is not shared (interventions, compiled steps,
other engines). On a GPU, where a 7B model's load is tens of seconds, the difference is the
time a study spends loading.

  .venv/bin/python perf/loads.py config/paper-precision.yaml config/paper-kv-cache.yaml
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from tokenflip.study.config import load
from tokenflip.study.plan import expand_cells, load_settings
from tokenflip.study.rounds import blocks_of, in_blocks


def loads(path: str) -> dict[str, int]:
    config = load(path)
    cells = expand_cells(config)
    jobs, unshared, per_round = 0, 0, defaultdict(set)
    for cell in cells:
        blocks = blocks_of(config, cell.benchmark) if in_blocks(config) else [(0, None)]
        jobs += len(blocks)
        settings = load_settings(cell)
        for number in range(len(blocks)):
            if settings is None:
                unshared += 1
            else:
                per_round[number].add(settings)
    shared = unshared + sum(len(s) for s in per_round.values())
    return {"cells": len(cells), "jobs": jobs, "load_settings": len({load_settings(c) for c in cells} - {None}),
            "loads_each_job": jobs, "loads_shared": shared}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+")
    for path in parser.parse_args().configs:
        n = loads(path)
        print(f"{path}: {n['cells']} cells, {n['jobs']} generation jobs, {n['load_settings']} load settings: "
              f"{n['loads_each_job']} loads with a load per job, {n['loads_shared']} shared "
              f"({n['loads_each_job'] / max(n['loads_shared'], 1):.1f}x fewer)")


if __name__ == "__main__":
    main()
