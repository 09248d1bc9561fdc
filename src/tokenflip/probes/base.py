"""What every probe shares: the `Probe` description a registry entry holds, the set-up of a
probe job (seed, threads, prompt subset) and writing its tables with one provenance."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pyarrow as pa

from .. import runtime, storage
from ..benchmarks import Benchmark, Item, build_benchmark
from ..jobs import ProbeJob

# Keys every probe entry of a config takes.
COMMON_OPTIONS: dict[str, Any] = {
    "prompts": {"type": "integer", "minimum": 1, "default": 4,
                "description": "run on the first N prompts of each benchmark"},
    "max_new_tokens": {"type": "integer", "minimum": 1,
                       "description": "default: the benchmark's max_new_tokens"},
    "models": {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "string"},
               "description": "run for these models only (default: all)"},
    "benchmarks": {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "string"},
                   "description": "run on these benchmarks only (default: all)"},
}


@dataclass(frozen=True)
class Probe:
    """One mechanism probe: a job per model × benchmark writes `tables` (one Parquet file
    each) from `run(job, model_dir, out_dir)`. `options` is the JSON schema of its config
    keys besides COMMON_OPTIONS (defaults included); the summary concatenates each table
    over models and benchmarks as `<summary_prefix>_<table>`, reduced by `aggregate[table]`
    where given (per-layer tables are large)."""

    name: str
    summary: str
    tables: tuple[str, ...]
    run: Callable[[ProbeJob, str | Path, str | Path], dict]
    summary_prefix: str
    options: dict = field(default_factory=dict)
    aggregate: dict[str, Callable[[pd.DataFrame], pd.DataFrame]] = field(default_factory=dict)
    # Raise when the tables' columns or meaning change: older tables are then made again.
    version: int = 1

    def summary_tables(self) -> list[str]:
        return [f"{self.summary_prefix}_{table}" for table in self.tables]


def setup(job: ProbeJob) -> tuple[Benchmark, list[Item]]:
    """Seed, thread count and the prompt subset a probe job runs on."""
    runtime.prepare_process(job.run_seed, job.threads)
    bench = build_benchmark(job.benchmark_name, job.benchmark)
    return bench, bench.items()[: job.prompts]


def run_over_prompts(job: ProbeJob, model_dir: str | Path, out_dir: str | Path, tables: tuple[str, ...],
                     variants: list[tuple[dict[str, Any], tuple[str, ...]]],
                     probe_one: Callable[..., dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """The loop every replay probe runs: for each variant (the columns it adds to every row,
    and the precisions to load the model in), load those models, then for each prompt of
    the subset call `probe_one(models, prompt, eos, pad, stop)` (`stop`: the benchmark's stop
    sequences, so that a free replay ends where the cell ended) and collect its tables;
    write them with one provenance and return it."""
    from ..decode import stop_criterion
    from ..models import load_prepared

    bench, items = setup(job)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in tables}
    meta = None
    for columns, precisions in variants:
        loaded = [load_prepared(model_dir, precision, job.device) for precision in precisions]
        models = [model for model, _, _ in loaded]
        _, tokenizer, manifest = loaded[0]
        meta = meta or probe_metadata(job, manifest, bench, models[0].device)
        eos, pad = runtime.special_ids(models[0], tokenizer)
        stop = stop_criterion(tokenizer, bench.stop)
        for item in items:
            result = probe_one(models, runtime.encode_prompt(tokenizer, bench, item), eos, pad, stop)
            for name in tables:
                rows[name].extend({**columns, "prompt_id": item.id, **r} for r in result[name])
        del loaded, models
    write_tables(out_dir, rows, meta)
    return meta


def write_tables(out_dir: str | Path, rows: dict[str, list[dict[str, Any]]], meta: dict[str, Any]) -> None:
    for name, records in rows.items():
        table = pa.Table.from_pandas(pd.DataFrame(records), preserve_index=False)
        storage.write_table(table, Path(out_dir) / f"{name}.parquet", meta)


def probe_metadata(job: ProbeJob, manifest: dict | None, bench: Benchmark, device) -> dict[str, Any]:
    """The provenance every table of a probe job carries."""
    from .. import provenance

    return {"kind": "probe", "probe": job.probe, "settings": job.to_json(), "model": manifest,
            "benchmark": bench.describe(), "environment": provenance.environment(device)}
