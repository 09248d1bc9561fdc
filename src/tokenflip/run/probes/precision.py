"""Cross-precision probe: where two precisions part, and which layer or state carries it
(arXiv 2609.26621 §7, App. II, App. III, App. XII).

For each prompt of a subset, precision a's greedy trajectory is generated and replayed
through precision b (teacher forcing, cache on in both). At identical inputs we record
per step KL(a‖b), whether the argmax differs, both margins, σz over the whole
vocabulary, its split into the LM head's and the body's part, and the L2 distance of
every layer's output. Then:
- grafting (App. II(ii)-(iii), Table 8): at the first flip steps, one site of the other
  precision replaces the run's own at the current position — the embedding, one layer's
  output, the final norm's output — or its whole KV cache is the other precision's own
  incremental cache (same trajectory, cast to the run's dtype). Both directions: b's
  state into a (does a now pick b's token?) and a's into b (does b now pick a's?);
- logit lens (App. II(i), (iv), App. III, Table 10): each layer's output read through the
  final norm and the LM head, in both precisions, at every prompt's first token and at
  one traced step per prompt — the first flip of a Diverged prompt, the middle of an
  Agreed one's generation — with both top-2 margins and the layer's L2 distance, so the
  two groups can be compared layer by layer.
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

TABLES = ("steps", "layers", "grafting", "lens")


def head_and_body(model_a, model_b, a, b) -> dict[str, np.ndarray]:
    """σz split into the LM head's part and the body's part (arXiv 2609.26621 §7.3, §I.5:
    the per-logit perturbation is the projected body error plus the head's own rounding).
    With h the final norm's output and z_p(h) precision p's head applied to h:
    head part = z_b(h_a) − z_a(h_a) (same input, other head arithmetic), body part =
    z_b(h_b) − z_b(h_a) (same head, other hidden state); the two sum to z_b(h_b) − z_a(h_a).
    The head's share is its part of the summed squares, σ_head² / (σ_head² + σ_body²).
    The same split of the directional perturbation between a's top two tokens gives App.
    XII's body projection (`directional_body`) and the head's (`directional_head`)."""
    from tokenflip.run.probes.replay import directional_perturbation, head_logits, rms

    # z_a(h_a) and z_b(h_b) are the replays' own logits (head_logits reproduces them bit for
    # bit: tests/run/test_probes.py); only b's head on a's hidden state is new.
    b_of_a = head_logits(model_b, a.normed).double()
    head, body = b_of_a - a.logits.double(), b.logits.double() - b_of_a
    return {"sigma_z_head": rms(head).numpy(), "sigma_z_body": rms(body).numpy(),
            "directional_head": directional_perturbation(a.logits, head).numpy(),
            "directional_body": directional_perturbation(a.logits, body).numpy()}


def _fits(value, dtype) -> bool:
    """Whether the run's dtype holds the grafted value exactly: a state grafted into a run of
    another 16-bit format is rounded to it (fp16 into bf16 loses mantissa bits, bf16 into
    fp16 may overflow), which the `lossless` column says."""
    return bool((value.to(dtype).float() == value.float()).all())


def graft_rows(model_a, model_b, prompt: list[int], a, b, t: int) -> list[dict[str, Any]]:
    """At flip step t, each site of one precision grafted into the other's run (both
    directions); `fixed`: the run's argmax becomes the other precision's. A flip at step 0
    (the prefill) grafts the last prompt position only and has no cache to graft."""
    from tokenflip.run.probes.replay import cache_before, cast_cache, step_once

    tokens = a.tokens
    top_a, top_b = int(a.logits[t].argmax()), int(b.logits[t].argmax())
    cache_a, cache_b = (cache_before(model, prompt, tokens, t) for model in (model_a, model_b))
    rows = []
    for direction, target, source, wanted, own_cache, source_cache in (
            ("b→a", model_a, b, top_b, cache_a, cache_b), ("a→b", model_b, a, top_a, cache_b, cache_a)):
        sites = [("embedding", "embedding", -1, source.embedding[t]),
                 *((f"layer {i}", "layer", i, source.layer_outputs[t, i]) for i in range(source.layer_outputs.shape[1])),
                 ("final norm", "final_norm", -1, source.normed[t])]
        for label, site, layer, value in sites:
            key = layer if site == "layer" else site
            g = step_once(target, prompt, tokens, t, own_cache, {key: value})
            rows.append({"step": t, "direction": direction, "graft": label, "site": site, "layer": layer,
                         "fixed": int(g.logits[0].argmax()) == wanted, "lossless": _fits(value, target.dtype)})
        if t >= 1:  # step 0 is the prefill: there is no cache yet
            g = step_once(target, prompt, tokens, t, cast_cache(source_cache, target.dtype))
            kv = [x for layer in source_cache.layers for x in (layer.keys, layer.values)]
            rows.append({"step": t, "direction": direction, "graft": "kv cache", "site": "kv_cache", "layer": -1,
                         "fixed": int(g.logits[0].argmax()) == wanted,
                         "lossless": all(_fits(x, target.dtype) for x in kv)})
    return rows


def lens_rows(model_a, model_b, a, b, t: int, group: str, layer_l2: np.ndarray) -> list[dict[str, Any]]:
    """Logit lens of both precisions at step t, per layer: top-1 and top-2 agreement, both
    top-2 margins and the L2 distance of the layer outputs."""
    from tokenflip.run.probes.replay import lens_logits, top2_margin

    lens_a, lens_b = lens_logits(model_a, a.layer_outputs[t]), lens_logits(model_b, b.layer_outputs[t])
    top2_a, top2_b = lens_a.topk(2, dim=-1).indices, lens_b.topk(2, dim=-1).indices
    margin_a, margin_b = top2_margin(lens_a), top2_margin(lens_b)
    return [{"step": t, "group": group, "layer": layer,
             "top1_agree": bool(lens_a[layer].argmax() == lens_b[layer].argmax()),
             "top2_agree": set(top2_a[layer].tolist()) == set(top2_b[layer].tolist()),
             "margin_a": float(margin_a[layer]), "margin_b": float(margin_b[layer]),
             "l2": float(layer_l2[t, layer])} for layer in range(lens_a.shape[0])]


def probe_prompt(model_a, model_b, prompt: list[int], max_new_tokens: int, eos: list[int], pad: int,
                 n_flips: int, stop=None) -> dict[str, list[dict[str, Any]]]:
    from tokenflip.run.probes.replay import replay, step_differences

    kw = dict(eos_token_ids=eos, pad_token_id=pad)
    a = replay(model_a, prompt, use_cache=True, max_new_tokens=max_new_tokens, stop=stop, **kw)
    b = replay(model_b, prompt, use_cache=True, max_new_tokens=max_new_tokens, tokens=a.tokens, **kw)
    d = {**step_differences(a, b), **head_and_body(model_a, model_b, a, b)}
    flips = [int(t) for t in np.nonzero(d["flip"])[0]]
    per_step = ("kl", "margin_a", "margin_b", "sigma_z", "sigma_z_head", "sigma_z_body", "max_abs_dlogit",
                "directional", "directional_head", "directional_body")
    steps = [{"step": t, "flip": bool(d["flip"][t]), **{k: float(d[k][t]) for k in per_step}}
             for t in range(len(d["kl"]))]
    diff = d["layer_l2"]
    layers = [{"step": t, "layer": layer, "l2": float(diff[t, layer])}
              for t in range(diff.shape[0]) for layer in range(diff.shape[1])]
    grafting = [row for t in flips[:n_flips] for row in graft_rows(model_a, model_b, prompt, a, b, t)]
    # Every prompt's first token (App. II(i): the unconditional trace), then one traced step
    # per prompt (App. III's divergence-conditioned trace): a Diverged prompt at its first
    # flip, an Agreed one at the middle of its generation. Not at its first token: App.
    # II(i) gives a mean first-token margin of 0.70 over all prompts, which the Agreed
    # median of 5.73 (§I.3) cannot have come from; the middle keeps the two groups at
    # comparable positions (flips come at a median 34-50 tokens, §6.2).
    traced, group = (flips[0], "diverged") if flips else (len(a.tokens) // 2, "agreed")
    lens = (lens_rows(model_a, model_b, a, b, 0, "first_token", diff)
            + lens_rows(model_a, model_b, a, b, traced, group, diff))
    return {"steps": steps, "layers": layers, "grafting": grafting, "lens": lens}


def run_probe(job: ProbeJob, model_dir: str | Path, out_dir: str | Path, pair_files=()) -> dict[str, Any]:
    """Run the precision probe for one model × benchmark and each configured precision pair."""
    def one(models, prompt, eos, pad, stop):
        return probe_prompt(*models, prompt, job.max_new_tokens, eos, pad, int(job.options["flips"]), stop)

    variants = [({"a": a, "b": b}, (a, b)) for a, b in job.options["pairs"]]
    return run_over_prompts(job, model_dir, out_dir, TABLES, variants, one, pair_files)


def _mean_over_prompts(layers: pd.DataFrame) -> pd.DataFrame:
    return layers.groupby(["model", "benchmark", "a", "b", "layer", "step"], as_index=False)["l2"].mean()


_PRECISION = {"enum": ["fp32", "bf16", "fp16"]}

PROBE = Probe(
    name="precision",
    summary="precision a's greedy trajectory replayed in b: flips, σz and its head share, grafting, logit lens",
    tables=TABLES,
    run=run_probe,
    summary_prefix="precision",
    options={
        "pairs": {"description": "precision pairs [a, b]; a's greedy trajectory is replayed through b",
                  "type": "array", "minItems": 1,
                  # two different precisions: a pair of one precision compares nothing
                  "items": {"type": "array", "minItems": 2, "maxItems": 2, "uniqueItems": True,
                            "items": _PRECISION},
                  "default": [["bf16", "fp16"]]},
        "flips": {"type": "integer", "minimum": 0, "default": 3,
                  "description": "graft at the first N flip steps of each prompt"},
    },
    aggregate={"layers": _mean_over_prompts},
    version=5,  # 2: σz head/body split, grafting both ways from own caches, lens per prompt group;
    # 3: the lens at the first token of every prompt, Agreed prompts at mid-generation;
    # 4: the directional perturbation split into head and body (App. XII);
    # 5: prompts chosen from the pairs' results (`chosen_as`)
    explains=lambda options: (lambda pair: pair.axis == "precision" and any(
        {pair.a.precision, pair.b.precision} == set(p) for p in options["pairs"])),
)
