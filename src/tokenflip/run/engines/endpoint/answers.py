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
from tokenflip.run.engines.endpoint import protocol
from tokenflip.run.engines.endpoint.protocol import Choice, Malformed, Step
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


def echoes(answer, key: str | None) -> bool:
    """Whether an answer (its body or headers) holds the API key it was sent: a server that
    would put the key in the cell's file, its report and every message quoting it."""
    import json

    return bool(key) and (key in json.dumps(answer.body, ensure_ascii=False) or
                          any(key in str(value) for value in answer.headers.values()))


def without_logprobs(answers: list[Choice], asked: bool) -> int | None:
    """The index of an answer (its parsed choice) that holds no logprobs where the cell asked for them and other
    answers of it hold some (a server that ignores the field is recorded as returning none;
    one that drops them from some answers would leave steps unscored), else None."""
    held = [choice.has_logprobs for choice in answers]
    return held.index(False) if asked and any(held) and not all(held) else None


def problem(data: dict[str, Any], body: dict[str, Any], api: str, k: int, vocabulary: int | None,
            served: frozenset = frozenset()) -> str | None:
    """What is wrong with answer `data` to request `body` (None if nothing): see `checked`."""
    try:
        checked(data, body, api, k, vocabulary, served)
    except Malformed as exc:
        return str(exc)
    return None


def checked(data: dict[str, Any], body: dict[str, Any], api: str, k: int, vocabulary: int | None,
            served: frozenset = frozenset()) -> Choice:
    """Answer `data` to request `body`'s one choice, parsed by its API's parser and checked
    (see the module), or `Malformed` saying what is wrong. `served`: the model names the
    server lists (vLLM answers every alias by its first name)."""
    asked_tokens = int(body.get("max_tokens") or 0)
    choices = data["choices"]
    if len(choices) != 1:
        raise Malformed(f"{len(choices)} choices to a request for one")
    if not isinstance(choices[0], dict):
        raise Malformed("a choice that is not an object")
    if choices[0].get("index", 0) != 0:
        raise Malformed(f"choice index {choices[0].get('index')!r} to a request for choice 0")
    model = data.get("model")
    if model is not None and (not isinstance(model, str) or not (model == body["model"] or model in served
                                                                 or model.startswith(f"{body['model']}-"))):
        raise Malformed(f"as model {excerpt(model)}, not the {body['model']!r} asked for")
    choice = protocol.api(api).parse(choices[0])
    longest = CHARS_PER_TOKEN * max(asked_tokens, 1)
    if choice.text is not None and (why := _string(choice.text, longest)):
        raise Malformed(f"a text that is {why}")
    if (why := _string(choice.finish_reason or "", 64)) is not None:
        raise Malformed(f"a finish_reason that is {why}")
    ids = choice.token_ids
    if ids is not None:
        if not isinstance(ids, list):
            raise Malformed("token_ids that are not a list")
        for i, t in enumerate(ids):
            if not _token_id(t, vocabulary):
                raise Malformed(f"token id {repr(t)[:40]} at step {i}, not an integer of the vocabulary"
                                + (f" (0 to {vocabulary - 1})" if vocabulary else ""))
        if asked_tokens and len(ids) > asked_tokens:
            raise Malformed(f"{len(ids)} tokens to a request for at most {asked_tokens}")
        if not ids and choice.finish_reason == "stop":
            raise Malformed("an answer that stopped with no token (a stop is a token the model generated)")
    if asked_tokens and len(choice.steps) > asked_tokens:
        raise Malformed(f"{len(choice.steps)} steps to a request for at most {asked_tokens} tokens")
    for i, step in enumerate(choice.steps):
        _check_step(i, step, k, vocabulary)
    return choice


def _check_step(i: int, step: Step, k: int, vocabulary: int | None) -> None:
    if (why := _string(step.token, CHARS_PER_TOKEN)) is not None:
        raise Malformed(f"step {i}'s token as {why}")
    for name in (step.token, *(t for t, _ in step.alternatives)):
        if isinstance(name, str) and name.startswith(TOKEN_ID_PREFIX) and \
                not _token_id(_as_int(name[len(TOKEN_ID_PREFIX):]), vocabulary):
            raise Malformed(f"{excerpt(name)} at step {i}, not a token id of the vocabulary")
    if step.score is not None and not _number(step.score):
        raise Malformed(f"step {i}'s logprob {excerpt(step.score)}, not a number")
    if len(step.alternatives) > k + 1:
        raise Malformed(f"{len(step.alternatives)} alternatives at step {i} to a request for {k}")
    # Two alternatives named by the same id are one token twice; the same text may be two tokens
    # (partial UTF-8 bytes a text server shows as one replacement character).
    ids = [t for t, _ in step.alternatives if isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX)]
    if len(set(ids)) != len(ids):
        raise Malformed(f"the same token twice among step {i}'s alternatives")
    for name, value in step.alternatives:
        if (why := _string(name, CHARS_PER_TOKEN)) is not None or not _number(value):
            raise Malformed(f"an alternative at step {i} that is not a token and its score ({excerpt(name)}: "
                            f"{excerpt(value)})")
