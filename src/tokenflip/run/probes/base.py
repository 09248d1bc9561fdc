"""What every probe shares: the `Probe` description a registry entry holds, the set-up of a
probe job (seed, threads, prompt subset) and writing its tables with one provenance."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
import pyarrow as pa

from tokenflip.core import storage
from tokenflip.core.specs import ProbeJob
from tokenflip.run import runtime
from tokenflip.run.benchmarks import Benchmark, Item, build_benchmark

# Keys every probe entry of a config takes.
COMMON_OPTIONS: dict[str, Any] = {
    "prompts": {"type": "integer", "minimum": 1, "default": 4,
                "description": "run on N prompts of each benchmark (see `select`)"},
    "select": {"enum": ["diverged", "first"], "default": "diverged",
               "description": "diverged: half of the N prompts from those that diverged in the pairs the probe "
                              "explains (the first ones), as many from those that agreed, the rest from the other "
                              "group where one runs short; first: the benchmark's first N prompts"},
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
    run: Callable[..., dict]  # (job, model_dir, out_dir, pair_files) -> provenance
    summary_prefix: str
    # The pairs whose results the probe explains, given its options: a test of a pair's
    # compared axis and values (the plan adds: every other axis at its default).
    explains: Callable[[dict], Callable[[Any], bool]] = lambda options: (lambda pair: False)
    options: dict = field(default_factory=dict)
    aggregate: dict[str, Callable[[pd.DataFrame], pd.DataFrame]] = field(default_factory=dict)
    # Raise when the tables' columns or meaning change: older tables are then made again.
    version: int = 1

    def summary_tables(self) -> list[str]:
        return [f"{self.summary_prefix}_{table}" for table in self.tables]


def pair_agreement(job: ProbeJob, pair_files: Sequence[str | Path]) -> dict[str, bool]:
    """Per prompt, whether it agreed in every pair the job explains (read from the pair
    files, whose data digests are checked; a file of another pair is refused)."""
    agreement: dict[str, bool] = {}
    for path in pair_files:
        table, meta = storage.read_table(path, kind="pair")
        if meta.get("pair", {}).get("id") not in job.explains:
            raise storage.StorageError(f"{path}: holds pair {meta.get('pair', {}).get('id')!r}, which this probe "
                                       f"job does not explain ({job.explains})")
        for pid, same in zip(table.column("prompt_id").to_pylist(), table.column("identical").to_pylist()):
            agreement[pid] = agreement.get(pid, True) and bool(same)
    return agreement


def choose_prompts(items: list[Item], n: int, agreement: dict[str, bool] | None) -> list[tuple[Item, str]]:
    """The prompts a probe traces, each with why: with pair results, the first prompts
    that diverged (up to half of n, rounded up) and as many that agreed, the other group
    filling in where one runs short, in benchmark order; without, the first n."""
    if not agreement:
        return [(item, "first") for item in items[:n]]
    diverged = [i for i in items if agreement.get(i.id) is False]
    agreed = [i for i in items if agreement.get(i.id) is True]
    k = min(len(diverged), -(-n // 2))
    m = min(len(agreed), n - k)
    k = min(len(diverged), n - m)
    chosen = {i.id: "diverged" for i in diverged[:k]} | {i.id: "agreed" for i in agreed[:m]}
    return [(item, chosen[item.id]) for item in items if item.id in chosen]


def traced_prompts(job: ProbeJob, pair_files: Sequence[str | Path] = ()) -> tuple[Benchmark, list[tuple[Item, str]]]:
    """Seed, thread count and the prompts a probe job traces, each with why it was chosen."""
    runtime.prepare_process(job.run_seed, job.threads)
    bench = build_benchmark(job.benchmark_name, job.benchmark)
    agreement = pair_agreement(job, pair_files) if job.select == "diverged" else None
    return bench, choose_prompts(bench.items(), job.prompts, agreement)


def setup(job: ProbeJob, pair_files: Sequence[str | Path] = ()) -> tuple[Benchmark, list[Item]]:
    """Seed, thread count and the prompts a probe job traces (see `traced_prompts`)."""
    bench, chosen = traced_prompts(job, pair_files)
    return bench, [item for item, _ in chosen]


def run_over_prompts(job: ProbeJob, model_dir: str | Path, out_dir: str | Path, tables: tuple[str, ...],
                     variants: list[tuple[dict[str, Any], tuple[str, ...]]],
                     probe_one: Callable[..., dict[str, list[dict[str, Any]]]],
                     pair_files: Sequence[str | Path] = ()) -> dict[str, Any]:
    """The loop every replay probe runs: for each variant (the columns it adds to every row,
    and the precisions to load the model in), load those models, then for each prompt of
    the subset call `probe_one(models, prompt, eos, pad, stop)` (`stop`: the benchmark's stop
    sequences, so that a free replay ends where the cell ended) and collect its tables,
    each row with its prompt and why it was chosen (`chosen_as`: diverged or agreed in the
    explained pairs, or first); write them with one provenance and return it."""
    from tokenflip.models.prepare import load_prepared
    from tokenflip.run.decode import stop_criterion

    bench, items = traced_prompts(job, pair_files)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in tables}
    meta = None
    for columns, precisions in variants:
        loaded = [load_prepared(model_dir, precision, job.device) for precision in precisions]
        models = [model for model, _, _ in loaded]
        _, tokenizer, manifest = loaded[0]
        meta = meta or probe_metadata(job, manifest, bench, models[0].device)
        eos, pad = runtime.special_ids(models[0], tokenizer)
        stop = stop_criterion(tokenizer, bench.stop)
        for item, why in items:
            result = probe_one(models, runtime.encode_prompt(tokenizer, bench, item), eos, pad, stop)
            for name in tables:
                rows[name].extend({**columns, "prompt_id": item.id, "chosen_as": why, **r} for r in result[name])
        del loaded, models
    write_tables(out_dir, rows, meta)
    return meta


def write_tables(out_dir: str | Path, rows: dict[str, list[dict[str, Any]]], meta: dict[str, Any]) -> None:
    for name, records in rows.items():
        table = pa.Table.from_pandas(pd.DataFrame(records), preserve_index=False)
        storage.write_table(table, Path(out_dir) / f"{name}.parquet", meta)


def probe_metadata(job: ProbeJob, manifest: dict | None, bench: Benchmark, device) -> dict[str, Any]:
    """The provenance every table of a probe job carries."""
    from tokenflip.core import provenance

    return {"kind": "probe", "probe": job.probe, "settings": job.to_json(), "model": manifest,
            "benchmark": bench.describe(), "environment": provenance.environment(device)}
