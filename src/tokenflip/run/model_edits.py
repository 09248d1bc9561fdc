"""Model-level interventions that need torch: FP32 scopes beyond the LM head, emulated FP8
weights, consensus decoding of two precisions, and composition. See
`tokenflip.run.interventions` for what a config names and why each exists."""

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
    floating input cast on entry (the rotary cos/sin arrive already rounded to 16 bit),
    so their fp32 output reaches the head without a 16-bit rounding."""
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
    matmul compute upgraded to FP32"; 16-bit GPU kernels may reduce partial sums in 16 bit).
    The attention products (QKᵀ, PV) stay as the attention implementation computes them."""
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    others = [f"layers.{name}" for name, p in _weight_matrices(model.get_decoder().layers) if id(p) not in linear]
    if others:
        # Refused rather than partial: these products (e.g. OLMoE's experts) are not linear
        # modules, and would stay in 16 bit.
        raise ValueError(f"fp32_matmul covers linear layers only; this model multiplies by other weight "
                         f"matrices too ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''})")
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.forward = types.MethodType(_linear_in_fp32, module)
    return model


def round_to_fp8(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """`weight` rounded to FP8 with one power-of-two scale per output row (the smallest that
    fits the row's largest magnitude into the format), returned in the weight's dtype:
    emulated FP8 storage. A power of two keeps the scaled codes exact in bf16 and fp16 alike,
    so cells of both precisions hold the same weights."""
    dtype = FP8_FORMATS[fmt]
    w = weight.float()
    amax = w.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    scale = torch.exp2(torch.ceil(torch.log2(amax / torch.finfo(dtype).max)))
    return ((w / scale).to(dtype).float() * scale).to(weight.dtype)


def _weight_matrices(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Every floating parameter of two or more dimensions: linear weights, and the expert and
    router matrices that mixture-of-experts layers keep as bare parameters (OLMoE)."""
    return [(name, p) for name, p in module.named_parameters() if p.is_floating_point() and p.dim() >= 2]


def fp8_weights(model, scope: str, fmt: str):
    """Every weight matrix of the decoder layers (`body`), and the LM head too (`all`),
    replaced by its FP8 rounding; norms and the embedding are kept, compute stays in the
    model's precision. A head tied to the embedding is untied first, so the embedding keeps
    its weights."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(f"fp8_weights rounds a plain linear LM head; this one is {type(head).__name__} "
                         "(apply fp8_weights before an LM-head intervention)")
    matrices = [p for _, p in _weight_matrices(model.get_decoder().layers)]
    if scope == "all":
        if head.weight is model.get_input_embeddings().weight:
            untied = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None,
                               device=head.weight.device, dtype=head.weight.dtype)
            untied.weight = nn.Parameter(head.weight.detach().clone(), requires_grad=False)
            if head.bias is not None:
                untied.bias = nn.Parameter(head.bias.detach().clone(), requires_grad=False)
            model.set_output_embeddings(untied)
            head = untied
        matrices.append(head.weight)
    with torch.no_grad():
        for weight in matrices:
            weight.copy_(round_to_fp8(weight, fmt))
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

    def fired(self) -> torch.Tensor | None:
        """Rows where any copy's LM-head intervention fired at the last step (None: none has one)."""
        from tokenflip.run.heads import fired

        gates = [g for g in map(fired, self.copies) if g is not None]
        return torch.stack(gates).any(0) if gates else None

    def forward(self, *, cache=None, use_cache: bool = False, **kwargs):
        from tokenflip.run.decode import _new_cache

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
    from tokenflip.models.prepare import PRECISIONS

    models = [model if PRECISIONS[p] == model.dtype else load(p) for p in precisions]
    return ConsensusModel(models)
