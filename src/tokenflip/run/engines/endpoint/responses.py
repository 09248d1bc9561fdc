"""A live endpoint's answer, read at the token level: the generated ids (the server's own
where it returns them, vLLM's `return_token_ids` or `token_id:N` strings; else the text
re-tokenised with the model's tokenizer and checked by a round trip, marked "ids from
text"), each step's top-k scores (logprobs or raw logits, as the endpoint's `scores` says:
never mixed), and where the server chose a token that is not its own top score (a
repetition penalty, a logit bias, a stop it adds): a finding, with its steps, not a
divergence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
import numpy as np

from tokenflip.run.engines.endpoint.protocol import Choice

TOKEN_ID_PREFIX = "token_id:"


@dataclass
class Read:
    """One answer at the token level."""

    token_ids: list[int]
    top_ids: np.ndarray  # steps x k (-1 where the server named fewer, or no logprobs)
    top_scores: np.ndarray  # steps x k (NaN where absent)
    chosen_scores: list[float]
    text: str
    finish_reason: str
    ids_from: str  # "server" or "text"
    round_trip: bool  # the ids decode to the text the server sent
    off_top_steps: list[int] = field(default_factory=list)  # steps where the chosen token was not the top score


class Vocabulary:
    """Token text -> id, for servers that name tokens by their text (built once, lazily):
    a text several ids decode to maps to none."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._map: dict[str, int] | None = None

    def id_of(self, token: str) -> int:
        if token.startswith(TOKEN_ID_PREFIX) and token[len(TOKEN_ID_PREFIX):].isdigit():
            return int(token[len(TOKEN_ID_PREFIX):])
        if hasattr(self.tokenizer, "id_of_text"):  # a server's tokenizer: asked per token, not listed
            return self.tokenizer.id_of_text(token)
        if self._map is None:
            seen: dict[str, int] = {}
            for i in range(len(self.tokenizer)):
                text = self.tokenizer.decode([i])
                seen[text] = -1 if text in seen else i
            self._map = seen
        return self._map.get(token, -1)


def read(choice: Choice, k: int, tokenizer, vocabulary: Vocabulary, eos_if_stopped: int | None = None) -> Read:
    """One choice of an answer (parsed by its API's parser and checked by `answers`) at the
    token level (see the module's docstring). `eos_if_stopped`: the end-of-sequence id a
    text-only server's `stop` stands for (where the cell has no stop strings, `stop` can only
    be the model's end of sequence, which every engine's ids hold and a server's text does
    not)."""
    text = choice.text or ""
    steps = [(step.token, math.nan if step.score is None else float(step.score),
              [(token, float(score)) for token, score in step.alternatives]) for step in choice.steps]
    step_ids = [vocabulary.id_of(tok) for tok, _, _ in steps]
    if isinstance(choice.token_ids, list):
        ids, source = [int(t) for t in choice.token_ids], "server"
    elif steps and all(tok.startswith(TOKEN_ID_PREFIX) for tok, _, _ in steps):
        ids, source = step_ids, "server"
    else:
        encoded = tokenizer(text, add_special_tokens=False)["input_ids"]
        # The server's own steps, where each names one token and they spell its text.
        ids = step_ids if steps and -1 not in step_ids and tokenizer.decode(step_ids) == text else encoded
        source = "text"
        if choice.finish_reason == "stop" and eos_if_stopped is not None:
            ids = [*ids, int(eos_if_stopped)]
    n = len(ids)
    top_ids = np.full((n, k), -1, dtype=np.int64)
    top_scores = np.full((n, k), np.nan, dtype=np.float32)
    chosen_scores = [math.nan] * n
    off_top: list[int] = []
    for step, (_tok, score, alternatives) in enumerate(steps[:n]):
        # Best first; equal scores in the server's own order (vLLM lists its top-k in the
        # order of its ranks, which an exact tie does not decide by id).
        ranked = sorted(((vocabulary.id_of(t), s) for t, s in alternatives), key=lambda p: -p[1])[:k]
        for j, (token, value) in enumerate(ranked):
            top_ids[step, j], top_scores[step, j] = token, value
        chosen_scores[step] = score
        if ranked and score < ranked[0][1]:
            off_top.append(step)
    round_trip = tokenizer.decode(ids, skip_special_tokens=True) == text if source == "text" else True
    return Read(ids, top_ids, top_scores, chosen_scores, text, choice.finish_reason or "length", source,
                round_trip, off_top)


def scores_kind(reads: list[Read], declared: str) -> str:
    """What the scores of a cell are: `declared` (the endpoint's `scores`), checked: a
    logprob is never above 0 and a step's probabilities never sum above 1, so scores that do
    are raw logits whatever the entry says (refused); "none" where no step has one."""
    values = [r.top_scores[np.isfinite(r.top_scores)] for r in reads]
    values = [v for v in values if v.size]
    if not values:
        return "none"
    if declared == "logprobs":
        for read in reads:
            finite = np.where(np.isfinite(read.top_scores), read.top_scores, -np.inf).astype(np.float64)
            if np.any(finite > 1e-4) or np.any(np.log(np.exp(finite).sum(axis=1)) > 1e-3):
                from tokenflip.run.engines.endpoint.client import EndpointError

                raise EndpointError("the endpoint's scores are above what a logprob can be (raw logits?): set its "
                                    "`scores: raw_logits`")
    return declared
