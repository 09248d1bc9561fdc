"""One profile per server kind: what a server answers beyond OpenAI's API, in one place. A
profile names how the server is recognised (its model list's `owned_by`), whether it takes
prompts as ids and returns ids (and the fields that ask for them), its sampling defaults
that act at temperature 0 (asked neutral in every request), the field that keeps a request
from its prefix cache, whether it takes `top_k`, and its tokenizer routes (paths under the
server's root, the bodies they take and where the answer holds the text), which a served
model's tokenizer (`served_tokenizer`) asks. Adding a server is adding a profile here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Family", "ServerProfile", "SERVERS", "server", "families", "root_url", "token_ids"]


@dataclass(frozen=True)
class Family:
    """One server family's tokenizer routes (paths under the server's root)."""

    name: str
    tokenize: str
    tokenize_body: Callable[[str, str, bool], dict[str, Any]]  # (model, text, add_special) -> body
    detokenize: str | None
    detokenize_body: Callable[[str, list[int]], dict[str, Any]] | None
    detokenized: tuple[str, ...]  # the answer's fields that may hold the text (the first present)
    chat: str | None = None  # "messages" (tokenize takes them) or "apply-template"
    info: str | None = None  # a route naming special tokens and the chat template


VLLM_ROUTES = Family("vllm", "/tokenize", lambda m, t, s: {"model": m, "prompt": t, "add_special_tokens": s},
                     "/detokenize", lambda m, ids: {"model": m, "tokens": ids}, ("prompt", "text"), "messages",
                     "/tokenizer_info")  # vLLM answers its text as "prompt", SGLang as "text"
LLAMA_CPP_PYTHON_ROUTES = Family("llama-cpp-python", "/extras/tokenize", lambda m, t, s: {"model": m, "input": t},
                                 "/extras/detokenize", lambda m, ids: {"model": m, "tokens": ids}, ("text",))
LLAMA_CPP_ROUTES = Family("llama.cpp", "/tokenize", lambda m, t, s: {"content": t, "add_special": s},
                          "/detokenize", lambda m, ids: {"tokens": ids}, ("content",), "apply-template", "/props")
TGI_ROUTES = Family("tgi", "/tokenize", lambda m, t, s: {"inputs": t, "add_special_tokens": s}, None, None, ())
ALL_ROUTES = (VLLM_ROUTES, LLAMA_CPP_PYTHON_ROUTES, LLAMA_CPP_ROUTES, TGI_ROUTES)


@dataclass(frozen=True)
class ServerProfile:
    """One server kind (an endpoint entry's `server:`)."""

    name: str
    owned_by: tuple[str, ...] = ()  # the model list's `owned_by` values that name this server
    ids: bool = False  # takes a completion's prompt as ids and answers with ids
    id_fields: Callable[[list[int]], dict[str, Any]] = lambda eos: {}  # (the model's eos ids) -> fields
    neutral: dict[str, Any] = field(default_factory=dict)  # its defaults that act at temperature 0, asked off
    cache_salt: str | None = None  # the field whose fresh value reuses no cached prefix
    top_k: bool = False  # takes `top_k` for sampling
    routes: tuple[Family, ...] = ALL_ROUTES  # its tokenizer routes, the likeliest first

    def request_fields(self, eos: list[int]) -> dict[str, Any]:
        """What every request to this server carries beyond OpenAI's own fields."""
        return {**self.id_fields(list(eos)), **self.neutral}


SERVERS = {s.name: s for s in (
    ServerProfile("vllm", ("vllm",), True,
                  lambda eos: {"return_token_ids": True, "return_tokens_as_token_ids": True, "stop_token_ids": eos},
                  cache_salt="cache_salt", top_k=True, routes=(VLLM_ROUTES,)),
    ServerProfile("sglang", ("sglang",), True, lambda eos: {"return_token_ids": True, "stop_token_ids": eos},
                  top_k=True, routes=(VLLM_ROUTES,)),
    ServerProfile("tgi", ("tgi",), top_k=True, routes=(TGI_ROUTES,)),
    # llama.cpp's servers apply a repetition penalty of 1.1 by default, at temperature 0 too,
    # after the logprobs they report: asked neutral, so that a cell measures numerics, not a
    # server default (an endpoint's `extra_body: {repeat_penalty: 1.1}` asks for it again).
    ServerProfile("llama.cpp", ("me", "llamacpp", "llama.cpp"), neutral={"repeat_penalty": 1.0}, top_k=True,
                  routes=(LLAMA_CPP_PYTHON_ROUTES, LLAMA_CPP_ROUTES)),
    ServerProfile("ollama", ("ollama", "library"), top_k=True),
    ServerProfile("openai"),  # any other: OpenAI's API as written, every tokenizer route tried
)}


def server(kind: str | None) -> ServerProfile:
    """The profile of server kind `kind` (an unknown or unset kind: OpenAI's API as written)."""
    return SERVERS.get(kind or "openai", SERVERS["openai"])


def families(server_kind: str) -> list[Family]:
    """The tokenizer routes a server of `server_kind` may have, its own first (an unknown kind: all)."""
    return list(server(server_kind).routes)


def root_url(url: str) -> str:
    """The server's root: the OpenAI base URL without its `/v1`."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def token_ids(answer: Any) -> list[int] | None:
    """The ids a tokenize route answered: `{"tokens": [ids]}` (vLLM, SGLang, llama.cpp), or a
    list of `{"id": ...}` (TGI); None for anything else (a bare list of numbers is no server's
    answer; ids that are not integers of 0 to 2^31 - 1 included). An empty text's ids may be
    none."""
    tokens = answer.get("tokens") if isinstance(answer, dict) else answer
    if isinstance(answer, list) and not all(isinstance(t, dict) for t in answer):
        return None
    if isinstance(tokens, list) and tokens and all(isinstance(t, dict) for t in tokens):
        tokens = [t.get("id") for t in tokens]
    if isinstance(tokens, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2 ** 31
                                        for t in tokens):
        return tokens
    return None
