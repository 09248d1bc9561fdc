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
    return _write_cell_file(table, out_path, metadata)


def process_seconds() -> float:
    """Wall seconds since this process started, its interpreter's start and model load included
    (what a job of this cell cost; a round's time budget adds them up), from the kernel's
    record of the process; since this module was imported where there is none."""
    import os

    try:
        with open("/proc/self/stat") as fh:
            started = int(fh.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as fh:
            return max(0.0, float(fh.read().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


def _write_cell_file(table, out_path, metadata: dict[str, Any]) -> dict[str, Any]:
    """A cell's table written with the digests of its data, which every reader recomputes."""
    metadata = {**metadata, "token_stream_sha256": storage.token_stream_digest(table),
                "logits_sha256": storage.logits_digest(table)}
    storage.write_table(table, out_path, metadata)
    return metadata


class BlockError(ValueError):
    """A cell's blocks cannot be joined: one was made with other settings, elsewhere, or holds
    other prompts than its name says."""


# What must be the same in every block of one cell: the model, the software, the machine and
# its determinism. The engine's record may differ by block (an engine sizes its context from the
# prompts it is given; a server's fingerprints change): the cell keeps its first block's.
_BLOCK_SAME = ("model", "environment.software", "environment.device", "environment.determinism")


def _inputs(meta: dict[str, Any]) -> dict[str, Any]:
    """What a block was made from: its benchmark as described (its source's path and digest,
    the order drawn, the prompt format), less which block of it and how far it reaches."""
    return {k: v for k, v in meta.get("benchmark", {}).items() if k not in ("block", "n", "n_requested")}


def inputs_digest(meta: dict[str, Any]) -> str:
    """The digest of a block's inputs (`_inputs`), kept with each block of a joined cell."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(_inputs(meta), sort_keys=True, default=str).encode()).hexdigest()


def _check_same_inputs(path, meta: dict[str, Any], first_path, first_meta: dict[str, Any]) -> None:
    """Refuse a block made from another version of the cell's inputs than its first block (a
    prompts file edited between two rounds), naming the block, the field and the file."""
    from tokenflip.core.provenance import flatten_provenance

    own, theirs = flatten_provenance(_inputs(first_meta)), flatten_provenance(_inputs(meta))
    differ = sorted(k for k in set(own) | set(theirs) if own.get(k) != theirs.get(k))
    if differ:
        source = theirs.get("source.path") or theirs.get("source.file") or theirs.get("source.hub") or "its source"
        raise BlockError(f"{path}: made from other inputs than the cell's first block ({first_path}): benchmark "
                         f"{differ[0]} differs ({source} changed between them?); blocks of one cell come from one "
                         f"version of its prompts (remove the later blocks to make them again)")


def join_blocks(job: CellJob, blocks: list[tuple[str, int, int | None]], out_path) -> dict[str, Any]:
    """The cell's file from its blocks ((path, first, end), in order): each block must be the
    cell's job for its prompts (`CellJob.block`), hold exactly them, and have been made with
    the same model, software and machine as the first (a block made after an upgrade is not
    joined to older ones). Its digests are the joined table's; the blocks' are kept."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from tokenflip.core.provenance import flatten_provenance

    tables, metas, batches = [], [], 0
    for path, first, end in blocks:
        table, meta = storage.read_cell(path)
        want = job.block(first, end).to_json()
        if meta.get("settings") != want:
            raise BlockError(f"{path}: made with other settings than block [{first}, {end}) of cell {job.cell.id} "
                             f"(remove it to make it again)")
        index = table.column("prompt_index").to_pylist()
        if index != list(range(first, first + len(index))) or (end is not None and first + len(index) != end):
            held = f"prompts {index[0]} to {index[-1]}, {len(index)} rows" if index else "no prompts"
            raise BlockError(f"{path}: holds {held}, not [{first}, {end}) "
                             f"(remove it to make it again)")
        if metas:
            own, theirs = (({k: v for k, v in flatten_provenance(m).items()
                             if any(k == key or k.startswith(key + ".") for key in _BLOCK_SAME)})
                           for m in (metas[0], meta))
            differ = sorted(k for k in set(own) | set(theirs) if own.get(k) != theirs.get(k))
            if differ:
                raise BlockError(f"{path}: made with {differ[0]} = {theirs.get(differ[0])!r}, but the cell's first "
                                 f"block ({blocks[0][0]}) with {own.get(differ[0])!r}: blocks of one cell come from "
                                 f"one model, software and machine (remove the later blocks to make them again)")
            _check_same_inputs(path, meta, blocks[0][0], metas[0])
        tables.append(table.set_column(table.schema.get_field_index("batch_index"), "batch_index",
                                       pc.add(table.column("batch_index"), batches)))
        batches += len(set(table.column("batch_index").to_pylist()))
        metas.append(meta)
    table = pa.concat_tables(tables)
    described = {k: v for k, v in metas[-1]["benchmark"].items() if k != "block"}
    metadata = {
        **metas[0],
        "settings": job.to_json(),
        "benchmark": described,
        "observed": {**metas[0].get("observed", {}), "prompts": table.num_rows,
                     "largest_batch": max(m.get("observed", {}).get("largest_batch", 0) for m in metas)},
        "blocks": [{"prompts": [first, end], "file": str(path).rsplit("/", 1)[-1],
                    "token_stream_sha256": m["token_stream_sha256"], "inputs_sha256": inputs_digest(m)}
                   for (path, first, end), m in zip(blocks, metas)],
        "wall_seconds": float(sum(m["wall_seconds"] for m in metas)),
        "cpu_seconds": float(sum(m["cpu_seconds"] for m in metas)),
        "generated_tokens": int(sum(m["generated_tokens"] for m in metas)),
        "job_seconds": float(sum(m.get("job_seconds") or 0.0 for m in metas)),
    }
    return _write_cell_file(table, out_path, metadata)
