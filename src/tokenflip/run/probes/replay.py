"""Teacher-forced replay: run one prompt through a configuration along a given token
trajectory, with exactly the step structure of free generation (our decode loop), and
keep what free generation throws away: full-vocabulary logits and, at the current
position, the embedding, every layer's output and the final norm's output.

Comparing two replays of the same trajectory measures the numerical difference of the
two configurations at identical inputs, step by step, without trajectory drift. A probe
that patches one step does not replay the whole prefix again: `cache_before` gives the
cache a cache-on run holds before step t and `step_once` runs that single step from it,
with the same inputs as the decode loop, optionally with some sites replaced.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np
import torch

from tokenflip.run.decode import StepHooks, _new_cache, decode, forced, greedy

# Where a patch can replace the current position's activation: "embedding" (the token
# embedding's output), a layer index (that decoder layer's output), "final_norm".
Site = Union[str, int]
Patch = dict[Site, torch.Tensor]


def decoder_layers(model) -> torch.nn.ModuleList:
    return model.get_decoder().layers


def final_norm(model) -> torch.nn.Module:
    return model.get_decoder().norm


def _hidden(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _with_hidden(output, hidden: torch.Tensor):
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


@dataclass
class Replay:
    tokens: list[int]            # the trajectory (generated or forced)
    logits: torch.Tensor         # [T, V] fp32, on CPU
    layer_outputs: torch.Tensor  # [T, L, H] fp32, each layer's output at the current position
    embedding: torch.Tensor | None = None  # [T, H] fp32, the token embedding's output (current position)
    normed: torch.Tensor | None = None     # [T, H] fp32, the final norm's output (current position)
    cache: object = None         # the cache after the last step (cache-on runs)


class _Capture(StepHooks):
    """Records full logits and the current position's activations at every site;
    `patches[step][site]` replaces a site's output at the current position of that step."""

    def __init__(self, model, patches: dict[int, Patch] | None = None):
        self.logits: list[torch.Tensor] = []
        self.sites: list[dict[Site, torch.Tensor]] = []
        self._current: dict[Site, torch.Tensor] = {}
        self._step = -1
        self._patches = patches or {}
        self.cache = None
        modules: list[tuple[Site, torch.nn.Module]] = [("embedding", model.get_input_embeddings()),
                                                       *enumerate(decoder_layers(model)),
                                                       ("final_norm", final_norm(model))]
        self._handles = [module.register_forward_hook(self._make_hook(site)) for site, module in modules]

    def _make_hook(self, site: Site):
        def hook(module, args, output):
            hidden = _hidden(output)
            patch = self._patches.get(self._step, {}).get(site)
            if patch is not None:
                hidden = hidden.clone()
                hidden[:, -1] = patch.to(hidden.device, hidden.dtype)
                output = _with_hidden(output, hidden)
            self._current[site] = hidden[0, -1].detach().float().cpu()
            return output if patch is not None else None
        return hook

    def before(self, step: int, cache):
        self._step = step
        self._current = {}
        return cache

    def after(self, step: int, out, logits: torch.Tensor) -> None:
        self.logits.append(logits[0].cpu())
        self.sites.append(self._current)
        self.cache = getattr(out, "cache", None)

    def close(self) -> None:
        for h in self._handles:
            h.remove()

    def result(self, tokens: list[int]) -> Replay:
        n_layers = sum(isinstance(site, int) for site in self.sites[0])
        return Replay(tokens=tokens, logits=torch.stack(self.logits),
                      layer_outputs=torch.stack([torch.stack([s[i] for i in range(n_layers)]) for s in self.sites]),
                      embedding=torch.stack([s["embedding"] for s in self.sites]),
                      normed=torch.stack([s["final_norm"] for s in self.sites]), cache=self.cache)


def replay(model, prompt_ids: Sequence[int], *, use_cache: bool, max_new_tokens: int,
           eos_token_ids: Sequence[int], pad_token_id: int, tokens: Sequence[int] | None = None,
           patches: dict[int, Patch] | None = None, stop=None, form=None) -> Replay:
    """Free greedy generation (tokens=None; it ends where a cell's would: at EOS or at the
    `stop` criterion of the benchmark's stop sequences) or a teacher-forced replay of
    `tokens`, batch size 1, recording full logits and the current position's activations at
    every step. `patches[step][site]` replaces that site's output at the current position ([H]);
    `form` is the cache's form with the cache on (`caches.CacheForm`; default DynamicCache)."""
    from tokenflip.run.caches import CacheForm

    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    mask = torch.ones_like(ids)
    select = greedy if tokens is None else forced(torch.tensor([list(tokens)], dtype=torch.long))
    steps = max_new_tokens if tokens is None else len(tokens)
    capture = _Capture(model, patches)
    try:
        result = decode(model, ids, mask, max_new_tokens=steps, use_cache=use_cache,
                        eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, record_top_k=2,
                        select=select, hooks=capture, stop=stop if tokens is None else None,
                        form=form or CacheForm())
    finally:
        capture.close()
    return capture.result(result.generations[0].token_ids)


def cache_before(model, prompt_ids: Sequence[int], tokens: Sequence[int], step: int):
    """The KV cache a cache-on decode of `tokens` holds just before `step` (it covers the
    prompt and tokens[:step - 1]); None before step 0, which is the prefill."""
    if step == 0:
        return None
    return replay(model, prompt_ids, use_cache=True, max_new_tokens=step, tokens=list(tokens[:step]),
                  eos_token_ids=[], pad_token_id=0).cache


def step_once(model, prompt_ids: Sequence[int], tokens: Sequence[int], step: int, cache,
              patch: Patch | None = None) -> Replay:
    """Cache-on step `step` of the trajectory `tokens`, run alone from `cache` (see
    `cache_before`; it is copied, never changed), with the inputs the decode loop gives
    that step: the prompt at step 0, else the previous token at its position. `patch`
    replaces sites' outputs at the current position. A one-step Replay."""
    if step == 0:
        ids, cache = list(prompt_ids), _new_cache(model)
    else:
        ids, cache = [int(tokens[step - 1])], copy.deepcopy(cache)
    start = len(prompt_ids) + step - len(ids)
    capture = _Capture(model, {0: patch or {}})
    try:
        capture.before(0, cache)
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids], device=model.device),
                        position_ids=torch.arange(start, start + len(ids), device=model.device)[None],
                        cache=cache, use_cache=True, logits_to_keep=1, return_dict=True)
            capture.after(0, out, out.logits[:, -1].to(copy=True, dtype=torch.float32))
    finally:
        capture.close()
    return capture.result([int(tokens[step])] if step < len(tokens) else [])


def recomputed_cache(model, prompt_ids: Sequence[int], tokens: Sequence[int], step: int):
    """The keys and values of the past positions that cache-off decoding computes at
    `step`: its forward over the prompt and tokens[:step], cut before the current position.
    Patched into a cache-on run, they make its step `step` attend exactly as cache-off's."""
    ids = list(prompt_ids) + list(tokens[:step])
    cache = _new_cache(model)
    # Sliding-window layers keep only the last window - 1 positions; recording the past
    # lets the cut below drop the current position and then restrict them as usual.
    cache.activate_past_recording()
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids], device=model.device),
              position_ids=torch.arange(len(ids), device=model.device)[None],
              cache=cache, use_cache=True, logits_to_keep=1, return_dict=True)
    cache.crop(-1)  # drop the current position
    for layer in cache.layers:
        if hasattr(layer, "record_past"):
            layer.record_past = False
    return cache


def cast_cache(cache, dtype: torch.dtype):
    """A copy of `cache` with its keys and values in `dtype` (to graft one precision's
    cache into a run of another)."""
    cache = copy.deepcopy(cache)
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None:
            layer.keys = layer.keys.to(dtype)
            layer.values = layer.values.to(dtype)
    return cache


def with_layer_kv(cache, source, layer: int):
    """A copy of `cache` whose layer `layer` holds `source`'s keys and values."""
    cache = copy.deepcopy(cache)
    cache.layers[layer].keys = source.layers[layer].keys.clone()
    cache.layers[layer].values = source.layers[layer].values.clone()
    return cache


def head_logits(model, normed: torch.Tensor) -> torch.Tensor:
    """fp32 logits of final-norm outputs [N, H] through the model's LM head, computed as the
    model computes them: in its dtype, with the final soft-capping of models that have one
    (Gemma-2 caps in the 16-bit dtype, then the decode loop copies to fp32)."""
    head = model.get_output_embeddings()
    cap = getattr(model.config.get_text_config(decoder=True), "final_logit_softcapping", None)
    rows = []
    with torch.inference_mode():
        # One row at a time, shaped [1, 1, H] as in a decode step: a matrix product's rounding
        # can depend on how many rows it multiplies at once.
        for row in normed.to(model.device, model.dtype):
            logits = head(row[None, None])
            if cap:
                logits = torch.tanh(logits / cap) * cap
            rows.append(logits[0, 0].float().cpu())
    return torch.stack(rows)


def lens_logits(model, layer_outputs: torch.Tensor) -> torch.Tensor:
    """Logit lens: each layer's output [L, H] read through the final norm and the LM head."""
    with torch.inference_mode():
        normed = final_norm(model)(layer_outputs.to(model.device, model.dtype))
    return head_logits(model, normed)


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(P‖Q) per row in float64 from two [T, V] logit tensors."""
    logp = torch.log_softmax(p_logits.double(), dim=-1)
    logq = torch.log_softmax(q_logits.double(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(dim=-1).clamp_min(0.0)


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    top = torch.topk(logits, 2, dim=-1).values
    return top[..., 0] - top[..., 1]


def rms(x: torch.Tensor) -> torch.Tensor:
    """Per-row root mean square in float64."""
    return x.double().pow(2).mean(-1).sqrt()


def directional_perturbation(reference: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Per row, how much the logit change `delta` moves the reference's runner-up j up
    relative to its top token i, Δz_j − Δz_i (arXiv 2609.26621 §7.1): the other side picks
    j over i when this exceeds the reference's margin z_i − z_j. Ties go to the smaller id,
    as argmax does."""
    top = reference.argmax(-1)
    second = reference.scatter(-1, top[:, None], float("-inf")).argmax(-1)
    delta = delta.double()
    return (delta.gather(-1, second[:, None]) - delta.gather(-1, top[:, None]))[:, 0]


def step_differences(a: Replay, b: Replay) -> dict[str, np.ndarray]:
    """Per step of two replays of one trajectory: KL(a‖b), both argmaxes and whether they
    differ, both top-2 margins, the largest |Δlogit|; per step and layer, the L2 distance
    of the layer outputs and the norm of b's."""
    top_a, top_b = a.logits.argmax(-1), b.logits.argmax(-1)
    delta = b.logits.double() - a.logits.double()
    directional = directional_perturbation(a.logits, delta)
    return {
        "kl": kl_divergence(a.logits, b.logits).numpy(),
        "top_a": top_a.numpy(), "top_b": top_b.numpy(), "flip": (top_a != top_b).numpy(),
        "margin_a": top2_margin(a.logits).numpy(), "margin_b": top2_margin(b.logits).numpy(),
        "max_abs_dlogit": (a.logits - b.logits).abs().max(-1).values.numpy(),
        # σz of arXiv 2609.26621 §I.3: the per-logit RMS of the logit difference over the
        # whole vocabulary (4.6275 / √32000 ≈ 0.026 there), per step.
        "sigma_z": rms(delta).numpy(),
        "directional": directional.numpy(),
        "layer_l2": (a.layer_outputs - b.layer_outputs).norm(dim=-1).numpy(),
        "layer_norm_b": b.layer_outputs.norm(dim=-1).numpy(),
    }
