"""What every engine's cell writes, whichever engine decoded it: one row per prompt (ids,
per-step statistics, decoded text, score) and the cell's Parquet file with its provenance.
Engines hand over their decoded batches (`DecodedBatch`); the cell runner scores them here
(`score_batches`) and writes the file here, once for every engine."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
from tqdm import tqdm

from tokenflip.core import storage
from tokenflip.core.specs import CellJob
from tokenflip.run import runtime
from tokenflip.run.benchmarks import Benchmark, Item
from tokenflip.run.decode import BatchResult, left_pad, stop_criterion
from tokenflip.run.engines.base import DecodedBatch
from tokenflip.run.finite import require_finite
from tokenflip.run.sampling import make_selector


def score_batches(job: CellJob, bench: Benchmark, batches: list[DecodedBatch], tokenizer) -> list[dict[str, Any]]:
    """Every prompt's row, scored, in the order the engine decoded them."""
    rows: list[dict[str, Any]] = []
    first = job.prompts[0] if job.prompts is not None else 0  # a block's first prompt
    for index, batch in enumerate(batches):
        rows += records(job, bench, batch.items, index, first + len(rows), batch.prompts, batch.result, tokenizer,
                        batch.cpu_seconds)
    return rows


def records(job: CellJob, bench: Benchmark, batch: list[Item], batch_index: int, first_index: int,
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


# (left-padded ids, mask, token selector, stop criterion) -> the batch decoded
BatchDecoder = Callable[[Any, Any, Any, Any], BatchResult]


def decode_batches(job: CellJob, tokenizer, bench: Benchmark, decode_batch: BatchDecoder, pad: int,
                   progress: bool = True, device="cpu", observed: dict[str, Any] | None = None) -> list[DecodedBatch]:
    """Decode every item of the benchmark in fixed batches of the cell's batch size, each
    batch through `decode_batch` (the cell's engine; sampling draws on `device`). The token
    selector that ran goes into `observed["selector"]` (what proves the decoding axis)."""
    cell = job.cell
    items = bench.items()
    stop = stop_criterion(tokenizer, bench.stop)
    decoded: list[DecodedBatch] = []
    batches = [items[i:i + cell.batch_size] for i in range(0, len(items), cell.batch_size)]
    for batch in tqdm(batches, desc=cell.id, unit="batch", disable=not progress):
        prompts = [runtime.encode_prompt(tokenizer, bench, item) for item in batch]
        ids, mask = left_pad(prompts, pad)
        select = make_selector(job.decoding, [item.id for item in batch], job.run_seed, device)
        if observed is not None:
            observed["selector"] = select.__name__
        cpu_start = time.process_time()
        result = decode_batch(ids, mask, select, stop)
        decoded.append(DecodedBatch(batch, prompts, result, time.process_time() - cpu_start))
    return decoded


def model_record(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: manifest.get(k) for k in ("spec", "architecture", "num_parameters", "weights_sha256",
                                         "tokenizer_sha256", "source_digest", "resolved_revision",
                                         "tokenizer_only", "tokenizer_from")}


def write_cell(job: CellJob, bench: Benchmark, rows: list[dict], eos: list[int], pad: int,
               provenance_of_engine: dict[str, Any], out_path, unrecorded: tuple[str, ...] = ()) -> dict[str, Any]:
    """The cell's table and its provenance, written atomically, once every number the engine
    recorded is finite (`unrecorded`: the per-step statistics an engine does not return,
    stored as NaN). Time is summed over the cell's batches (every row of a batch records the
    batch's time)."""
    cell = job.cell
    require_finite(rows, cell.id, skip=unrecorded)
    table = storage.cell_table(rows, job.record_top_k)
    first_rows = list({r["batch_index"]: r for r in reversed(rows)}.values())
    metadata = {
        "kind": "cell",
        "cell": cell.as_dict(),
        "cell_id": cell.id,
        "settings": job.to_json(),
        "benchmark": bench.describe(),
        "eos_token_ids": eos,
        "pad_token_id": pad,
        **provenance_of_engine,
        "wall_seconds": float(sum(r["latency_s"] for r in first_rows)),
        "cpu_seconds": float(sum(r["cpu_s"] for r in first_rows)),
        "generated_tokens": int(sum(r["n_tokens"] for r in rows)),
        "job_seconds": process_seconds(),
    }
    return storage.write_cell_file(table, out_path, metadata)


# The job's own process where another one runs it (a warm process holding its load,
# `run.shared_loads`): the job's seconds are counted from that process's start.
JOB_PROCESS: int | None = None


def process_seconds() -> float:
    """Wall seconds since the job's process started, its interpreter's start and model load
    included (what a job of this cell cost; a round's time budget adds them up), from the
    kernel's record of the process; since this module was imported where there is none."""
    from tokenflip.core.scheduler import process_age

    age = process_age(JOB_PROCESS or "self")
    return time.perf_counter() - _IMPORTED if age is None else age


_IMPORTED = time.perf_counter()
