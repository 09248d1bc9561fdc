"""Teacher-forced replay: run one prompt through a configuration along a given token
trajectory, with exactly the step structure of free generation (our decode loop), and
keep what free generation throws away: full-vocabulary logits and every layer's output
at the current position.

Comparing two replays of the same trajectory measures the numerical difference of the
two configurations at identical inputs, step by step, without trajectory drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from ..decode import StepHooks, decode, forced, greedy


def decoder_layers(model) -> torch.nn.ModuleList:
    return model.get_decoder().layers


def _hidden(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _with_hidden(output, hidden: torch.Tensor):
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


@dataclass
class Replay:
    tokens: list[int]            # the trajectory (generated or forced)
    logits: torch.Tensor         # [T, V] fp32, on CPU
    layer_outputs: torch.Tensor  # [T, L, H] fp32, each layer's output at the current position


class _Capture(StepHooks):
    """Records full logits and layer outputs; optionally patches one step."""

    def __init__(self, model, patch_residual: dict[int, dict[int, torch.Tensor]] | None = None,
                 patch_cache: dict[int, Callable[[], object]] | None = None):
        self.logits: list[torch.Tensor] = []
        self.layers: list[list[torch.Tensor]] = []
        self._current: list[torch.Tensor] = []
        self._step = -1
        self._patch_residual = patch_residual or {}
        self._patch_cache = patch_cache or {}
        self._handles = [layer.register_forward_hook(self._make_hook(i))
                         for i, layer in enumerate(decoder_layers(model))]

    def _make_hook(self, index: int):
        def hook(module, args, output):
            hidden = _hidden(output)
            patch = self._patch_residual.get(self._step, {}).get(index)
            if patch is not None:
                hidden = hidden.clone()
                hidden[:, -1] = patch.to(hidden.device, hidden.dtype)
                output = _with_hidden(output, hidden)
            self._current.append(hidden[0, -1].detach().float().cpu())
            return output if patch is not None else None
        return hook

    def before(self, step: int, cache):
        self._step = -1  # a patch cache is built by a forward pass of its own: not this step
        self._current = []
        if step in self._patch_cache:
            cache = self._patch_cache[step]()
        self._step = step
        self._current = []
        return cache

    def after(self, step: int, out, logits: torch.Tensor) -> None:
        self.logits.append(logits[0].cpu())
        self.layers.append(self._current)

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def replay(model, prompt_ids: Sequence[int], *, use_cache: bool, max_new_tokens: int,
           eos_token_ids: Sequence[int], pad_token_id: int, tokens: Sequence[int] | None = None,
           patch_residual: dict[int, dict[int, torch.Tensor]] | None = None,
           patch_cache: dict[int, Callable[[], object]] | None = None) -> Replay:
    """Free greedy generation (tokens=None) or a teacher-forced replay of `tokens`, batch
    size 1, recording full logits and layer outputs at every step.

    `patch_residual[step][layer]` replaces that layer's output at the current position of
    that step ([H]); `patch_cache[step]()` returns a KV cache that replaces the running one
    just before that step."""
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    mask = torch.ones_like(ids)
    select = greedy if tokens is None else forced(torch.tensor([list(tokens)], dtype=torch.long))
    steps = max_new_tokens if tokens is None else len(tokens)
    capture = _Capture(model, patch_residual, patch_cache)
    try:
        result = decode(model, ids, mask, max_new_tokens=steps, use_cache=use_cache,
                        eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, record_top_k=2,
                        select=select, hooks=capture)
    finally:
        capture.close()
    return Replay(tokens=result.generations[0].token_ids, logits=torch.stack(capture.logits),
                  layer_outputs=torch.stack([torch.stack(layer) for layer in capture.layers]))


def all_layers(layer_outputs: torch.Tensor) -> dict[int, torch.Tensor]:
    """A residual patch for every layer from one step's [L, H] layer outputs."""
    return {i: layer_outputs[i] for i in range(layer_outputs.shape[0])}


def prefill_cache(model, prompt_ids: Sequence[int], tokens: Sequence[int]):
    """The KV cache that a cache-free forward over prompt + tokens computes: what the
    cache would hold if every key and value were recomputed, as cache-off decoding does."""
    from ..decode import _new_cache

    ids = torch.tensor([list(prompt_ids) + list(tokens)], dtype=torch.long, device=model.device)
    position_ids = torch.arange(ids.shape[1], device=model.device)[None]
    cache = _new_cache(model)
    with torch.inference_mode():
        out = model(input_ids=ids, position_ids=position_ids, cache=cache, use_cache=True,
                    logits_to_keep=1, return_dict=True)
    return out.cache


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(P‖Q) per row in float64 from two [T, V] logit tensors."""
    logp = torch.log_softmax(p_logits.double(), dim=-1)
    logq = torch.log_softmax(q_logits.double(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(dim=-1).clamp_min(0.0)


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    top = torch.topk(logits, 2, dim=-1).values
    return top[..., 0] - top[..., 1]


def step_differences(a: Replay, b: Replay) -> dict[str, np.ndarray]:
    """Per step of two replays of one trajectory: KL(a‖b), both argmaxes and whether they
    differ, both top-2 margins, the largest |Δlogit|; per step and layer, the L2 distance
    of the layer outputs and the norm of b's."""
    top_a, top_b = a.logits.argmax(-1), b.logits.argmax(-1)
    # The directional perturbation between a's top two candidates i and j (arXiv 2609.26621
    # §7.1): how much b's numerics move j up relative to i, (Δz_j − Δz_i). b picks j over i
    # when it exceeds a's margin z_i − z_j.
    second_a = a.logits.scatter(-1, top_a[:, None], float("-inf")).argmax(-1)
    delta = b.logits.double() - a.logits.double()
    directional = (delta.gather(-1, second_a[:, None]) - delta.gather(-1, top_a[:, None]))[:, 0]
    return {
        "kl": kl_divergence(a.logits, b.logits).numpy(),
        "top_a": top_a.numpy(), "top_b": top_b.numpy(), "flip": (top_a != top_b).numpy(),
        "margin_a": top2_margin(a.logits).numpy(), "margin_b": top2_margin(b.logits).numpy(),
        "max_abs_dlogit": (a.logits - b.logits).abs().max(-1).values.numpy(),
        # σz of arXiv 2609.26621 §I.3: the per-logit RMS of the logit difference over the
        # whole vocabulary (4.6275 / √32000 ≈ 0.026 there), per step.
        "sigma_z": (a.logits.double() - b.logits.double()).pow(2).mean(-1).sqrt().numpy(),
        "directional": directional.numpy(),
        "layer_l2": (a.layer_outputs - b.layer_outputs).norm(dim=-1).numpy(),
        "layer_norm_b": b.layer_outputs.norm(dim=-1).numpy(),
    }
