"""Cross-precision probe: where two precisions part, and which layer or state carries it
(arXiv 2609.26621 §7: grafting, KV-cache grafting, logit lens, per-layer drift).

For each prompt of a subset, precision a's greedy trajectory is generated and replayed
through precision b (teacher forcing). At identical inputs we record per step KL(a‖b),
whether the argmax differs, both margins, and the L2 distance of every layer's output.
At the first flip steps we then ask what fixes the flip in run a:
- layer grafting: replace one layer's output (current position) by precision b's;
- KV-cache grafting: replace the whole KV cache by precision b's (same trajectory);
- logit lens: do the two precisions agree on top-1 / top-2 when each layer's output is
  read through the final norm and the LM head?
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

TABLES = ("steps", "layers", "grafting", "lens")


def _cast_cache(cache, dtype: torch.dtype):
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None:
            layer.keys = layer.keys.to(dtype)
            layer.values = layer.values.to(dtype)
    return cache


def _lens_top2(model, layer_outputs: torch.Tensor) -> torch.Tensor:
    """Top-2 token ids of each layer's output read through the final norm and LM head;
    column 0 is the argmax (as decoding breaks ties), column 1 the best other token."""
    import torch

    with torch.inference_mode():
        norm = model.get_decoder().norm
        head = model.get_output_embeddings()
        logits = head(norm(layer_outputs.to(model.device, model.dtype))).float()
        first = logits.argmax(-1)
        second = logits.scatter(-1, first[:, None], float("-inf")).argmax(-1)
        return torch.stack([first, second], dim=-1).cpu()


def probe_prompt(model_a, model_b, prompt: list[int], max_new_tokens: int, eos: list[int], pad: int,
                 n_flips: int) -> dict[str, list[dict[str, Any]]]:
    from .replay import decoder_layers, prefill_cache, replay, step_differences

    kw = dict(eos_token_ids=eos, pad_token_id=pad)
    a = replay(model_a, prompt, use_cache=True, max_new_tokens=max_new_tokens, **kw)
    b = replay(model_b, prompt, use_cache=True, max_new_tokens=max_new_tokens, tokens=a.tokens, **kw)
    d = step_differences(a, b)
    kl, top_b = d["kl"], d["top_b"]
    flips = [int(t) for t in np.nonzero(d["flip"])[0]]
    steps = [{"step": t, "kl": float(kl[t]), "flip": bool(d["flip"][t]),
              "margin_a": float(d["margin_a"][t]), "margin_b": float(d["margin_b"][t]),
              "sigma_z": float(d["sigma_z"][t]), "max_abs_dlogit": float(d["max_abs_dlogit"][t]),
              "directional": float(d["directional"][t])}
             for t in range(len(kl))]
    diff = d["layer_l2"]
    layers = [{"step": t, "layer": layer, "l2": float(diff[t, layer])}
              for t in range(diff.shape[0]) for layer in range(diff.shape[1])]
    grafting, lens = [], []
    n_layers = len(decoder_layers(model_a))
    for t in flips[:n_flips]:
        upto = a.tokens[: t + 1]
        for layer in range(n_layers):
            g = replay(model_a, prompt, use_cache=True, max_new_tokens=t + 1, tokens=upto,
                       patch_residual={t: {layer: b.layer_outputs[t, layer]}}, **kw)
            grafting.append({"step": t, "graft": f"layer {layer}", "layer": layer,
                             "fixed": bool(g.logits[t].argmax() == top_b[t])})
        if t >= 1:
            def b_cache(t=t):
                return _cast_cache(prefill_cache(model_b, prompt, a.tokens[: t - 1]), model_a.dtype)
            g = replay(model_a, prompt, use_cache=True, max_new_tokens=t + 1, tokens=upto,
                       patch_cache={t: b_cache}, **kw)
            grafting.append({"step": t, "graft": "kv cache", "layer": -1,
                             "fixed": bool(g.logits[t].argmax() == top_b[t])})
        lens_a, lens_b = _lens_top2(model_a, a.layer_outputs[t]), _lens_top2(model_b, b.layer_outputs[t])
        for layer in range(n_layers):
            lens.append({"step": t, "layer": layer,
                         "top1_agree": bool(lens_a[layer, 0] == lens_b[layer, 0]),
                         "top2_agree": bool(set(lens_a[layer].tolist()) == set(lens_b[layer].tolist()))})
    return {"steps": steps, "layers": layers, "grafting": grafting, "lens": lens}


def run_probe(job: ProbeJob, model_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """Run the precision probe for one model × benchmark and each configured precision pair."""
    from ..models import load_prepared

    bench, items = setup(job)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLES}
    meta = None
    for prec_a, prec_b in job.options["pairs"]:
        model_a, tokenizer, manifest = load_prepared(model_dir, prec_a, job.device)
        model_b, _, _ = load_prepared(model_dir, prec_b, job.device)
        meta = meta or probe_metadata(job, manifest, bench, model_a.device)
        eos, pad = special_ids(model_a, tokenizer)
        for item in items:
            prompt = encode_prompt(tokenizer, bench, item)
            result = probe_prompt(model_a, model_b, prompt, job.max_new_tokens, eos, pad, int(job.options["flips"]))
            for name in TABLES:
                rows[name].extend({"a": prec_a, "b": prec_b, "prompt_id": item.id, **r} for r in result[name])
        del model_a, model_b
    write_tables(out_dir, rows, meta)
    return meta


def _mean_over_prompts(layers: pd.DataFrame) -> pd.DataFrame:
    return layers.groupby(["model", "benchmark", "a", "b", "layer", "step"], as_index=False)["l2"].mean()


_PRECISION = {"enum": ["fp32", "bf16", "fp16"]}

PROBE = Probe(
    name="precision",
    summary="precision a's greedy trajectory replayed in b: flips, layer and KV-cache grafting, logit lens",
    tables=TABLES,
    run=run_probe,
    summary_prefix="precision",
    options={
        "pairs": {"description": "precision pairs [a, b]; a's greedy trajectory is replayed through b",
                  "type": "array", "minItems": 1,
                  "items": {"type": "array", "minItems": 2, "maxItems": 2, "items": _PRECISION},
                  "default": [["bf16", "fp16"]]},
        "flips": {"type": "integer", "minimum": 0, "default": 3},
    },
    aggregate={"layers": _mean_over_prompts},
)
