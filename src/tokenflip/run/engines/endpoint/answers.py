"""A server's answer checked before anything of it is read or recorded: the choice asked for
(index 0, one choice), the model asked for (or a dated snapshot of it), at most the tokens
asked, ids that are integers of the vocabulary, a step's top-k of distinct tokens and at
most the length asked (one more where the server adds the chosen token), scores that are
numbers, and strings of bounded length that UTF-8 can hold. A server that answers
otherwise is named with the request, and nothing of the cell is written."""

from __future__ import annotations

import math
from typing import Any

from tokenflip.core.excerpt import excerpt
from tokenflip.run.engines.endpoint.responses import TOKEN_ID_PREFIX

# The longest text one token may decode to, and a step's token string: far above any
# tokenizer's (128 spaces, a long byte sequence), far below what would fill a cell.
CHARS_PER_TOKEN = 1024
LARGEST_ID = 2 ** 31 - 1


def _number(value: Any) -> bool:
    """A score: an int or float, finite or −inf (a logprob of a token that cannot occur)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        (math.isfinite(value) or value == -math.inf)


def _token_id(value: Any, vocabulary: int | None) -> bool:
    """An integer id the vocabulary has (below 2^31 where its size is not known here)."""
    top = vocabulary - 1 if vocabulary else LARGEST_ID
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top


def _as_int(text: str) -> int | None:
    return int(text) if text.isdigit() and len(text) <= 10 else None


def _string(value: Any, longest: int) -> str | None:
    """Why `value` is not a string a cell can hold (None if it is)."""
    if not isinstance(value, str):
        return f"a {type(value).__name__} where a string belongs"
    if len(value) > longest:
        return f"a string of {len(value):,} characters (at most {longest:,})"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "a string with a lone surrogate, which UTF-8 cannot hold"
    return None


def _steps(choice: dict[str, Any], api: str) -> list[tuple[Any, Any, list[tuple[Any, Any]]]] | str:
    """(token, score, [(token, score), ...]) per step, or why the logprobs are malformed."""
    logprobs = choice.get("logprobs")
    if logprobs is None:
        return []
    if not isinstance(logprobs, dict):
        return "logprobs that are not an object"
    if api == "chat":
        content = logprobs.get("content") or []
        if not isinstance(content, list) or not all(isinstance(s, dict) for s in content):
            return "logprobs.content that is not a list of steps"
        steps = []
        for step in content:
            tops = step.get("top_logprobs") or []
            if not isinstance(tops, list) or not all(isinstance(t, dict) for t in tops):
                return "a step's top_logprobs that are not a list of tokens"
            steps.append((step.get("token"), step.get("logprob"), [(t.get("token"), t.get("logprob")) for t in tops]))
        return steps
    tokens, chosen, tops = (logprobs.get(key) for key in ("tokens", "token_logprobs", "top_logprobs"))
    tokens = tokens or []
    if not isinstance(tokens, list) or not isinstance(chosen or [], list) or not isinstance(tops or [], list):
        return "logprobs.tokens, token_logprobs or top_logprobs that are not lists"
    chosen = chosen if chosen is not None else [None] * len(tokens)
    tops = tops if tops is not None else [{}] * len(tokens)
    if not len(tokens) == len(chosen) == len(tops) or not all(isinstance(t, dict) or t is None for t in tops):
        return "logprobs.tokens, token_logprobs and top_logprobs of different lengths or kinds"
    return [(tok, score, list((top or {}).items())) for tok, score, top in zip(tokens, chosen, tops)]


def echoes(answer, key: str | None) -> bool:
    """Whether an answer (its body or headers) holds the API key it was sent: a server that
    would put the key in the cell's file, its report and every message quoting it."""
    import json

    return bool(key) and (key in json.dumps(answer.body, ensure_ascii=False) or
                          any(key in str(value) for value in answer.headers.values()))


def without_logprobs(answers, asked: bool) -> int | None:
    """The index of an answer that holds no logprobs where the cell asked for them and other
    answers of it hold some (a server that ignores the field is recorded as returning none;
    one that drops them from some answers would leave steps unscored), else None."""
    held = [a.body["choices"][0].get("logprobs") is not None for a in answers]
    return held.index(False) if asked and any(held) and not all(held) else None


def problem(data: dict[str, Any], body: dict[str, Any], api: str, k: int, vocabulary: int | None,
            served: frozenset = frozenset()) -> str | None:
    """What is wrong with answer `data` to request `body` (None if nothing): see the module.
    `served`: the model names the server lists (vLLM answers every alias by its first name)."""
    asked_tokens = int(body.get("max_tokens") or 0)
    choices = data["choices"]
    if len(choices) != 1:
        return f"{len(choices)} choices to a request for one"
    choice = choices[0]
    if not isinstance(choice, dict):
        return "a choice that is not an object"
    if choice.get("index", 0) != 0:
        return f"choice index {choice.get('index')!r} to a request for choice 0"
    model = data.get("model")
    if model is not None and (not isinstance(model, str) or not (model == body["model"] or model in served
                                                                 or model.startswith(f"{body['model']}-"))):
        return f"as model {excerpt(model)}, not the {body['model']!r} asked for"
    longest = CHARS_PER_TOKEN * max(asked_tokens, 1)
    if api == "chat":
        message = choice.get("message")
        if not isinstance(message, dict):
            return "a chat choice without its message"
        text = message.get("content")
    else:
        text = choice.get("text")
    if text is not None and (why := _string(text, longest)):
        return f"a text that is {why}"
    if (why := _string(choice.get("finish_reason") or "", 64)) is not None:
        return f"a finish_reason that is {why}"
    ids = choice.get("token_ids")
    if ids is not None:
        if not isinstance(ids, list):
            return "token_ids that are not a list"
        for i, t in enumerate(ids):
            if not _token_id(t, vocabulary):
                return (f"token id {repr(t)[:40]} at step {i}, not an integer of the vocabulary"
                        + (f" (0 to {vocabulary - 1})" if vocabulary else ""))
        if asked_tokens and len(ids) > asked_tokens:
            return f"{len(ids)} tokens to a request for at most {asked_tokens}"
        if not ids and choice.get("finish_reason") == "stop":
            return "an answer that stopped with no token (a stop is a token the model generated)"
    steps = _steps(choice, api)
    if isinstance(steps, str):
        return steps
    if asked_tokens and len(steps) > asked_tokens:
        return f"{len(steps)} steps to a request for at most {asked_tokens} tokens"
    for i, (token, score, tops) in enumerate(steps):
        if (why := _string(token, CHARS_PER_TOKEN)) is not None:
            return f"step {i}'s token as {why}"
        for name in (token, *(t for t, _ in tops)):
            if isinstance(name, str) and name.startswith(TOKEN_ID_PREFIX) and \
                    not _token_id(_as_int(name[len(TOKEN_ID_PREFIX):]), vocabulary):
                return f"{excerpt(name)} at step {i}, not a token id of the vocabulary"
        if score is not None and not _number(score):
            return f"step {i}'s logprob {excerpt(score)}, not a number"
        if len(tops) > k + 1:
            return f"{len(tops)} alternatives at step {i} to a request for {k}"
        # Two alternatives named by the same id are one token twice; the same text may be two tokens
        # (partial UTF-8 bytes a text server shows as one replacement character).
        ids = [t for t, _ in tops if isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX)]
        if len(set(ids)) != len(ids):
            return f"the same token twice among step {i}'s alternatives"
        for name, value in tops:
            if (why := _string(name, CHARS_PER_TOKEN)) is not None or not _number(value):
                return f"an alternative at step {i} that is not a token and its score ({excerpt(name)}: " \
                       f"{excerpt(value)})"
    return None
