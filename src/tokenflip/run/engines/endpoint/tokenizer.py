"""Whose tokenizer encodes an endpoint's prompts: the check, before any job, that the local
tokenizer is the served model's. An endpoint's cells send prompts as ids (or as text the
ids spell) and read its answers back into ids, so a tokenizer that is not the served
model's makes every figure of the study garbage while the study runs fine.

The check encodes a probe text locally and asks the server for its own ids of the same
text, by the route it offers: vLLM and SGLang `POST /tokenize`, llama.cpp's C++ server the
same route with its own fields, llama-cpp-python's server `POST /extras/tokenize`. A
server with none of them (an OpenAI-compatible gateway, say) is checked by the tokens it
returns for a short completion of the probe: each must be a token of the local vocabulary.
"""

from __future__ import annotations

from typing import Any

from tokenflip.models.served_tokenizer import PROBE_TEXT

# The ids shown in a refusal (enough to see where two tokenizers part).
SHOWN_IDS = 12
# Where the server offers no tokenize route: the share of its returned tokens the local
# vocabulary may not spell (a byte of a multi-byte character comes back as text that no
# one token decodes to) before the tokenizer is called another model's.
UNSPELLED_ALLOWED = 0.25


def server_ids(spec: dict[str, Any], text: str, timeout: float = 10.0) -> tuple[list[int] | None, str]:
    """The server's own ids of `text` and the route that gave them, or (None, why none did)."""
    from tokenflip.core.bounded_http import fetch_json
    from tokenflip.models.servers import families, root_url, token_ids
    from tokenflip.models.served_tokenizer import headers

    tried = []
    for family in families(spec.get("server", "openai")):
        url = root_url(spec["url"]) + family.tokenize
        try:
            status, answer, _ = fetch_json("POST", url, body=family.tokenize_body(spec["model"], text, False),
                                           headers=headers(spec), timeout=timeout)
            tokens = token_ids(answer) if status == 200 else None
        except Exception as exc:  # noqa: BLE001 - a route the server lacks, garbles or floods: the next one
            tried.append(f"{url}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}")
            continue
        if tokens:
            return tokens, url
        tried.append(f"{url}: {status}")
    return None, "no tokenize route answered (" + "; ".join(tried) + ")"


def _shown(ids: list[int]) -> str:
    more = f", ... ({len(ids)} ids)" if len(ids) > SHOWN_IDS else ""
    return "[" + ", ".join(map(str, ids[:SHOWN_IDS])) + more + "]"


def mismatch(spec: dict[str, Any], tokenizer, label: str, name: str) -> str | None:
    """Why `tokenizer` (called `label` in the message) is not the tokenizer of the model
    endpoint `name` serves; None where the server's own ids of the probe text are the local
    ones (a beginning-of-sequence id the server adds is not a difference)."""
    local = list(tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])
    remote, route = server_ids(spec, PROBE_TEXT)
    where = f"endpoint {name!r} ({spec['url']}, model {spec['model']!r})"
    if remote is not None:
        bos = getattr(tokenizer, "bos_token_id", None)
        if remote[:1] == [bos] and local[:1] != [bos]:
            remote = remote[1:]
        if remote == local:
            return None
        return (f"{where} does not use the tokenizer of {label}: the probe text {PROBE_TEXT[:40]!r}... is "
                f"{_shown(remote)} at {route} but {_shown(local)} with {label}. Name the served model's "
                f"tokenizer (`--tokenizer`, or the model entry; `tokenizer_only: true` needs no weights)")
    return _unspelled(spec, tokenizer, label, where, route)


def _unspelled(spec: dict[str, Any], tokenizer, label: str, where: str, why_no_route: str) -> str | None:
    """The check of a server without a tokenize route: the tokens it returns for a short
    completion of the probe text, against the local vocabulary."""
    import asyncio

    from tokenflip.run.engines.endpoint import client
    from tokenflip.run.engines.endpoint.responses import Vocabulary

    chat = spec.get("api") == "chat"
    body = {"model": spec["model"], "max_tokens": 16, "temperature": 0.0,
            **({"logprobs": True, "top_logprobs": 5, "messages": [{"role": "user", "content": PROBE_TEXT}]} if chat
               else {"logprobs": 5, "prompt": PROBE_TEXT})}
    probe_spec = {**spec, "api": "chat" if chat else "completions", "retries": 1,
                  "timeout_s": min(float(spec.get("timeout_s") or 60), 60.0)}

    async def ask():
        api = client.client(probe_spec, 1)
        async with api:
            return await client.request(api, probe_spec, body, "the tokenizer probe")

    try:
        choice = asyncio.run(ask()).body["choices"][0]
        tokens = _returned_tokens(choice, chat)
    except (client.EndpointError, LookupError, TypeError, AttributeError, ValueError) as exc:
        return _unchecked(where, f"{why_no_route}; the probe completion failed: {exc}")
    if not tokens:
        return _unchecked(where, f"{why_no_route}, and its completions return no tokens (logprobs)")
    vocabulary = Vocabulary(tokenizer)
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else float("inf")  # a server's names no size
    unspelled = sorted(t for t in tokens if not 0 <= vocabulary.id_of(t) < size)  # `token_id:N` too
    if len(unspelled) <= UNSPELLED_ALLOWED * len(tokens):
        return None
    return (f"{where} does not use the tokenizer of {label}: {len(unspelled)} of the {len(tokens)} tokens it "
            f"returned are no token of {label} (e.g. {unspelled[:5]}; {why_no_route}). Name the served model's "
            f"tokenizer (`--tokenizer`, or the model entry; `tokenizer_only: true` needs no weights)")


def label_of(name: str, spec: dict[str, Any]) -> str:
    """A model entry as a refusal names it: its name and where its tokenizer comes from."""
    where = {"hf": lambda: spec.get("id"), "gguf-package": lambda: f"{spec.get('package')}/{spec.get('file')}",
             "random": lambda: f"a random {spec.get('architecture')} (the embedded SmolLM2 tokenizer)",
             "server": lambda: f"the tokenizer of the server at {(spec.get('served_by') or {}).get('url')}"}
    return f"model {name!r} ({where.get(spec.get('source'), lambda: spec.get('source'))()})"


def _returned_tokens(choice: dict[str, Any], chat: bool) -> set[str]:
    """Every token text a completion's logprobs name: the chosen ones and the alternatives."""
    logprobs = choice.get("logprobs") or {}
    if chat:
        steps = logprobs.get("content") or []
        return {str(s["token"]) for s in steps} | {str(a["token"]) for s in steps for a in s.get("top_logprobs") or []}
    tokens = {str(t) for t in logprobs.get("tokens") or []}
    for top in logprobs.get("top_logprobs") or []:
        tokens.update(str(t) for t in (top or {}))
    return tokens


def _unchecked(where: str, why: str) -> None:
    """A server whose tokenizer nothing can check (no tokenize route, no logprobs): said, not
    refused, since such a server can still be audited on its text (ids from text)."""
    import sys

    print(f"tokenflip: warning: {where}: its tokenizer cannot be checked against the local one ({why}); its ids "
          f"are read from its text with the local tokenizer", file=sys.stderr)
    return None
