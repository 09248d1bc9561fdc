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

# Letters, digits, spaces, accents, CJK and an emoji: texts two tokenizers of different
# families almost never split alike.
PROBE_TEXT = "Tokenizer check: 12,345 naïve cafés in Zürich — 東京 🙂\n    def f(x): return x ** 2  # done."
# The ids shown in a refusal (enough to see where two tokenizers part).
SHOWN_IDS = 12
# Where the server offers no tokenize route: the share of its returned tokens the local
# vocabulary may not spell (a byte of a multi-byte character comes back as text that no
# one token decodes to) before the tokenizer is called another model's.
UNSPELLED_ALLOWED = 0.25


def _root(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _routes(spec: dict[str, Any], text: str) -> list[tuple[str, dict[str, Any]]]:
    """(path under the server's root, body) of each tokenize route the server may offer,
    its own kind's first."""
    model = spec["model"]
    vllm = ("/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})
    llama_cpp_python = ("/extras/tokenize", {"model": model, "input": text})
    llama_cpp_native = ("/tokenize", {"content": text, "add_special": False})
    kind = spec.get("server", "openai")
    if kind in ("vllm", "sglang"):
        return [vllm]
    if kind == "llama.cpp":
        return [llama_cpp_python, llama_cpp_native]
    return [vllm, llama_cpp_python, llama_cpp_native]


def server_ids(spec: dict[str, Any], text: str, timeout: float = 10.0) -> tuple[list[int] | None, str]:
    """The server's own ids of `text` and the route that gave them, or (None, why none did)."""
    import httpx2

    from tokenflip.run.engines.endpoint.client import api_key

    headers = {"Authorization": f"Bearer {api_key(spec)}"} if spec.get("api_key_env") else {}
    tried = []
    for path, body in _routes(spec, text):
        url = _root(spec["url"]) + path
        try:
            response = httpx2.post(url, json=body, headers=headers, timeout=timeout)
            tokens = response.json().get("tokens") if response.status_code == 200 else None
        except Exception as exc:  # noqa: BLE001 - a route the server lacks or garbles: the next one
            tried.append(f"{url}: {type(exc).__name__}")
            continue
        if isinstance(tokens, list) and tokens and all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in tokens):
            return tokens, url
        tried.append(f"{url}: {response.status_code}")
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

    body = {"model": spec["model"], "max_tokens": 16, "temperature": 0.0, "logprobs": 5, "prompt": PROBE_TEXT}
    probe_spec = {"timeout_s": 60, "retries": 1, **spec, "api": "completions"}

    async def ask():
        api = client.client(probe_spec, 1)
        async with api:
            return await client.request(api, probe_spec, body, "the tokenizer probe")

    try:
        answer = asyncio.run(ask())
    except client.EndpointError as exc:
        return f"{where}: its tokenizer cannot be checked ({why_no_route}; the probe completion failed: {exc})"
    logprobs = answer.body["choices"][0].get("logprobs") or {}
    tokens = set(logprobs.get("tokens") or [])
    for top in logprobs.get("top_logprobs") or []:
        tokens.update(top or {})
    if not tokens:
        return (f"{where}: its tokenizer cannot be checked: {why_no_route}, and its completions return no tokens "
                f"(logprobs); name a server kind that tokenizes, or compare on a server that does")
    vocabulary = Vocabulary(tokenizer)
    size = len(tokenizer)
    unspelled = sorted(t for t in tokens if not 0 <= vocabulary.id_of(t) < size)  # `token_id:N` too
    if len(unspelled) <= UNSPELLED_ALLOWED * len(tokens):
        return None
    return (f"{where} does not use the tokenizer of {label}: {len(unspelled)} of the {len(tokens)} tokens it "
            f"returned are no token of {label} (e.g. {unspelled[:5]}; {why_no_route}). Name the served model's "
            f"tokenizer (`--tokenizer`, or the model entry; `tokenizer_only: true` needs no weights)")


def label_of(name: str, spec: dict[str, Any]) -> str:
    """A model entry as a refusal names it: its name and where its tokenizer comes from."""
    where = {"hf": lambda: spec.get("id"), "gguf-package": lambda: f"{spec.get('package')}/{spec.get('file')}",
             "random": lambda: f"a random {spec.get('architecture')} (the embedded SmolLM2 tokenizer)"}
    return f"model {name!r} ({where.get(spec.get('source'), lambda: spec.get('source'))()})"
