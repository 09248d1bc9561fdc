"""LM-head interventions for cross-precision agreement (arXiv 2609.26621, §4).

Each intervention replaces the model's `lm_head` by a module that computes the usual
16-bit logits and then, at the last position, changes them:

- `quantize` (A): logits binned to multiples of τ (floor), so values in one bin tie and
  argmax breaks the tie towards the smaller token id; no recomputation.
- `topk_fp32` (B): when the top-2 margin is below τ, the K best candidates are recomputed
  with fp32 accumulation from the 16-bit hidden state and weights, then compared as bins.
- `fp32_head` (C): the whole vocabulary recomputed in fp32 (weights upcast on the fly, no
  persistent fp32 copy), gated by margin < τ or ungated.
- `sharpen`: temperature sharpening, the last position's logits divided by a temperature
  below 1 (a supplementary control: argmax-preserving, so it cannot change greedy tokens).

Model-level controls (weights rounded to 16 bit, compute in fp32; or the fp32 oracle) are
applied at load time by `apply_to_model`. The wrapped model still works with
`generate()`: `GatedFP32Head.wrap(model, tau)` is the public entry point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .registry import Registry

# The head modules need torch; the registry does not (the config schema and the Snakefile
# read it), so they load on first use.
_HEADS = ("InterventionHead", "GatedFP32Head", "fired")


def __getattr__(name: str):
    if name in _HEADS:
        from . import heads

        return getattr(heads, name)
    raise AttributeError(name)


@dataclass(frozen=True)
class Intervention:
    """One kind of intervention a config's `interventions:` entry may name.

    `options` is the JSON schema of its keys besides `kind` (defaults included: the config
    fills them in, so the cell's settings record every value used); `install` changes a
    model loaded in the cell's precision and returns it; `fp32_weights` loads the weights
    in fp32 instead (the oracle)."""

    name: str
    summary: str
    install: Callable[[Any, dict], Any]
    options: dict = field(default_factory=dict)
    fp32_weights: bool = False


def _head(kind: str) -> Callable[[Any, dict], Any]:
    def install(model, spec: dict):
        from .heads import InterventionHead

        head = model.get_output_embeddings()
        options = {k: spec[k] for k in ("tau", "gated", "top_k", "temperature") if k in spec}
        model.set_output_embeddings(InterventionHead(head, kind, **options))
        return model
    return install


_TAU = {"type": "number", "exclusiveMinimum": 0, "default": 1e-3,
        "description": "top-2 margin gate / bin width (logits)"}

# The intervention kinds a config may name: one entry per kind.
INTERVENTIONS: Registry[Intervention] = Registry("intervention kind", [
    Intervention("none", "no change", lambda model, spec: model),
    Intervention("quantize", "A: logits binned to multiples of tau", _head("quantize"), {"tau": _TAU}),
    Intervention("topk_fp32", "B: top_k candidates recomputed in fp32 when the margin is below tau",
                 _head("topk_fp32"), {"tau": _TAU, "top_k": {"type": "integer", "minimum": 2, "default": 8}}),
    Intervention("fp32_head", "C: the whole LM head recomputed in fp32, gated by margin < tau or always",
                 _head("fp32_head"), {"tau": _TAU, "gated": {"type": "boolean", "default": True}}),
    Intervention("sharpen", "logits divided by a temperature below 1 (cannot change greedy tokens)",
                 _head("sharpen"), {"temperature": {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                                                    "default": 0.5}}),
    Intervention("global_fp32", "16-bit weights, fp32 compute", lambda model, spec: model.float()),
    Intervention("fp32_oracle", "fp32 weights and compute", lambda model, spec: model, fp32_weights=True),
])


def weights_precision(spec: dict[str, Any], precision: str) -> str:
    """The precision to load a cell's weights in: fp32 for the oracle, else the cell's."""
    return "fp32" if INTERVENTIONS[spec.get("kind", "none")].fp32_weights else precision


def apply_to_model(model, spec: dict[str, Any]):
    """Install the intervention a config entry describes; returns the model."""
    kind = spec.get("kind", "none")
    if kind not in INTERVENTIONS:
        raise ValueError(f"unknown intervention {kind!r}; known: {INTERVENTIONS.names()}")
    return INTERVENTIONS[kind].install(model, spec)
