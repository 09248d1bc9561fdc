"""A finished run's record of itself, for the docs: the machine it ran on (the CPU's name and
the extensions that select its 16-bit kernels, or the GPU), its cells and pairs, each judged
comparison's one verdict with the prompts it took, and the pipeline's wall time from
Snakemake's own log. The README's and docs' figures of a run are written from such a record,
kept in `docs/records/`, and a test checks the figures against it, so the docs cannot say
what the run did not."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")


def pipeline_seconds(log: Path) -> float | None:
    """Seconds from the first to the last time stamp of a Snakemake log (None: fewer than two)."""
    stamps = [datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y")
              for line in log.read_text(errors="replace").splitlines() if (m := STAMP.match(line.strip()))]
    return (stamps[-1] - stamps[0]).total_seconds() if len(stamps) > 1 else None


JOB = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")
JOB_ID = re.compile(r"^jobid: (\d+)$")
FINISHED = re.compile(r"^Finished jobid: (\d+)")


def job_seconds(log: Path) -> dict[str, list[float]]:
    """Each rule's jobs' wall times, from a Snakemake log: from the stamp before a job's start
    to the stamp before its "Finished jobid" line (whole seconds, as Snakemake stamps)."""
    stamp, pending, started, out = None, None, {}, {}
    for line in log.read_text(errors="replace").splitlines():
        line = line.strip()
        if m := STAMP.match(line):
            stamp = datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y")
        elif m := JOB.match(line):
            pending = (m.group(1), stamp)
        elif (m := JOB_ID.match(line)) and pending:
            started[m.group(1)], pending = pending, None
        elif (m := FINISHED.match(line)) and m.group(1) in started:
            rule, start = started.pop(m.group(1))
            out.setdefault(rule, []).append((stamp - start).total_seconds())
    return out


def generation_seconds(cells_dir: Path) -> float:
    """The wall time the run's cells spent decoding their prompts, as each cell file records
    it (a cell made in blocks: its blocks' sum)."""
    from tokenflip.core.storage import read_metadata

    return float(sum(read_metadata(path).get("wall_seconds") or 0.0 for path in cells_dir.rglob("*.parquet")))


def run_record(summary_dir: Path, log: Path | None = None) -> dict[str, Any]:
    """What the run's summary (and its Snakemake log, where given) says of the run."""
    from tokenflip.core.storage import read_table
    from tokenflip.report.common import first_runs
    from tokenflip.report.page import _environment, cpu_features

    pairs = read_table(summary_dir / "pairs.parquet", kind="summary")[0].to_pandas()
    cells = read_table(summary_dir / "cells.parquet", kind="summary")[0].to_pandas()
    environment = _environment(read_table(summary_dir / "environment.parquet", kind="summary")[0].to_pandas())
    device = environment.get("device", {})
    judged = first_runs(pairs)
    judged = judged[(judged["status"] == "done") & judged["comparisons_tested"].notna()]
    return {
        "device": {"name": device.get("name"), "type": device.get("type"),
                   "extensions": {name: has for name, has in cpu_features(device)}},
        "cells": int(len(cells)), "pairs": int(len(pairs)),
        "pipeline_seconds": pipeline_seconds(log) if log else None,
        **(_shares(summary_dir.parent / "cells", log) if log else {}),
        "comparisons": [{"comparison": f"{r['axis']}: {r['a']} vs {r['b']}", "verdict": r["verdict"],
                         "prompts": int(r["prompts_decided"]), "round": None if r["round_decided"] is None
                         or r["round_decided"] != r["round_decided"] else int(r["round_decided"]),
                         "parted": int(r["n_diverged"]), "n": int(r["n_prompts"]),
                         "low": round(float(r["interval_low"]), 4), "high": round(float(r["interval_high"]), 4)}
                        for r in judged.sort_values(["axis", "a", "b"]).to_dict("records")],
        "floors": [{"comparison": f"{r['axis']}: {r['a']} vs {r['b']}", "parted": int(r["n_diverged"]),
                    "n": int(r["n_prompts"])} for r in pairs[pairs["axis"] == "repeat"].to_dict("records")],
    }


def _shares(cells_dir: Path, log: Path) -> dict[str, Any]:
    """Where the jobs' time went: every rule's job seconds, and the share spent decoding."""
    jobs = job_seconds(log)
    total = sum(map(sum, jobs.values()))
    decoding = generation_seconds(cells_dir)
    return {"job_seconds": {rule: sum(times) for rule, times in sorted(jobs.items())},
            "jobs": {rule: len(times) for rule, times in sorted(jobs.items())},
            "decoding_seconds": round(decoding, 1),
            "generation_share": round(decoding / total, 3) if total else None}
