"""Why two greedy token streams parted, per diverged prompt: at the first differing token, an
exact tie, a near-tie or drift; then whether the texts come back together.

arXiv 2609.26621 §I.3: "a token can flip when a competitor's differential perturbation
exceeds its original logit gap". The gap that no perturbation can be smaller than is one step
of the format the logits were computed in, at the logit's magnitude (bf16 keeps 8 significant
bits: at 24.5 one step is 0.125; fp16 keeps 11, fp32 24). So, at the step where they part:

- `exact tie`: a side's top two logits are equal (its choice was the tie-break);
- `unexplained`: no tie, and a side chose a token other than its own top-scored one: a rule
  acting after the scores (a penalty or processor a live server applies) decided (read from
  the ranks, so a server's logprobs show it too);
- `near-tie`: a side's top-1 minus top-2 margin is at most one step of its precision from
  the logit of larger magnitude toward the other (at a power of two, the finer step below
  it): one rounding of either logit can reverse it;
- `drift`: wider margins and each side chose its own top token, so the logits themselves had
  moved apart by more than one step of the precision by that step: the computation differed,
  not the last rounding;
- `ended`: one stream ended where the other went on (a stop string, the length limit, a
  server dropping its end token);
- `sampled`: not greedy: the chosen token need not be the top one, so a margin explains
  nothing;
- `no logits`: the two sides' scores are not raw logits of one kind (a server's logprobs
  hold no logit magnitude), so neither the step nor the drift can be read.

They `rejoin` when, after parting, the two streams share a run of REJOIN_RUN tokens again in
the same order (difflib's matching blocks): a reworded step that returns to the same text.
"""

from __future__ import annotations

import difflib
import math

# Significant bits (the implicit one included) and the smallest normal exponent of each format.
FORMATS = {"fp32": (24, -126), "bf16": (8, -126), "fp16": (11, -14)}

# Four tokens (about three words) again in the same order: longer than the one- and two-token
# runs (a space, a digit, "the") that two unrelated texts share by chance.
REJOIN_RUN = 4

CAUSES = ("exact tie", "near-tie", "drift", "unexplained", "ended", "sampled", "no logits")
CAUSE_WORDS = {
    "exact tie": "a side's top two logits were equal: its tie-break chose the token",
    "near-tie": "a side's top-1 minus top-2 margin was within one step of its precision at that logit: one "
                "rounding could reverse it",
    "drift": "both margins were wider than one step of the precision and each side chose its own top token: "
             "the logits themselves had moved apart, not by the last rounding",
    "unexplained": "no tie, and a side chose a token below its own top score: a rule acting after the scores "
                   "(a penalty or processor) decided",
    "ended": "one stream ended where the other went on",
    "sampled": "not greedy: the chosen token need not be the top one",
    "no logits": "the two sides' scores are not raw logits of one kind: the step of precision cannot be read",
}


def logits_precision(meta: dict) -> str:
    """The format a cell's logits were computed in: the engine's recorded activations where
    it records them (llama.cpp computes in fp32 whatever its KV cache type), else the cell's
    precision (transformers' LM head outputs its dtype; vLLM's logits follow the model's)."""
    return str((meta.get("engine") or {}).get("activations") or meta["cell"]["precision"])


def resolution(value: float, precision: str) -> float:
    """One step of `precision` at |value| (the spacing of representable numbers there):
    2^(e − (p − 1)) for a value in [2^e, 2^(e+1)), p significant bits; at 0 (and among the
    subnormals) the smallest subnormal step."""
    bits, min_exp = FORMATS[precision]
    if value == 0:
        return 2.0 ** (min_exp - (bits - 1))
    mantissa, exp = math.frexp(abs(float(value)))  # value = mantissa · 2^exp, 0.5 ≤ mantissa < 1
    return 2.0 ** (max(exp - 1, min_exp) - (bits - 1))


def step_between(larger: float, smaller_magnitude: float, precision: str) -> float:
    """One step of `precision` from the logit of larger magnitude toward the other one (their
    gap lies below it in magnitude): at an exact power of two that is the finer spacing of
    the binade below (bf16: 32.0 − 31.75 is two steps of 0.125, not one of 0.25)."""
    bits, min_exp = FORMATS[precision]
    mantissa, exp = math.frexp(abs(float(larger)))
    if mantissa == 0.5 and exp - 1 > min_exp and abs(smaller_magnitude) < abs(larger):
        return 2.0 ** (exp - 2 - (bits - 1))
    return resolution(larger, precision)


def cause(margins: tuple[float | None, float | None], tops: tuple[float | None, float | None],
          precisions: tuple[str, str], chose_top: tuple[bool, bool] = (True, True), *, ended: bool = False,
          greedy: bool = True, logits: bool = True) -> str:
    """The label of one divergence (see the module's docstring): each side's top-1 minus
    top-2 margin and top logit at the step where they part, the precision each side's logits
    were computed in, and whether each side chose its own top-scored token there. A margin is
    judged in steps between its two logits (`step_between`)."""
    if not greedy:
        return "sampled"
    if ended:
        return "ended"
    if any(m is None or math.isnan(m) for m in margins):
        return "no logits"
    if min(margins) == 0:
        return "exact tie"
    if not all(chose_top):  # read from the ranks alone: a server's logprobs tell it too
        return "unexplained"
    if not logits or any(t is None or math.isnan(t) for t in tops):
        return "no logits"
    if any(margin <= step_between(*sorted((top, top - margin), key=abs, reverse=True), prec)
           for margin, top, prec in zip(margins, tops, precisions)):
        return "near-tie"
    return "drift"


def rejoin_step(tokens_a: list[int], tokens_b: list[int], first_div: int) -> int | None:
    """The step (in a's stream) where the two streams, after parting at `first_div`, share
    REJOIN_RUN tokens in a row again; None if they never do."""
    tail_a, tail_b = list(tokens_a[first_div:]), list(tokens_b[first_div:])
    matcher = difflib.SequenceMatcher(None, tail_a, tail_b, autojunk=False)
    for block in matcher.get_matching_blocks():
        if block.size >= REJOIN_RUN:
            return first_div + block.a
    return None
