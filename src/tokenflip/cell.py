"""One cell, end to end: load the prepared model in the cell's precision, prompt with the
benchmark in fixed batches, decode, score, and write the cell's Parquet file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from . import provenance, runtime, storage
from .benchmarks import Benchmark, Item, build_benchmark
from .caches import CacheForm, Prefix, shared_prefix
from .decode import BatchResult, decode, left_pad, stop_criterion
from .interventions import apply_to_model, weights_precision
from .jobs import CellJob
from .models import load_prepared, weights_record
from .sampling import make_selector


def _records(job: CellJob, bench: Benchmark, batch: list[Item], batch_index: int, first_index: int,
             prompts: list[list[int]], result: BatchResult, tokenizer, cpu_seconds: float) -> list[dict[str, Any]]:
    """One row per prompt of a decoded batch: tokens, per-step statistics, score."""
    k = job.record_top_k
    rows = []
    for offset, (item, prompt, gen) in enumerate(zip(batch, prompts, result.generations)):
        text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        score = bench.score(item, text, finished=gen.finish_reason != "length")
        rows.append({
            "prompt_index": first_index + offset, "prompt_id": item.id, "batch_index": batch_index,
            "prompt_ids": prompt, "token_ids": gen.token_ids,
            "top_ids": np.asarray(gen.top_ids, dtype=np.int32).reshape(-1, k),
            "top_logits": np.asarray(gen.top_logits, dtype=np.float32).reshape(-1, k),
            "margin": gen.margin, "logsumexp": gen.logsumexp, "entropy": gen.entropy,
            "intervened": gen.intervened, "n_tokens": len(gen.token_ids),
            "finish_reason": gen.finish_reason, "text": text, "gold": item.gold,
            "extracted": score.extracted, "correct": score.correct, "answer_rule": score.rule,
            "verdict": score.verdict,
            "latency_s": result.wall_seconds, "cpu_s": cpu_seconds,
        })
    return rows


def generate_records(job: CellJob, model, tokenizer, bench: Benchmark, progress: bool = True,
                     form: CacheForm = CacheForm(), prefix: Prefix | None = None) -> list[dict]:
    """Decode every item of the benchmark in fixed batches of the cell's batch size, with
    the cell's cache form (and, with a prefix cache, every prompt from the shared prefix)."""
    cell = job.cell
    items = bench.items()
    eos, pad = runtime.special_ids(model, tokenizer)
    stop = stop_criterion(tokenizer, bench.stop)
    records: list[dict[str, Any]] = []
    batches = [items[i:i + cell.batch_size] for i in range(0, len(items), cell.batch_size)]
    for b, batch in enumerate(tqdm(batches, desc=cell.id, unit="batch", disable=not progress)):
        prompts = [runtime.encode_prompt(tokenizer, bench, item) for item in batch]
        ids, mask = left_pad(prompts, pad)
        select = make_selector(job.decoding, [item.id for item in batch], job.run_seed, model.device)
        cpu_start = time.process_time()
        result = decode(model, ids, mask, max_new_tokens=job.max_new_tokens, use_cache=cell.cache == "on",
                        eos_token_ids=eos, pad_token_id=pad, record_top_k=job.record_top_k, select=select,
                        stop=stop, form=form, prefix=prefix)
        cpu = time.process_time() - cpu_start
        records += _records(job, bench, batch, b, len(records), prompts, result, tokenizer, cpu)
    return records


def shared_prompt_prefix(form: CacheForm, model, tokenizer, bench: Benchmark) -> Prefix | None:
    """With a prefix cache, the longest prefix all the benchmark's prompts share (the
    few-shot exemplars, the system turn), its cache filled once (None when they share none)."""
    if not form.prefix_cache:
        return None
    common = shared_prefix([runtime.encode_prompt(tokenizer, bench, item) for item in bench.items()])
    return form.prefix(model, common) if common else None


def run_cell(job: CellJob, model_dir: str | Path, out_path: str | Path, progress: bool = True) -> dict[str, Any]:
    """Generate the cell `job` describes (see `plan.cell_job`) into `out_path`."""
    if not isinstance(job, CellJob):
        job = CellJob.from_json(job)
    cell = job.cell
    runtime.prepare_process(job.run_seed, job.threads, cell.deterministic)
    bench = build_benchmark(cell.benchmark, job.benchmark)
    model, tokenizer, manifest = load_prepared(model_dir, weights_precision(job.intervention, cell.precision),
                                               job.device, cell.attention)
    model = apply_to_model(model, job.intervention,
                           lambda precision: load_prepared(model_dir, precision, job.device, cell.attention)[0])
    form = CacheForm.of(cell)
    prefix = shared_prompt_prefix(form, model, tokenizer, bench)
    records = generate_records(job, model, tokenizer, bench, progress, form, prefix)
    table = storage.cell_table(records, job.record_top_k)
    eos, pad = runtime.special_ids(model, tokenizer)
    first_rows = records[::cell.batch_size]
    metadata = {
        "kind": "cell",
        "cell": cell.as_dict(),
        "cell_id": cell.id,
        "settings": job.to_json(),
        "model": {**{k: manifest.get(k) for k in ("spec", "architecture", "num_parameters", "weights_sha256",
                                                  "tokenizer_sha256", "source_digest", "resolved_revision")},
                  "weights": weights_record(manifest, weights_precision(job.intervention, cell.precision))},
        "benchmark": bench.describe(),
        "eos_token_ids": eos,
        "pad_token_id": pad,
        "environment": provenance.environment(model.device),
        "cache_form": {**form.describe(model.config.get_text_config(decoder=True)),
                       "prefix_tokens": len(prefix.ids) if prefix else 0},
        "token_stream_sha256": storage.token_stream_digest(table),
        "logits_sha256": storage.logits_digest(table),
        "wall_seconds": float(sum(r["latency_s"] for r in first_rows)),
        "cpu_seconds": float(sum(r["cpu_s"] for r in first_rows)),
        "generated_tokens": int(sum(r["n_tokens"] for r in records)),
    }
    storage.write_table(table, out_path, metadata)
    return metadata
