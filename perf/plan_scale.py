"""Planning at the size bound and past it: how long validation, listing the cells and
pairing them take for 10^4 cells (the default `limits.max_cells`) and 10^5 (the bound
raised in the config), and how long a study far past the bound takes to be refused
(counted, never listed). Ratios in one process: the 10^5 plan should take about ten times
the 10^4 plan (linear), and the refusal of 10^7 cells far less than either.

  .venv/bin/python perf/plan_scale.py
"""

from __future__ import annotations

import time

from tokenflip.study import config as cfg
from tokenflip.study.plan import expand_cells, expand_pairs


def study(models: int, batch_sizes: int, max_cells: int) -> dict:
    """models x 2 benchmarks x fp32/bf16 x cache on/off x batch sizes x threads 1/2 (16 cells per
    model and batch size), compared on three axes."""
    return {
        "run": "plan-scale", "limits": {"max_cells": max_cells},
        "models": {f"m{i}": {"source": "random", "architecture": "llama", "seed": i} for i in range(models)},
        "benchmarks": {"a": {"kind": "arithmetic", "n": 1}, "b": {"kind": "arithmetic", "n": 1, "seed": 1}},
        "grids": [{"precision": ["fp32", "bf16"], "cache": ["on", "off"], "batch_size": list(range(1, batch_sizes + 1)),
                   "threads": [1, 2]}],
        "comparisons": [{"axis": "cache", "a": "on", "b": "off"}, {"axis": "precision", "a": "fp32", "b": "bf16"},
                        {"axis": "threads", "a": 1, "b": 2}],
    }


def timed(models: int, batch_sizes: int, max_cells: int) -> tuple[int, int, float]:
    start = time.perf_counter()
    config = cfg.validate(study(models, batch_sizes, max_cells), source="plan-scale", check_data=False)
    cells = expand_cells(config)
    pairs = expand_pairs(config, cells)
    return len(cells), len(pairs), time.perf_counter() - start


def main() -> None:
    timed(1, 1, 10_000)  # the first validation imports torch (random models' sizes): not part of planning
    results = {}
    for label, (models, sizes, bound) in {"1e4": (25, 25, 10_000), "1e5": (125, 50, 100_000)}.items():
        cells, pairs, seconds = timed(models, sizes, bound)
        results[label] = seconds
        print(f"{cells:>7,} cells, {pairs:>7,} pairs: validated, listed and paired in {seconds:.2f} s")
    start = time.perf_counter()
    try:
        cfg.validate(study(625, 1000, 10_000), source="plan-scale", check_data=False)
    except cfg.ConfigError as exc:
        refused = time.perf_counter() - start
        print(f"10,000,000 cells refused in {refused:.3f} s: {str(exc).splitlines()[-1].strip()}")
    print(f"ratio 1e5 / 1e4: {results['1e5'] / results['1e4']:.1f} (linear: 10)")


if __name__ == "__main__":
    main()
