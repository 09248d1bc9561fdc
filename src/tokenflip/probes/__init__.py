"""Mechanism probes: teacher-forced replays that explain why two cells diverged.

Helpers shared by every probe job: setting up the run (seed, threads, prompt subset) and
writing its tables with the same provenance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import torch

from .. import storage
from ..benchmarks import Benchmark, Item, build_benchmark
from ..cell import eos_ids, seed_everything


def setup(settings: dict[str, Any]) -> tuple[Benchmark, list[Item]]:
    """Seed, thread count and the prompt subset a probe job runs on."""
    seed_everything(int(settings["run_seed"]))
    if settings.get("threads"):
        torch.set_num_threads(int(settings["threads"]))
    bench = build_benchmark(settings["benchmark_name"], settings["benchmark"])
    return bench, bench.items()[: int(settings["prompts"])]


def special_ids(model, tokenizer) -> tuple[list[int], int]:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return eos_ids(model, tokenizer), pad


def write_tables(out_dir: str | Path, rows: dict[str, list[dict[str, Any]]], meta: dict[str, Any]) -> None:
    for name, records in rows.items():
        table = pa.Table.from_pandas(pd.DataFrame(records), preserve_index=False)
        storage.write_table(table, Path(out_dir) / f"{name}.parquet", meta)
