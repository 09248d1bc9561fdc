"""The two OpenAI APIs an endpoint speaks, each with one parser of its answers' choices: a
completion (`text`, `logprobs.tokens`/`token_logprobs`/`top_logprobs`) and a chat answer
(`message.content`, `logprobs.content[].top_logprobs[]`) both become one `Choice`: its
text, finish reason, the server's ids where it returned them, and each step's token, score
and alternatives. The parser checks only the shape; what the values may be (ids of the
vocabulary, scores that are numbers, bounded strings) is `answers`' check, and what they
mean at the token level is `responses`' reading. The client, the checks, the recorder and
the probe of what a server's scores are all read answers through it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Step", "Choice", "Malformed", "Api", "COMPLETIONS", "CHAT", "api"]


@dataclass(frozen=True)
class Step:
    """One generated step: the token as the server names it, its score, and the top-k
    alternatives it listed, (token, score) in the server's order. Values are unchecked."""

    token: Any
    score: Any
    alternatives: tuple[tuple[Any, Any], ...]


@dataclass(frozen=True)
class Choice:
    """An answer's one choice, as either API returns it."""

    text: Any  # the generated text (None where the server sent none)
    finish_reason: Any
    token_ids: Any  # the server's own ids (vLLM's and SGLang's `return_token_ids`), else None
    steps: tuple[Step, ...]
    has_logprobs: bool  # the choice held a logprobs object at all


class Malformed(ValueError):
    """A choice whose shape neither API has: the message says what is wrong, as a clause that
    follows "answered" ("logprobs that are not an object")."""


@dataclass(frozen=True)
class Api:
    """One API: what a request asks for in it, and its parser."""

    name: str  # "completions" or "chat"

    def logprob_fields(self, k: int) -> dict[str, Any]:
        """The request fields that ask for each step's top-k logprobs."""
        return {"logprobs": True, "top_logprobs": k} if self.name == "chat" else {"logprobs": k}

    def probe_body(self, model: str, k: int) -> dict[str, Any]:
        """A request of two greedy tokens with `k` alternatives each, on a one-word prompt."""
        prompt = {"messages": [{"role": "user", "content": "The"}]} if self.name == "chat" else {"prompt": "The"}
        return {"model": model, "max_tokens": 2, "temperature": 0.0, **prompt, **self.logprob_fields(k)}

    def parse(self, choice: Any) -> Choice:
        """`choice` as a `Choice`, or `Malformed` saying what of its shape is wrong."""
        if not isinstance(choice, dict):
            raise Malformed("a choice that is not an object")
        if self.name == "chat":
            message = choice.get("message")
            if not isinstance(message, dict):
                raise Malformed("a chat choice without its message")
            text = message.get("content")
        else:
            text = choice.get("text")
        logprobs = choice.get("logprobs")
        if logprobs is not None and not isinstance(logprobs, dict):
            raise Malformed("logprobs that are not an object")
        steps = () if logprobs is None else (_chat_steps if self.name == "chat" else _completion_steps)(logprobs)
        return Choice(text, choice.get("finish_reason"), choice.get("token_ids"), steps, logprobs is not None)


def _chat_steps(logprobs: dict[str, Any]) -> tuple[Step, ...]:
    content = logprobs.get("content") or []
    if not isinstance(content, list) or not all(isinstance(step, dict) for step in content):
        raise Malformed("logprobs.content that is not a list of steps")
    steps = []
    for step in content:
        tops = step.get("top_logprobs") or []
        if not isinstance(tops, list) or not all(isinstance(top, dict) for top in tops):
            raise Malformed("a step's top_logprobs that are not a list of tokens")
        steps.append(Step(step.get("token"), step.get("logprob"),
                          tuple((top.get("token"), top.get("logprob")) for top in tops)))
    return tuple(steps)


def _completion_steps(logprobs: dict[str, Any]) -> tuple[Step, ...]:
    tokens, chosen, tops = (logprobs.get(key) for key in ("tokens", "token_logprobs", "top_logprobs"))
    tokens = tokens or []
    if not isinstance(tokens, list) or not isinstance(chosen or [], list) or not isinstance(tops or [], list):
        raise Malformed("logprobs.tokens, token_logprobs or top_logprobs that are not lists")
    chosen = chosen if chosen is not None else [None] * len(tokens)
    tops = tops if tops is not None else [{}] * len(tokens)
    if not len(tokens) == len(chosen) == len(tops) or not all(isinstance(t, dict) or t is None for t in tops):
        raise Malformed("logprobs.tokens, token_logprobs and top_logprobs of different lengths or kinds")
    return tuple(Step(token, score, tuple((top or {}).items())) for token, score, top in zip(tokens, chosen, tops))


COMPLETIONS = Api("completions")
CHAT = Api("chat")


def api(name: str) -> Api:
    """The API an endpoint entry's `api` names."""
    return {"completions": COMPLETIONS, "chat": CHAT}[name]
