"""Model-level interventions that need torch: FP32 scopes beyond the LM head, emulated FP8
weights, consensus decoding of two precisions, and composition. See
`tokenflip.interventions` for what a config names and why each exists."""

from __future__ import annotations

import types
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

# Scopes of FP32 compute, each containing the previous (arXiv 2609.26621 §7.6: the late
# causal locus is the last layer, the final norm and the LM head).
FP32_SCOPES = ("head", "final_norm", "last_layer")

FP8_FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _to_fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.float()
    if isinstance(value, tuple):
        return tuple(_to_fp32(v) for v in value)
    return value


def _upcast_inputs(module, args, kwargs):
    return tuple(_to_fp32(a) for a in args), {k: _to_fp32(v) for k, v in kwargs.items()}


def fp32_scope(model, scope: str):
    """Run the modules of `scope` beyond the head (the final norm; with `last_layer` the
    last decoder layer too) in fp32: weights upcast once (these modules only) and every
    floating input cast on entry, so their fp32 output reaches the head unrounded."""
    if scope not in FP32_SCOPES:
        raise ValueError(f"unknown fp32 scope {scope!r}; known: {FP32_SCOPES}")
    decoder = model.get_decoder()
    modules = {"head": [], "final_norm": [decoder.norm], "last_layer": [decoder.layers[-1], decoder.norm]}[scope]
    for module in modules:
        module.float()
        module.register_forward_pre_hook(_upcast_inputs, with_kwargs=True)
    return model


def _linear_in_fp32(self, x: torch.Tensor) -> torch.Tensor:
    bias = None if self.bias is None else self.bias.float()
    return F.linear(x.float(), self.weight.float(), bias).to(x.dtype)


def fp32_matmul(model):
    """Every linear layer (the LM head included) multiplies in fp32 — inputs and weights
    upcast on the fly, one layer at a time — and rounds its output back to the model's
    16-bit type: fp32 accumulation with 16-bit activations (arXiv 2609.26621 §7.6, "only
    matmul compute upgraded to FP32"; 16-bit kernels may reduce partial sums in 16 bit)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.forward = types.MethodType(_linear_in_fp32, module)
    return model


def round_to_fp8(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """`weight` rounded to FP8 with one scale per output row (absmax to the format's
    largest finite value), returned in the weight's dtype: emulated FP8 storage."""
    dtype = FP8_FORMATS[fmt]
    w = weight.float()
    scale = w.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / torch.finfo(dtype).max
    return ((w / scale).to(dtype).float() * scale).to(weight.dtype)


def fp8_weights(model, scope: str, fmt: str):
    """Every Linear weight of `scope` ("all": body and head, "body": decoder layers only)
    replaced by its FP8 rounding; compute stays in the model's precision. A tied LM head
    is untied first when only the body is rounded, so the embedding keeps its weights."""
    decoder_layers = model.get_decoder().layers
    head = model.get_output_embeddings()
    linears = [m for m in decoder_layers.modules() if isinstance(m, nn.Linear)]
    if scope == "all":
        linears.append(head)
        if head.weight is model.get_input_embeddings().weight:  # tied: keep the embedding exact
            untied = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None,
                               device=head.weight.device, dtype=head.weight.dtype)
            untied.weight = nn.Parameter(head.weight.detach().clone(), requires_grad=False)
            model.set_output_embeddings(untied)
            linears[-1] = untied
    with torch.no_grad():
        for linear in linears:
            linear.weight.copy_(round_to_fp8(linear.weight, fmt))
    return model


class _PairCache:
    """The two caches of a consensus model, passed through the decode loop as one."""

    def __init__(self, caches: list[Any]):
        self.caches = caches


class ConsensusModel(nn.Module):
    """Greedy decoding on the consensus of several precisions: every step runs each copy of
    the model and returns the mean of their fp32 logits, so the chosen token is the same
    whatever precision the cell itself is in (twice the compute for two precisions)."""

    def __init__(self, models: list[Any]):
        super().__init__()
        self.copies = nn.ModuleList(models)
        self.config = models[0].config

    @property
    def device(self):
        return self.copies[0].device

    @property
    def dtype(self):
        return self.copies[0].dtype

    @property
    def generation_config(self):
        return self.copies[0].generation_config

    def get_output_embeddings(self):
        return self.copies[0].get_output_embeddings()

    def get_input_embeddings(self):
        return self.copies[0].get_input_embeddings()

    def get_decoder(self):
        return self.copies[0].get_decoder()

    def forward(self, *, cache=None, use_cache: bool = False, **kwargs):
        from .decode import _new_cache

        caches = cache.caches if isinstance(cache, _PairCache) else [
            _new_cache(m) if use_cache else None for m in self.copies]
        outs = [m(cache=c, use_cache=use_cache, **kwargs) for m, c in zip(self.copies, caches)]
        logits = torch.stack([o.logits.float() for o in outs]).mean(0)
        first = outs[0]
        first.logits = logits
        first.cache = _PairCache([o.cache for o in outs]) if use_cache else None
        return first


def consensus(model, precisions: list[str], load: Callable[[str], Any]):
    """A ConsensusModel over `precisions`, each loaded from the checkpoint by `load` (the
    cell's own model is reused for its own precision)."""
    from .models import PRECISIONS

    models = [model if PRECISIONS[p] == model.dtype else load(p) for p in precisions]
    return ConsensusModel(models)
