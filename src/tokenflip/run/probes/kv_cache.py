"""KV-cache probe: where cache-on and cache-off decoding part numerically, and which
state carries the difference (arXiv 2604.15409, Fig. 2-5).

For each prompt of a subset and each precision, the cache-on trajectory is generated
greedily and replayed through cache-off decoding. At identical inputs we measure per
step the full-vocabulary KL(ON‖OFF), whether the argmax would flip, the top-2 margin, and
the L2 difference of every layer's output (drift). Then, at a few steps, the cache-on
step is run again from its own cache with some of cache-off's state patched in, and we
record the share of the KL recovered (paper Fig. 5) and whether the flip is undone.
What each patch replaces, at that step only:
- `residual layer i`: layer i's output at the current position;
- `residual stream`: the input of every layer at the current position (the embedding
  and the outputs of all layers but the last): the whole residual stream the cache-on
  step computes, while its attention still reads the cache-on keys and values;
- `kv layer i`: layer i's keys and values of every past position;
- `kv cache`: the keys and values of every layer and past position.
Cache-off's keys and values are those its own forward at that step computes.

The serving engines' cache forms (`forms`: an FP8 or int4 cache, chunked prefill, a static
cache) are the same question asked again: the default cache's trajectory is replayed
through each form, and at identical inputs the per-step KL(default‖form) and would-be
flips are measured (table `forms`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tokenflip.core.specs import ProbeJob
from tokenflip.run.probes.base import Probe, run_over_prompts

# torch (through .replay and ..models) is imported inside the functions that compute: the
# probe registry, which the config schema and the Snakefile read, imports this module.

TABLES = ("steps", "layers", "patching", "forms")
# A cache form the probe replays through, as `axis=value` (what the cell names say).
FORM_PATTERN = r"^(kv_dtype=(fp8_e4m3|fp8_e5m2|int4|int8)|prefill_chunk=[1-9][0-9]{0,6}|cache_impl=static)\Z"


def parse_form(text: str):
    """`kv_dtype=fp8_e4m3` -> the CacheForm a cell with that axis value runs."""
    from tokenflip.run.caches import CacheForm

    axis, value = text.split("=", 1)
    return CacheForm(**{"kv_dtype": {"kv_dtype": value}, "prefill_chunk": {"prefill_chunk": int(value) if axis ==
                        "prefill_chunk" else None}, "cache_impl": {"impl": value}}[axis])


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


def kl_recovered(kl_patched: float, kl_none: float) -> float:
    """Share of the KL a patch removes, 1 − KL_patched / KL_unpatched (paper Fig. 5); NaN
    when there is nothing to recover. Negative when the patch makes things worse."""
    return 1.0 - kl_patched / kl_none if kl_none > 0 else float("nan")


def patches_at(model, prompt: list[int], on, off, t: int) -> list[tuple[str, str, int, Any]]:
    """(label, kind, layer, how to run) of every patch at step t: a function of the
    cache-on cache before t that runs the patched step."""
    from tokenflip.run.probes.replay import cache_before, recomputed_cache, step_once, with_layer_kv

    tokens = on.tokens
    own = cache_before(model, prompt, tokens, t)
    off_kv = recomputed_cache(model, prompt, tokens, t)
    n_layers = on.layer_outputs.shape[1]
    stream = {"embedding": off.embedding[t], **{i: off.layer_outputs[t, i] for i in range(n_layers - 1)}}
    runs = [("none", "none", -1, lambda: step_once(model, prompt, tokens, t, own))]
    runs += [(f"residual layer {i}", "residual layer", i,
              lambda i=i: step_once(model, prompt, tokens, t, own, {i: off.layer_outputs[t, i]}))
             for i in range(n_layers)]
    runs.append(("residual stream", "residual stream", -1, lambda: step_once(model, prompt, tokens, t, own, stream)))
    runs += [(f"kv layer {i}", "kv layer", i,
              lambda i=i: step_once(model, prompt, tokens, t, with_layer_kv(own, off_kv, i)))
             for i in range(n_layers)]
    runs.append(("kv cache", "kv cache", -1, lambda: step_once(model, prompt, tokens, t, off_kv)))
    return runs


def form_steps(model, prompt: list[int], on, forms: list[str], **kwargs) -> list[dict[str, Any]]:
    """Per cache form and step: the default cache's trajectory replayed through the form, at
    identical inputs: KL(default‖form), whether the argmax would flip, both margins."""
    from tokenflip.run.probes.replay import replay, step_differences

    rows = []
    for text in forms:
        alt = replay(model, prompt, use_cache=True, max_new_tokens=len(on.tokens), tokens=on.tokens,
                     form=parse_form(text), **kwargs)
        d = step_differences(on, alt)
        rows += [{"form": text, "step": t, "kl": float(d["kl"][t]), "flip": bool(d["flip"][t]),
                  "margin_on": float(d["margin_a"][t]), "margin_form": float(d["margin_b"][t]),
                  "max_abs_dlogit": float(d["max_abs_dlogit"][t]), "top1_on": int(d["top_a"][t]),
                  "top1_form": int(d["top_b"][t])} for t in range(len(d["kl"]))]
    return rows


def probe_prompt(model, prompt: list[int], max_new_tokens: int, eos: list[int], pad: int,
                 n_patch: int, stop=None, forms: list[str] = ()) -> dict[str, list[dict[str, Any]]]:
    from tokenflip.run.probes.replay import kl_divergence, replay, step_differences

    kwargs = dict(eos_token_ids=eos, pad_token_id=pad)
    on = replay(model, prompt, use_cache=True, max_new_tokens=max_new_tokens, stop=stop, **kwargs)
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
        target = off.logits[t][None]
        kl_none = None
        for label, kind, layer, run in patches_at(model, prompt, on, off, t):
            logits = run().logits
            patched_kl = float(kl_divergence(logits, target)[0])
            kl_none = patched_kl if kind == "none" else kl_none
            patching.append({"step": t, "patch": label, "kind": kind, "layer": layer, "kl": patched_kl,
                             "kl_recovered": kl_recovered(patched_kl, kl_none),
                             "flip": bool(int(logits[0].argmax()) != int(top_off[t])),
                             "max_abs_dlogit": float((logits[0] - off.logits[t]).abs().max())})
    return {"steps": steps, "layers": layers, "patching": patching,
            "forms": form_steps(model, prompt, on, list(forms), **kwargs)}


def run_probe(job: ProbeJob, model_dir: str | Path, out_dir: str | Path, pair_files=()) -> dict[str, Any]:
    """Run the KV-cache probe for one model × benchmark over the configured precisions."""
    def one(models, prompt, eos, pad, stop):
        return probe_prompt(models[0], prompt, job.max_new_tokens, eos, pad, int(job.options["patch_steps"]), stop,
                            job.options.get("forms", []))

    variants = [({"precision": p}, (p,)) for p in job.options["precisions"]]
    return run_over_prompts(job, model_dir, out_dir, TABLES, variants, one, pair_files)


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
        "forms": {"type": "array", "uniqueItems": True, "default": [],
                  "description": "cache forms to replay the default cache's trajectory through, as axis=value "
                                 "(kv_dtype=fp8_e4m3, prefill_chunk=16, cache_impl=static)",
                  "items": {"type": "string", "pattern": FORM_PATTERN}},
    },
    aggregate={"layers": _mean_over_prompts},
    # Explains cache on vs off at its precisions: it traces prompts that diverged there.
    # and each of its cache forms against the default cache.
    explains=lambda options: (lambda pair: pair.a.precision in options["precisions"] and (
        pair.axis == "cache" or f"{pair.axis}={pair.b.value(pair.axis)}" in options.get("forms", []))),
    version=4,  # 2: patches per layer from cache-off's own keys and values, share of KL recovered;
    # 3: prompts chosen from the pairs' results (`chosen_as`); 4: the cache forms (`forms`)
)
