"""The LM-head modules behind the head interventions (A, B, C and sharpening): a wrapped
Linear head that computes the usual 16-bit logits and changes the last position's.
See `tokenflip.run.interventions` for what each kind does and how a config names it."""

from __future__ import annotations

import torch
from torch import nn


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
        # The usual 16-bit logits from the hidden state as the head's dtype holds it; an fp32
        # scope before the head (transforms.fp32_scope) hands in fp32, which the recomputation
        # below then uses unrounded.
        logits = self.head(hidden.to(self.head.weight.dtype))
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


def fired(model) -> torch.Tensor | None:
    """Which rows the installed head's gate opened at the last call (None: no such head)."""
    head = model.get_output_embeddings()
    return head.fired if isinstance(head, InterventionHead) else None
