"""Token selection for a decoding strategy: greedy, or sampling with temperature, top-k
and top-p applied by transformers' own logits warpers (in generate()'s order).

Sampling draws from one torch.Generator per prompt, seeded from (run seed, prompt id), so
two cells that differ only in cache mode or precision draw the same random numbers for
the same prompt, whatever batch it lands in: any divergence then comes from the logits.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch

from tokenflip.run.decode import TokenSelector, greedy


def prompt_seed(run_seed: int, prompt_id: str) -> int:
    digest = hashlib.sha256(f"{run_seed}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _warpers(spec: dict[str, Any]):
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = LogitsProcessorList()
    temperature = float(spec.get("temperature", 1.0))
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if spec.get("top_k"):
        warpers.append(TopKLogitsWarper(int(spec["top_k"])))
    if spec.get("top_p") is not None and float(spec["top_p"]) < 1.0:
        warpers.append(TopPLogitsWarper(float(spec["top_p"])))
    return warpers


def make_selector(spec: dict[str, Any], prompt_ids: Sequence[str], run_seed: int,
                  device: torch.device | str = "cpu") -> TokenSelector:
    """The selector for one batch whose rows are the prompts `prompt_ids`."""
    if spec["strategy"] == "greedy":
        return greedy
    if spec["strategy"] != "sample":
        raise ValueError(f"unknown decoding strategy {spec['strategy']!r}")
    warpers = _warpers(spec)
    generators = []
    for pid in prompt_ids:
        g = torch.Generator(device=device)
        g.manual_seed(prompt_seed(run_seed, pid))
        generators.append(g)

    def sample(logits: torch.Tensor, step: int) -> torch.Tensor:
        scores = warpers(None, logits.clone())
        probs = torch.softmax(scores, dim=-1)
        rows = [torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generators)]
        return torch.cat(rows)

    return sample
