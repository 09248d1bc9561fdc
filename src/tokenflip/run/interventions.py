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

Model-level ones (torch code in `tokenflip.run.model_edits`):

- `global_fp32`: 16-bit weights, everything computed in fp32; `fp32_oracle`: fp32 weights;
  `fp32_matmul`: only the matrix products in fp32, their outputs rounded back to 16 bit.
- `fp32_head` with `scope: final_norm | last_layer`: the broader FP32 scope of §7.6 (the
  final norm, and the last decoder layer, always in fp32 before the head's recomputation).
- `fp8_weights`: weights rounded to FP8 with a per-row scale, compute in the cell's
  precision: FP8 storage emulated (App. XV ran FP8 kernels on hardware that has them).
- `consensus`: each step runs the model in several precisions and takes the argmax of the
  mean of their logits, so every precision's cell decodes the same tokens (§4.4, §I.7:
  perfect agreement at about twice the compute).
- `compose`: several of the above applied in order (e.g. FP8 weights, then gated C).

The wrapped model still works with `generate()`: `GatedFP32Head.wrap(model, tau)` is the
public entry point for C.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from tokenflip.core.registry import Registry, kinds_schema

# The head modules need torch; the registry does not (the config schema and the Snakefile
# read it), so they load on first use.
_HEADS = ("InterventionHead", "GatedFP32Head", "fired")


def __getattr__(name: str):
    if name in _HEADS:
        from tokenflip.run import heads

        return getattr(heads, name)
    raise AttributeError(name)


@dataclass(frozen=True)
class Intervention:
    """One kind of intervention a config's `interventions:` entry may name.

    `options` is the JSON schema of its keys besides `kind` (defaults included: the config
    fills them in, so the cell's settings record every value used); `install` changes a
    model loaded in the cell's precision and returns it; `fp32_weights` loads the weights
    in fp32 instead (the oracle); with `loads`, `install` also receives a function that
    loads the model in another precision (`install(model, spec, load)`)."""

    name: str
    summary: str
    install: Callable[..., Any]
    options: dict = field(default_factory=dict)
    fp32_weights: bool = False
    loads: bool = False


def _head(kind: str) -> Callable[[Any, dict], Any]:
    def install(model, spec: dict):
        from tokenflip.run.heads import InterventionHead

        if spec.get("scope", "head") != "head":
            from tokenflip.run.model_edits import fp32_scope

            model = fp32_scope(model, spec["scope"])
        head = model.get_output_embeddings()
        options = {k: spec[k] for k in ("tau", "gated", "top_k", "temperature") if k in spec}
        model.set_output_embeddings(InterventionHead(head, kind, **options))
        return model
    return install


_TAU = {"type": "number", "exclusiveMinimum": 0, "default": 1e-3,
        "description": "top-2 margin gate / bin width (logits)"}
_PRECISION = {"enum": ["fp32", "bf16", "fp16"]}


def _fp32_matmul(model, spec: dict):
    from tokenflip.run.model_edits import fp32_matmul

    return fp32_matmul(model)


def _fp8(model, spec: dict):
    from tokenflip.run.model_edits import fp8_weights

    return fp8_weights(model, spec["scope"], spec["format"])


def _consensus(model, spec: dict, load):
    from tokenflip.run.model_edits import consensus

    return consensus(model, spec["precisions"], load)


def _compose(model, spec: dict, load):
    for step in spec["of"]:
        copies = getattr(model, "copies", None)
        if copies is None:
            model = apply_to_model(model, step, load)
        else:  # after consensus: every precision's copy gets the step
            for i, copy in enumerate(copies):
                copies[i] = apply_to_model(copy, step, load)
    return model


# Kinds that wrap the LM head (one wrapper per model).
HEAD_KINDS = ("quantize", "topk_fp32", "fp32_head", "sharpen")


def spec_problems(name: str, spec: dict[str, Any]):
    """What the schema cannot say about an entry: how the steps of a `compose` combine."""
    kinds = [step.get("kind") for step in _steps(spec)]
    where = f"interventions.{name}.of"
    if "consensus" in kinds[1:]:
        yield (f"{where}: 'consensus' can only be the first step (it loads the model in each of its "
               "precisions; the steps after it apply to every copy)")
    heads = [kind for kind in kinds if kind in HEAD_KINDS]
    if len(heads) > 1:
        yield f"{where}: at most one LM-head intervention per entry, got {heads}"
    if heads and "fp8_weights" in kinds and kinds.index("fp8_weights") > kinds.index(heads[0]):
        yield f"{where}: 'fp8_weights' must come before {heads[0]!r} (it rounds the plain LM head)"
    if "consensus" in kinds and "fp32_oracle" in kinds:
        yield f"{where}: 'consensus' loads its own precisions, so 'fp32_oracle' would have no effect"


# The intervention kinds a config may name: one entry per kind.
INTERVENTIONS: Registry[Intervention] = Registry("intervention kind", [
    Intervention("none", "no change", lambda model, spec: model),
    Intervention("quantize", "A: logits binned to multiples of tau", _head("quantize"), {"tau": _TAU}),
    Intervention("topk_fp32", "B: top_k candidates recomputed in fp32 when the margin is below tau",
                 _head("topk_fp32"), {"tau": _TAU, "top_k": {"type": "integer", "minimum": 2, "default": 8}}),
    Intervention("fp32_head", "C: the whole LM head recomputed in fp32, gated by margin < tau or always",
                 _head("fp32_head"), {
                     "tau": _TAU, "gated": {"type": "boolean", "default": True},
                     # No default: absent means the head alone, so cells made before the
                     # option existed keep their recorded settings.
                     "scope": {"enum": ["head", "final_norm", "last_layer"],
                               "description": "fp32 beyond the head (§7.6): the final norm, and the last layer; "
                                              "absent: the head only"}}),
    Intervention("sharpen", "logits divided by a temperature below 1 (cannot change greedy tokens)",
                 _head("sharpen"), {"temperature": {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                                                    "default": 0.5}}),
    Intervention("global_fp32", "16-bit weights, fp32 compute", lambda model, spec: model.float()),
    Intervention("fp32_matmul", "every linear layer multiplies in fp32, its output rounded back to 16 bit (§7.6)",
                 _fp32_matmul),
    Intervention("fp32_oracle", "fp32 weights and compute", lambda model, spec: model, fp32_weights=True),
    Intervention("fp8_weights", "weights rounded to FP8 (per-row scale), compute in the cell's precision: "
                 "emulated FP8", _fp8, {
                     "scope": {"enum": ["all", "body"], "default": "all",
                               "description": "all linear layers, or the decoder layers only (the head kept)"},
                     "format": {"enum": ["e4m3", "e5m2"], "default": "e4m3"}}),
    Intervention("consensus", "every step in each precision, argmax of the mean of their logits", _consensus, {
        "precisions": {"type": "array", "minItems": 2, "uniqueItems": True, "items": _PRECISION,
                       "default": ["bf16", "fp16"]}}, loads=True),
])

# `compose` lists other kinds' entries in full (not by name), so a cell's settings record
# every option of every step.
INTERVENTIONS.register(Intervention(
    "compose", "several interventions applied in order", _compose, {
        "of": {"type": "array", "minItems": 2,
               "items": kinds_schema({name: entry.options for name, entry in INTERVENTIONS.items()},
                                     {"kind": {"type": "string"}}),
               "description": "the interventions in the order they are applied, each written in full"}},
    loads=True))


NO_INTERVENTION = "none"


def is_no_intervention(spec: dict[str, Any] | None) -> bool:
    """Whether a config entry changes nothing: known by its kind, never by its label (a
    study may call its baseline `baseline: {kind: none}`)."""
    return isinstance(spec, dict) and spec.get("kind", NO_INTERVENTION) == NO_INTERVENTION


def no_intervention_labels(config: dict[str, Any]) -> tuple[str, ...]:
    """The config's labels of entries that change nothing (usually just `none`)."""
    return tuple(sorted(label for label, spec in config.get("interventions", {}).items()
                        if is_no_intervention(spec)))


def _steps(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec["of"] if spec.get("kind") == "compose" else [spec]


def weights_precision(spec: dict[str, Any], precision: str) -> str:
    """The precision to load a cell's weights in: fp32 for the oracle, else the cell's."""
    oracle = any(INTERVENTIONS[step.get("kind", "none")].fp32_weights for step in _steps(spec))
    return "fp32" if oracle else precision


def apply_to_model(model, spec: dict[str, Any], load: Callable[[str], Any] | None = None):
    """Install the intervention a config entry describes; returns the model. `load(p)`
    loads the same model in precision p (for kinds that need another copy)."""
    kind = spec.get("kind", "none")
    if kind not in INTERVENTIONS:
        raise ValueError(f"unknown intervention {kind!r}; known: {INTERVENTIONS.names()}")
    entry = INTERVENTIONS[kind]
    if not entry.loads:
        return entry.install(model, spec)
    if load is None:
        raise ValueError(f"intervention {kind!r} loads the model in other precisions: pass `load`")
    return entry.install(model, spec, load)
