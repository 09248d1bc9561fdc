"""KV-cache probe: where cache-on and cache-off decoding part numerically, and which
state carries the difference.

For each prompt of a subset and each precision, the cache-on trajectory is generated
greedily and replayed through cache-off decoding. At identical inputs we measure per
step the full-vocabulary KL(ON‖OFF), whether the argmax would flip, the top-2 margin, and
the L2 difference of every layer's output (drift). Then, at a few steps, we patch the
cache-on run with cache-off state — the residual stream (every layer, current position,
previous step) or the whole KV cache — and measure how much of the KL and of the flip is
recovered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..jobs import ProbeJob
from ..runtime import encode_prompt, special_ids
from .base import Probe, probe_metadata, setup, write_tables

# torch (through .replay and ..models) is imported inside the functions that compute: the
# probe registry, which the config schema and the Snakefile read, imports this module.

TABLES = ("steps", "layers", "patching")


def patch_steps(kl: np.ndarray, flips: np.ndarray, count: int) -> list[int]:
    """Steps worth patching: the first flip, then the largest KL (step 0 has no past)."""
    chosen: list[int] = []
    flip_steps = [int(s) for s in np.nonzero(flips)[0] if s >= 1]
    if flip_steps:
        chosen.append(flip_steps[0])
    for s in np.argsort(-kl, kind="stable"):
        if len(chosen) >= count:
            break
        if s >= 1 and int(s) not in chosen and kl[s] > 0:
            chosen.append(int(s))
    return sorted(chosen[:count])


def probe_prompt(model, prompt: list[int], max_new_tokens: int, eos: list[int], pad: int,
                 n_patch: int) -> dict[str, list[dict[str, Any]]]:
    from .replay import all_layers, kl_divergence, prefill_cache, replay, step_differences

    kwargs = dict(eos_token_ids=eos, pad_token_id=pad)
    on = replay(model, prompt, use_cache=True, max_new_tokens=max_new_tokens, **kwargs)
    off = replay(model, prompt, use_cache=False, max_new_tokens=max_new_tokens, tokens=on.tokens, **kwargs)
    d = step_differences(on, off)
    kl, flips, top_off = d["kl"], d["flip"], d["top_b"]
    steps = [{"step": t, "kl": float(kl[t]), "flip": bool(flips[t]), "margin_on": float(d["margin_a"][t]),
              "margin_off": float(d["margin_b"][t]), "max_abs_dlogit": float(d["max_abs_dlogit"][t]),
              "sigma_z": float(d["sigma_z"][t]),
              "top1_on": int(d["top_a"][t]), "top1_off": int(top_off[t])} for t in range(len(kl))]
    diff, scale = d["layer_l2"], np.maximum(d["layer_norm_b"], 1e-30)
    layers = [{"step": t, "layer": layer, "l2": float(diff[t, layer]),
               "rel_l2": float(diff[t, layer] / scale[t, layer])}
              for t in range(diff.shape[0]) for layer in range(diff.shape[1])]
    patching = []
    for t in patch_steps(kl, flips, n_patch):
        upto = on.tokens[: t + 1]
        residual = replay(model, prompt, use_cache=True, max_new_tokens=t + 1, tokens=upto,
                          patch_residual={t - 1: all_layers(off.layer_outputs[t - 1])}, **kwargs)
        kv = replay(model, prompt, use_cache=True, max_new_tokens=t + 1, tokens=upto,
                    patch_cache={t: lambda t=t: prefill_cache(model, prompt, on.tokens[: t - 1])}, **kwargs)
        for kind, logits in (("none", on.logits[t]), ("residual", residual.logits[t]), ("kv_cache", kv.logits[t])):
            patched_kl = float(kl_divergence(logits[None], off.logits[t][None])[0])
            patching.append({"step": t, "patch": kind, "kl": patched_kl,
                             "flip": bool(int(logits.argmax()) != int(top_off[t])),
                             "max_abs_dlogit": float((logits - off.logits[t]).abs().max())})
    return {"steps": steps, "layers": layers, "patching": patching}


def run_probe(job: ProbeJob, model_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """Run the KV-cache probe for one model × benchmark over the configured precisions."""
    from ..models import load_prepared

    bench, items = setup(job)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLES}
    meta = None
    for precision in job.options["precisions"]:
        model, tokenizer, manifest = load_prepared(model_dir, precision, job.device)
        meta = meta or probe_metadata(job, manifest, bench, model.device)
        eos, pad = special_ids(model, tokenizer)
        for item in items:
            prompt = encode_prompt(tokenizer, bench, item)
            result = probe_prompt(model, prompt, job.max_new_tokens, eos, pad, int(job.options["patch_steps"]))
            for name in TABLES:
                rows[name].extend({"precision": precision, "prompt_id": item.id, **r} for r in result[name])
        del model
    write_tables(out_dir, rows, meta)
    return meta


def _mean_over_prompts(layers: pd.DataFrame) -> pd.DataFrame:
    return layers.groupby(["model", "benchmark", "precision", "layer", "step"],
                          as_index=False)[["l2", "rel_l2"]].mean()


PROBE = Probe(
    name="kv_cache",
    summary="cache-on trajectory replayed without a cache: per-step KL, would-be flips, layer drift, patching",
    tables=TABLES,
    run=run_probe,
    summary_prefix="kv",
    options={
        "precisions": {"type": "array", "minItems": 1, "uniqueItems": True,
                       "items": {"enum": ["fp32", "bf16", "fp16"]}, "default": ["fp32", "fp16"]},
        "patch_steps": {"type": "integer", "minimum": 0, "default": 3},
    },
    aggregate={"layers": _mean_over_prompts},
)
