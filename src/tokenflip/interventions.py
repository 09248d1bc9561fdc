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

from typing import Any

import torch
from torch import nn

KINDS = ("none", "quantize", "topk_fp32", "fp32_head", "sharpen", "global_fp32", "fp32_oracle")


def _margin(logits: torch.Tensor) -> torch.Tensor:
    top = torch.topk(logits.float(), 2, dim=-1).values
    return top[..., 0] - top[..., 1]


class InterventionHead(nn.Module):
    """Wraps a Linear lm_head. `fired` holds, after each call, which rows the gate opened."""

    def __init__(self, head: nn.Linear, kind: str, tau: float = 1e-3, gated: bool = True, top_k: int = 8,
                 temperature: float = 0.5):
        super().__init__()
        if kind not in ("quantize", "topk_fp32", "fp32_head", "sharpen"):
            raise ValueError(f"not an lm_head intervention: {kind!r}")
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.head, self.kind, self.tau, self.gated, self.top_k = head, kind, float(tau), gated, int(top_k)
        self.temperature = float(temperature)
        self.fired: torch.Tensor | None = None

    @property
    def weight(self) -> torch.Tensor:  # tied-embedding code paths look for lm_head.weight
        return self.head.weight

    def _fp32(self, hidden: torch.Tensor, rows: torch.Tensor | None = None, chunk: int = 4096) -> torch.Tensor:
        """fp32 logits from the 16-bit hidden state and weights. The weight is upcast a
        block of vocabulary rows at a time: no full fp32 copy, and far less memory traffic."""
        weight = self.head.weight if rows is None else self.head.weight[rows]
        h = hidden.float()
        out = torch.cat([h @ weight[i:i + chunk].float().T for i in range(0, weight.shape[0], chunk)], dim=-1)
        bias = self.head.bias
        if bias is not None:
            out = out + (bias.float() if rows is None else bias[rows].float())
        return out

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)
        last = logits[:, -1]
        if self.kind in ("quantize", "sharpen"):
            self.fired = torch.ones(last.shape[0], dtype=torch.bool, device=last.device)
            out = logits.float()
            if self.kind == "quantize":
                out[:, -1] = torch.floor(out[:, -1] / self.tau) * self.tau
            else:
                out[:, -1] = out[:, -1] / self.temperature
            return out
        gate = _margin(last) < self.tau if self.gated else torch.ones(last.shape[0], dtype=torch.bool,
                                                                       device=last.device)
        self.fired = gate
        if not bool(gate.any()):
            return logits
        out = logits.float()
        rows = torch.nonzero(gate).flatten()
        if self.kind == "fp32_head":
            out[rows, -1] = self._fp32(hidden[rows, -1])
        else:
            cand = torch.topk(last[rows].float(), min(self.top_k, last.shape[-1]), dim=-1).indices
            for i, row in enumerate(rows.tolist()):
                exact = self._fp32(hidden[row, -1], cand[i])
                out[row, -1, cand[i]] = torch.floor(exact / self.tau) * self.tau
        return out


class GatedFP32Head(InterventionHead):
    """Margin-gated FP32 lm_head recomputation (intervention C) as a drop-in module."""

    def __init__(self, head: nn.Linear, tau: float = 1e-3, gated: bool = True):
        super().__init__(head, "fp32_head", tau=tau, gated=gated)

    @classmethod
    def wrap(cls, model, tau: float = 1e-3, gated: bool = True):
        """Replace `model`'s lm_head in place by the gated FP32 head; returns the model.
        Greedy `generate()` then recomputes the head in fp32 whenever the top-2 margin of
        the 16-bit logits is below `tau`."""
        head = model.get_output_embeddings()
        model.set_output_embeddings(cls(head, tau=tau, gated=gated))
        return model


def apply_to_model(model, spec: dict[str, Any]):
    """Install the intervention a config entry describes; returns the model."""
    kind = spec.get("kind", "none")
    if kind == "none":
        return model
    if kind == "global_fp32":
        return model.float()  # weights already rounded to the cell's 16-bit precision
    if kind in ("quantize", "topk_fp32", "fp32_head", "sharpen"):
        head = model.get_output_embeddings()
        model.set_output_embeddings(InterventionHead(head, kind, tau=spec.get("tau", 1e-3),
                                                     gated=spec.get("gated", True), top_k=spec.get("top_k", 8),
                                                     temperature=spec.get("temperature", 0.5)))
        return model
    if kind == "fp32_oracle":
        raise ValueError("fp32_oracle is applied when loading (fp32 weights), not to a loaded model")
    raise ValueError(f"unknown intervention {kind!r}; known: {KINDS}")


def fired(model) -> torch.Tensor | None:
    head = model.get_output_embeddings()
    return head.fired if isinstance(head, InterventionHead) else None
