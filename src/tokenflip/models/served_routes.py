"""The tokenizer routes of each server family, and how their answers are read: what a served
model's tokenizer (`served_tokenizer`) asks and accepts. Each family names its routes (paths
under the server's root), the bodies they take, and where the answer holds the text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Family", "VLLM", "LLAMA_CPP_PYTHON", "LLAMA_CPP", "TGI", "families", "root_url", "token_ids"]


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


VLLM = Family("vllm", "/tokenize", lambda m, t, s: {"model": m, "prompt": t, "add_special_tokens": s},
              "/detokenize", lambda m, ids: {"model": m, "tokens": ids}, ("prompt", "text"), "messages",
              "/tokenizer_info")  # vLLM answers its text as "prompt", SGLang as "text"
LLAMA_CPP_PYTHON = Family("llama-cpp-python", "/extras/tokenize", lambda m, t, s: {"model": m, "input": t},
                          "/extras/detokenize", lambda m, ids: {"model": m, "tokens": ids}, ("text",))
LLAMA_CPP = Family("llama.cpp", "/tokenize", lambda m, t, s: {"content": t, "add_special": s},
                   "/detokenize", lambda m, ids: {"tokens": ids}, ("content",), "apply-template", "/props")
TGI = Family("tgi", "/tokenize", lambda m, t, s: {"inputs": t, "add_special_tokens": s}, None, None, ())


def families(server_kind: str) -> list[Family]:
    """The families a server of `server_kind` may be, its own first (an unknown kind: all)."""
    if server_kind in ("vllm", "sglang"):
        return [VLLM]
    if server_kind == "llama.cpp":
        return [LLAMA_CPP_PYTHON, LLAMA_CPP]
    if server_kind == "tgi":
        return [TGI]
    return [VLLM, LLAMA_CPP_PYTHON, LLAMA_CPP, TGI]


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
