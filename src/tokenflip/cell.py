"""One cell, end to end: the cell's engine (`engines`) decodes the benchmark's prompts,
and `cell_output` scores them and writes the cell's Parquet file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import engines, runtime
from .benchmarks import build_benchmark
from .jobs import CellJob


def run_cell(job: CellJob, model_dir: str | Path, out_path: str | Path, progress: bool = True) -> dict[str, Any]:
    """Generate the cell `job` describes (see `plan.cell_job`) into `out_path`."""
    if not isinstance(job, CellJob):
        job = CellJob.from_json(job)
    cell = job.cell
    runtime.prepare_process(job.run_seed, job.threads, cell.deterministic)
    bench = build_benchmark(cell.benchmark, job.benchmark)
    return engines.engine(cell.engine).run(job, bench, model_dir, out_path, progress)
