"""A finished run's record, for the docs (`tokenflip.report.record`): its machine, cells,
pairs, each comparison's verdict and the prompts it took, and the pipeline's wall time from
its Snakemake log; `--wall` adds a measured all-in time (a fresh clone's `make run`, say).

  .venv/bin/python perf/run_record.py results/default --log .snakemake/log/<newest>.snakemake.log \
      --wall 512 --out docs/records/default-<machine>.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenflip.report.record import run_record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the run's results directory (results/<run>)")
    parser.add_argument("--log", type=Path, help="its Snakemake log (default: the newest in .snakemake/log)")
    parser.add_argument("--wall", type=float, help="the all-in wall time measured around the run, in seconds")
    parser.add_argument("--out", type=Path, help="where to write the record (default: print it)")
    args = parser.parse_args()
    log = args.log or max(Path(".snakemake/log").glob("*.snakemake.log"), key=lambda p: p.stat().st_mtime)
    record = {**run_record(args.results / "summary", log), "all_in_seconds": args.wall}
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
