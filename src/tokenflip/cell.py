"""One cell, end to end: load the prepared model in the cell's precision, prompt with the
benchmark in fixed batches, decode, score, and write the cell's Parquet file."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from . import provenance, storage
from .benchmarks import build_benchmark
from .decode import decode, left_pad
from .models import load_prepared
from .plan import Cell
from .sampling import make_selector
from .interventions import apply_to_model


def prompt_token_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Chat-template the messages into token ids, exactly once, with the generation prompt."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def eos_ids(model, tokenizer) -> list[int]:
    ids = set()
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return sorted(ids)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_deterministic(mode: str) -> None:
    """The deterministic axis: torch's deterministic algorithms on or off (cuBLAS needs a
    fixed workspace for them); `default` leaves torch as it is."""
    if mode == "default":
        return
    if mode == "on":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(mode == "on")


def run_cell(settings: dict[str, Any], model_dir: str | Path, out_path: str | Path,
             progress: bool = True) -> dict[str, Any]:
    """Generate the cell described by `settings` (see `plan.cell_settings`) into `out_path`."""
    cell = Cell.from_dict(settings["cell"])
    if settings.get("threads"):
        torch.set_num_threads(int(settings["threads"]))
    set_deterministic(cell.deterministic)
    seed_everything(int(settings["run_seed"]))
    intervention = settings["intervention"]
    # The fp32 oracle keeps fp32 weights; every other cell rounds them to its precision.
    load_precision = "fp32" if intervention.get("kind") == "fp32_oracle" else cell.precision
    model, tokenizer, manifest = load_prepared(model_dir, load_precision, settings["device"], cell.attention)
    if intervention.get("kind") != "fp32_oracle":
        model = apply_to_model(model, intervention)
    bench = build_benchmark(cell.benchmark, settings["benchmark"])
    items = bench.items()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = eos_ids(model, tokenizer)
    k = int(settings["record_top_k"])
    records: list[dict[str, Any]] = []
    batches = [items[i:i + cell.batch_size] for i in range(0, len(items), cell.batch_size)]
    bar = tqdm(batches, desc=cell.id, unit="batch", disable=not progress)
    for b, batch in enumerate(bar):
        prompts = [prompt_token_ids(tokenizer, bench.messages(item)) for item in batch]
        ids, mask = left_pad(prompts, pad_id)
        select = make_selector(settings["decoding"], [item.id for item in batch],
                               int(settings["run_seed"]), model.device)
        result = decode(model, ids, mask, max_new_tokens=int(settings["max_new_tokens"]),
                        use_cache=cell.cache == "on", eos_token_ids=eos, pad_token_id=pad_id,
                        record_top_k=k, select=select)
        for item, prompt, gen in zip(batch, prompts, result.generations):
            text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            extracted = bench.extract(text)
            records.append({
                "prompt_index": len(records), "prompt_id": item.id, "batch_index": b,
                "prompt_ids": prompt, "token_ids": gen.token_ids,
                "top_ids": np.asarray(gen.top_ids, dtype=np.int32).reshape(-1, k),
                "top_logits": np.asarray(gen.top_logits, dtype=np.float32).reshape(-1, k),
                "margin": gen.margin, "logsumexp": gen.logsumexp, "entropy": gen.entropy,
                "intervened": gen.intervened, "n_tokens": len(gen.token_ids),
                "finish_reason": gen.finish_reason, "text": text, "gold": item.gold,
                "extracted": extracted, "correct": bench.is_correct(item, text),
                "latency_s": result.wall_seconds,
            })
    table = storage.cell_table(records, k)
    metadata = {
        "kind": "cell",
        "cell": cell.as_dict(),
        "cell_id": cell.id,
        "settings": settings,
        "model": {k_: manifest.get(k_) for k_ in ("spec", "architecture", "num_parameters", "weights_sha256",
                                                  "tokenizer_sha256", "source_digest", "resolved_revision")},
        "benchmark": bench.describe(),
        "eos_token_ids": eos,
        "pad_token_id": pad_id,
        "environment": provenance.environment(model.device),
        "token_stream_sha256": storage.token_stream_digest(table),
        "logits_sha256": storage.logits_digest(table),
        "wall_seconds": float(sum(r["latency_s"] for r in records[::cell.batch_size])),
    }
    storage.write_table(table, out_path, metadata)
    return metadata
