"""How many prompts the anytime-valid paired procedure takes to decide a comparison
(`tokenflip.analysis.sequential`), beside the fixed n the exact fixed-n rule would need for
80% power on the same comparison (`analysis.paired.prompts_for_power`): a rate of 0%, 2% and
10% against a floor of 0, and 10% against a floor of 10%, a ±5 pp margin, 200 simulated
sequences each at fixed seeds (medians and the 90th percentile; sequences stopped at 5,000).
Counts of prompts, not time: the figures do not depend on the machine.

  .venv/bin/python perf/sequential_prompts.py [--quick] [--sims 200]
"""

from __future__ import annotations

import argparse

import numpy as np

from tokenflip.analysis.paired import prompts_for_power
from tokenflip.analysis.sequential import decided

CASES = [(0.0, 0.0), (0.02, 0.0), (0.10, 0.0), (0.10, 0.10)]
MOST = 5000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="40 sequences a case")
    args = parser.parse_args()
    if args.quick:
        args.sims = 40
    medians = []
    print(f"{'rate':>6} {'floor':>6} {'median':>7} {'p90':>6} {'decided as':<44} fixed n (80% power, changes)")
    for rate, floor in CASES:
        rng = np.random.default_rng(int(rate * 1000) * 7 + int(floor * 1000))
        took, labels = [], {}
        for _ in range(args.sims):
            d = (rng.random(MOST) < rate).astype(int) - (rng.random(MOST) < floor).astype(int)
            label, n = decided(d, margin=0.05)
            took.append(n or MOST)
            labels[label or "undecided at 5,000"] = labels.get(label or "undecided at 5,000", 0) + 1
        fixed = prompts_for_power(rate, floor) if rate > floor else None
        shown = ", ".join(f"{k} {v}" for k, v in sorted(labels.items(), key=lambda kv: -kv[1]))
        medians.append(f"{rate:.0%} vs {floor:.0%}: {int(np.median(took))}")
        print(f"{rate:6.0%} {floor:6.0%} {int(np.median(took)):7d} {int(np.percentile(took, 90)):6d} {shown:<44} "
              f"{fixed if fixed else '–'}")

    print(f"summary: median prompts to a decision ({args.sims} sequences a case): " + "; ".join(medians))


if __name__ == "__main__":
    main()
