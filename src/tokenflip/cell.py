"""One cell, end to end: load the prepared model in the cell's precision, prompt with the
benchmark in fixed batches, decode, score, and write the cell's Parquet file."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from . import engines, provenance, runtime, storage
from .benchmarks import Benchmark, Item, build_benchmark
from .caches import CacheForm, Prefix, shared_prefix
from .decode import BatchResult, decode, generated_only, left_pad, stop_criterion
from .interventions import apply_to_model, weights_precision
from .jobs import CellJob
from .models import ModelError, load_prepared, load_tokenizer, read_manifest, sha256_file, weights_record
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


# (left-padded ids, mask, token selector, stop criterion) -> the batch decoded
BatchDecoder = Callable[[Any, Any, Any, Any], BatchResult]


def generate_records(job: CellJob, tokenizer, bench: Benchmark, decode_batch: BatchDecoder, pad: int,
                     progress: bool = True, device="cpu") -> list[dict]:
    """Decode every item of the benchmark in fixed batches of the cell's batch size, each
    batch through `decode_batch` (the cell's engine; sampling draws on `device`)."""
    cell = job.cell
    items = bench.items()
    stop = stop_criterion(tokenizer, bench.stop)
    records: list[dict[str, Any]] = []
    batches = [items[i:i + cell.batch_size] for i in range(0, len(items), cell.batch_size)]
    for b, batch in enumerate(tqdm(batches, desc=cell.id, unit="batch", disable=not progress)):
        prompts = [runtime.encode_prompt(tokenizer, bench, item) for item in batch]
        ids, mask = left_pad(prompts, pad)
        select = make_selector(job.decoding, [item.id for item in batch], job.run_seed, device)
        cpu_start = time.process_time()
        result = decode_batch(ids, mask, select, stop)
        cpu = time.process_time() - cpu_start
        records += _records(job, bench, batch, b, len(records), prompts, result, tokenizer, cpu)
    return records


def transformers_decoder(job: CellJob, model, eos: list[int], pad: int, form: CacheForm = CacheForm(),
                         prefix: Prefix | None = None) -> BatchDecoder:
    """tokenflip's decode loop over the transformers model, with the cell's cache form (and,
    with a prefix cache, every prompt from the shared prefix)."""

    def decode_batch(ids, mask, select, stop) -> BatchResult:
        return decode(model, ids, mask, max_new_tokens=job.max_new_tokens, use_cache=job.cell.cache == "on",
                      eos_token_ids=eos, pad_token_id=pad, record_top_k=job.record_top_k, select=select,
                      stop=stop, form=form, prefix=prefix)

    return decode_batch


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
    if cell.engine == engines.LLAMA_CPP:
        return _run_llama_cpp(job, bench, model_dir, out_path, progress)
    model, tokenizer, manifest = load_prepared(model_dir, weights_precision(job.intervention, cell.precision),
                                               job.device, cell.attention)
    model = apply_to_model(model, job.intervention,
                           lambda precision: load_prepared(model_dir, precision, job.device, cell.attention)[0])
    form = CacheForm.of(cell)
    prefix = shared_prompt_prefix(form, model, tokenizer, bench)
    eos, pad = runtime.special_ids(model, tokenizer)
    records = generate_records(job, tokenizer, bench, transformers_decoder(job, model, eos, pad, form, prefix), pad,
                               progress, model.device)
    provenance_of_engine = {
        "model": {**_model_record(manifest),
                  "weights": weights_record(manifest, weights_precision(job.intervention, cell.precision))},
        "environment": provenance.environment(model.device),
        "cache_form": {**form.describe(model.config.get_text_config(decoder=True)),
                       "prefix_tokens": len(prefix.ids) if prefix else 0},
        "engine": {"name": engines.TRANSFORMERS},
    }
    return _write_cell(job, bench, records, eos, pad, provenance_of_engine, out_path)


def _run_llama_cpp(job: CellJob, bench: Benchmark, model_dir, out_path, progress: bool) -> dict[str, Any]:
    """The cell through llama.cpp, on the GGUF file the model was prepared from (its digest
    checked against the one recorded at preparation)."""
    from transformers import GenerationConfig

    manifest = read_manifest(model_dir)
    path = engines.gguf_path(manifest["spec"])
    digest = sha256_file(path)
    if digest != manifest.get("source_digest"):
        raise ModelError(f"{path}: its digest {digest[:12]}… is not the one {model_dir} was prepared from "
                         f"({str(manifest.get('source_digest'))[:12]}…); prepare the model again")
    tokenizer = load_tokenizer(model_dir)
    eos, pad = runtime.special_ids(GenerationConfig.from_pretrained(str(model_dir)), tokenizer)
    longest = max(len(runtime.encode_prompt(tokenizer, bench, item)) for item in bench.items())
    # The job's threads as torch took them (generation.threads, else what Snakemake gave the job).
    engine = engines.LlamaCpp(path, job.cell.precision, longest + job.max_new_tokens,
                              job.threads or torch.get_num_threads())
    if engine.n_vocab != len(tokenizer):
        raise ModelError(f"{path}: llama.cpp reads {engine.n_vocab} tokens, the prepared tokenizer {len(tokenizer)}; "
                         f"their ids would not be the same tokens")

    def decode_batch(ids, mask, select, stop) -> BatchResult:
        return engine.decode(ids[0].tolist(), max_new_tokens=job.max_new_tokens, use_cache=job.cell.cache == "on",
                             eos_token_ids=eos, record_top_k=job.record_top_k, select=select,
                             stop=generated_only(stop, ids.shape[1]))

    records = generate_records(job, tokenizer, bench, decode_batch, pad, progress)
    described = engine.describe()
    provenance_of_engine = {
        "model": {**_model_record(manifest),
                  "weights": {"gguf": path.name, "gguf_sha256": digest, "file_type": described["file_type"]}},
        "environment": provenance.environment(torch.device("cpu")),
        "cache_form": {"impl": "llama.cpp"},  # llama.cpp's own KV cache (its type: engine.kv_cache_type)
        "engine": described,
    }
    return _write_cell(job, bench, records, eos, pad, provenance_of_engine, out_path)


def _model_record(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: manifest.get(k) for k in ("spec", "architecture", "num_parameters", "weights_sha256",
                                         "tokenizer_sha256", "source_digest", "resolved_revision")}


def _write_cell(job: CellJob, bench: Benchmark, records: list[dict], eos: list[int], pad: int,
                provenance_of_engine: dict[str, Any], out_path) -> dict[str, Any]:
    """The cell's table and its provenance, written atomically."""
    cell = job.cell
    table = storage.cell_table(records, job.record_top_k)
    first_rows = records[::cell.batch_size]
    metadata = {
        "kind": "cell",
        "cell": cell.as_dict(),
        "cell_id": cell.id,
        "settings": job.to_json(),
        "benchmark": bench.describe(),
        "eos_token_ids": eos,
        "pad_token_id": pad,
        **provenance_of_engine,
        "token_stream_sha256": storage.token_stream_digest(table),
        "logits_sha256": storage.logits_digest(table),
        "wall_seconds": float(sum(r["latency_s"] for r in first_rows)),
        "cpu_seconds": float(sum(r["cpu_s"] for r in first_rows)),
        "generated_tokens": int(sum(r["n_tokens"] for r in records)),
    }
    storage.write_table(table, out_path, metadata)
    return metadata
