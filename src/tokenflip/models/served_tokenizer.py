"""A served model's tokenizer, asked of the server itself over HTTP: what an audit of a
deployment uses where no copy of the model's tokenizer is at hand (lm-eval's API models
ask the server first too). A model entry `source: server` names the endpoint whose server
tokenizes; it is "prepared" by asking the server which routes it offers and recording the
server's ids of fixed probe texts (their digest stands for the tokenizer's: a server whose
tokenizer changed since is refused, `check`).

The route families, each with what it offers:
- vLLM and SGLang: `POST /tokenize` (text, or chat `messages` through the served model's own
  chat template) and `POST /detokenize`; `GET /tokenizer_info` where started with
  `--enable-tokenizer-info-endpoint` (the end-of-sequence token, the chat template);
- llama.cpp's C++ server: `/tokenize`, `/detokenize`, `/apply-template` (messages to the
  prompt text) and `/props` (its chat template and special tokens);
- llama-cpp-python's server: `/extras/tokenize` and `/extras/detokenize`, no chat route and
  no word of its end-of-sequence token (state it as the model entry's `eos_token`).
TGI's `/tokenize` has no way back to text: its tokenizer can be checked, not used.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tokenflip.core.excerpt import excerpt, keep_secret
from tokenflip.models.servers import Family, families, root_url, token_ids

# A server's tokenizer, prepared: the server's URL and model, the routes it offers, the
# special ids it names and its ids' digest.
FILE = "served_tokenizer.json"
# Letters, digits, spaces, accents, CJK and an emoji: a text two tokenizers of different
# families almost never split alike (the probe of `run/engines/endpoint/tokenizer.mismatch`).
PROBE_TEXT = "Tokenizer check: 12,345 naïve cafés in Zürich — 東京 🙂\n    def f(x): return x ** 2  # done."
# Texts whose server ids stand for the tokenizer (`probe_sha256`): that probe, plain
# English, digits and whitespace runs.
PROBE_TEXTS = (PROBE_TEXT,
               "The quick brown fox jumps over the lazy dog. 3.14159 + 2.71828 = 5.85987",
               "  leading spaces,\ttabs\tand\n\nblank lines  ")
# Plain English whose ids are a background load's ordinary tokens, where the tokenizer's
# vocabulary cannot be listed (a server names no vocabulary size).
ORDINARY_TEXT = ("A server under load answers other users' requests beside the audited ones: their prompts are "
                 "drawn from ordinary tokens of the vocabulary, such as the words of this sentence, numbers like "
                 "17, 256 or 4096, and punctuation (commas, periods; colons!) that any tokenizer splits.")


# The longest chat template a server's info route may name (real ones take a few KiB).
LONGEST_TEMPLATE = 256 << 10


class ServedTokenizerError(RuntimeError):
    """A server that cannot tokenize for tokenflip, or whose tokenizer changed."""


def headers(spec: dict[str, Any]) -> dict[str, str]:
    """The bearer key from the variable the endpoint names (never from the config)."""
    import os

    name = spec.get("api_key_env")
    if not name:
        return {}
    if not os.environ.get(name):
        raise ServedTokenizerError(f"endpoint {spec['url']}: its API key variable ${name} is not set in this "
                                   f"environment")
    return {"Authorization": f"Bearer {keep_secret(os.environ[name])}"}


class ServedTokenizer:
    """The subset of a transformers tokenizer tokenflip's endpoint cells use, each call a
    request to the server (answers cached): encode, decode, chat prompts where the server
    renders them, the special ids it names, a token's id from its text."""

    def __init__(self, spec: dict[str, Any], info: dict[str, Any]):
        import httpx2

        self.spec, self.info = spec, info
        self.family = next(f for f in families("") if f.name == info["family"])
        self.root = root_url(spec["url"])
        self._timeout = float(spec.get("timeout_s") or 60)
        self._http = httpx2.Client(timeout=self._timeout, headers=headers(spec), follow_redirects=False)
        self._encoded: dict[tuple[str, bool], list[int]] = {}
        self._decoded: dict[tuple[tuple[int, ...], bool], str] = {}
        self._single: dict[str, int] = {}
        self.eos_token_id = info.get("eos_token_id")
        self.bos_token_id = (info.get("added_ids") or [None])[0]
        self.pad_token_id = None
        # A marker, not a template: the server renders chat prompts (`chat_ids`).
        self.chat_template = "the server's" if info.get("chat") else None

    # --- what a tokenizer answers ------------------------------------------------------

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        """The JSON answer of one route, within `core.bounded_http`'s bounds (time, bytes, no
        redirect); anything else a `ServedTokenizerError` naming the URL."""
        from tokenflip.core.bounded_http import fetch_json

        url = self.root + path
        try:
            status, answer, text = fetch_json("POST", url, body=body, http=self._http, timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001 - refused, reset, too slow, too large: said with the URL
            raise ServedTokenizerError(f"{url}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from None
        if status != 200:
            raise ServedTokenizerError(f"{url} answered {status}: {excerpt(text, 200)}")
        if answer is None:
            raise ServedTokenizerError(f"{url} answered 200 with no JSON: {excerpt(text, 200)}")
        return answer

    def _get(self, url: str) -> Any:
        """The JSON answer of a GET (None where it is none or not 200), bounded as `_post`."""
        from tokenflip.core.bounded_http import fetch_json

        status, answer, _ = fetch_json("GET", url, http=self._http, timeout=self._timeout)
        return answer if status == 200 else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The server's ids of `text`, checked (`_checked_ids`) and decoded back to `text`:
        a route that answers other ids for some texts than for the probes is caught on the
        prompt itself, which is then refused."""
        key = (text, add_special_tokens)
        if key not in self._encoded:
            route = self.root + self.family.tokenize
            ids = self._checked_ids(route, self._post(self.family.tokenize, self.family.tokenize_body(
                self.spec["model"], text, add_special_tokens)), text)
            added = self.info.get("added_ids") or []
            if not add_special_tokens and added and ids[: len(added)] == added:  # a route that always adds them
                ids = ids[len(added):]
            own = ids[len(added):] if add_special_tokens and added and ids[: len(added)] == added else ids
            if self.info.get("probe_sha256") and text.strip() and not self._round_trips(text, own):
                raise ServedTokenizerError(f"{route}: its ids of the text {excerpt(text)} do not decode back to it "
                                           f"({self.root + (self.family.detokenize or '')} answered "
                                           f"{excerpt(self.decode(own))}): the prompt is refused, its ids cannot "
                                           f"be trusted")
            self._encoded[key] = ids
        return list(self._encoded[key])

    def _round_trips(self, text: str, ids: list[int]) -> bool:
        """Whether `ids` decode back to `text`: whole, or, where the text holds special tokens
        (which a detokenize route renders as nothing), piece by piece: the runs of ids between
        them spell the text between them, in order, and what the special tokens stand for is
        short chunks without spaces (`<|im_end|>`), never words, nor text before or after."""
        decoded = self.decode(ids).strip()
        if decoded == text.strip() or decoded == _cleaned(text).strip():
            return True
        invisible = [self.decode([i]) == "" for i in ids]
        if not any(invisible):
            return False
        runs, run = [], []
        for i, gone in zip(ids, invisible):
            if gone:
                runs.append(run)
                run = []
            else:
                run.append(i)
        runs.append(run)
        at, chunks = 0, []
        for index, piece in enumerate(self.decode(r) if r else "" for r in runs):
            found = text.find(piece, at)
            if found < 0 or (index == 0 and text[:found].strip()):
                return False
            chunks.append(text[at:found] if index else "")  # what the special tokens before this run stood for
            at = found + len(piece)
        chunks[-1] += text[at:] if not runs[-1] else ""  # a special token last
        if runs[-1] and text[at:].strip():
            return False  # text after the last run that no id spells
        return all(not c.strip() or (len(c.strip()) <= 64 and not any(ch.isspace() for ch in c.strip())
                                     and not c.strip().isalnum()) for c in chunks)

    def _checked_ids(self, route: str, answer: Any, text: str) -> list[int]:
        """The ids of a tokenize answer, if it has the route's shape and every id is within
        the vocabulary the server states (where it states one)."""
        ids = token_ids(answer)
        if ids is None:
            raise ServedTokenizerError(f"{route} answered no token ids for {excerpt(text)} (an answer of "
                                       f"{type(answer).__name__}, not the route's {{\"tokens\": [ids]}})")
        vocabulary = self.info.get("vocab_size")
        beyond = next((i for i in ids if vocabulary and i >= vocabulary), None)
        if beyond is not None:
            raise ServedTokenizerError(f"{route} answered id {beyond} for {excerpt(text)}, past the {vocabulary:,} "
                                       f"tokens of the vocabulary the server states")
        return ids

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens)}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self.all_special_ids]
        key = (tuple(ids), skip_special_tokens)
        if key not in self._decoded:
            if not ids:
                return ""
            answer = self._post(self.family.detokenize, self.family.detokenize_body(self.spec["model"], ids))
            text = next((answer[k] for k in self.family.detokenized if isinstance(answer.get(k), str)), None) \
                if isinstance(answer, dict) else None
            if not isinstance(text, str):
                raise ServedTokenizerError(f"{self.root + self.family.detokenize} answered no text")
            self._decoded[key] = text
        return self._decoded[key]

    @property
    def all_special_ids(self) -> list[int]:
        return sorted({i for i in (self.eos_token_id, *(self.info.get("added_ids") or []),
                                   *(self.info.get("end_ids") or [])) if i is not None})

    def learn_end_ids(self, ids: set[int], source: str) -> None:
        """The ids a server stops at, learned from its answers where no route named them: a
        decoded text leaves them out, as it leaves out every engine's end of sequence."""
        self.info["end_ids"] = sorted(int(i) for i in ids)
        if self.eos_token_id is None:
            self.eos_token_id = self.info["end_ids"][0]
            self.info["eos_from"] = source
        self._decoded.clear()

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """A chat prompt's ids through the served model's own chat template, ready for the
        assistant's turn."""
        if self.info.get("chat") == "messages":
            body = {"model": self.spec["model"], "messages": messages, "add_generation_prompt": True,
                    "add_special_tokens": False}
            route = self.root + self.family.tokenize
            ids = self._checked_ids(route, self._post(self.family.tokenize, body), messages[-1]["content"])
            text = self.decode(ids) if self.info.get("probe_sha256") else None
        elif self.info.get("chat") == "apply-template":
            route = self.root + "/apply-template"
            answer = self._post("/apply-template", {"messages": messages})
            text = answer.get("prompt") if isinstance(answer, dict) else None
            if not isinstance(text, str):
                raise ServedTokenizerError(f"{route} answered no prompt text (an answer of {type(answer).__name__})")
            ids = self.encode(text, add_special_tokens=False)
        else:
            raise ServedTokenizerError(f"{self.root} renders no chat prompt for a client ({self.family.name}'s "
                                       f"routes): send chat prompts with `api: chat`")
        missing = next((turn for turn in messages if text is not None and turn["content"].strip() not in text
                        and _cleaned(turn["content"]).strip() not in text), None)
        if missing is not None:
            raise ServedTokenizerError(f"{route}: the chat prompt it rendered does not hold the {missing['role']}'s "
                                       f"turn {excerpt(missing['content'])}: the prompt is refused")
        return ids

    def id_of_text(self, token: str) -> int:
        """The id of the one token whose text is `token`, -1 where the server splits it in
        more (what a server that names its logprob tokens by their text returns)."""
        if token not in self._single:
            ids = self.encode(token, add_special_tokens=False) if token else []
            self._single[token] = ids[0] if len(ids) == 1 and self.decode(ids) == token else -1
        return self._single[token]

    def ordinary_ids(self) -> list[int]:
        """Ids of ordinary words, numbers and punctuation (a background load's prompts)."""
        return sorted(set(self.encode(ORDINARY_TEXT, add_special_tokens=False)))

    def probe_sha256(self) -> str:
        """The digest that stands for the tokenizer: its ids of the probe texts, with and
        without special tokens, and the ids it adds on its own."""
        ids = [[self.encode(t, s) for s in (False, True)] for t in PROBE_TEXTS]
        return hashlib.sha256(json.dumps({"ids": ids, "added": self.info.get("added_ids")}).encode()).hexdigest()

    def check(self) -> None:
        """Refuse a server whose tokenizer is not the one this model was prepared from."""
        now = self.probe_sha256()
        if now != self.info["probe_sha256"]:
            raise ServedTokenizerError(
                f"{self.root}: its tokenizer is not the one prepared from it (its ids of the probe texts hash to "
                f"{now[:12]}…, not {self.info['probe_sha256'][:12]}…): the server changed; prepare the model again")

    def save_pretrained(self, directory) -> None:
        """Where the server's tokenizer is and what it answered (`FILE`): its prepared copy."""
        from pathlib import Path

        (Path(directory) / FILE).write_text(json.dumps({"spec": self.spec, "info": self.info}, indent=2,
                                                       sort_keys=True))

    @classmethod
    def from_pretrained(cls, directory) -> "ServedTokenizer":
        from pathlib import Path

        saved = json.loads((Path(directory) / FILE).read_text())
        return cls(saved["spec"], saved["info"])


def _cleaned(text: str) -> str:
    """`text` as a detokenizer that cleans up tokenization spaces writes it back (" ?" as "?",
    " 's" as "'s": transformers' own `clean_up_tokenization`, which vLLM's /detokenize applies
    for tokenizers that ask for it)."""
    from transformers import PreTrainedTokenizerBase

    return PreTrainedTokenizerBase.clean_up_tokenization(None, text)  # a method that reads no state


def connect(spec: dict[str, Any], eos_token: str | None = None) -> ServedTokenizer:
    """The server's tokenizer (`spec`: url, model, server, api_key_env), its routes found by
    a round trip of the probe texts; refused, naming what each route answered, where none
    both tokenizes and detokenizes them back."""
    import httpx2

    root, tried = root_url(spec["url"]), []
    for family in families(spec.get("server", "openai")):
        if family.detokenize is None:
            tried.append(f"{root + family.tokenize}: {family.name} has no route back from ids to text")
            continue
        info = {"family": family.name, "added_ids": [], "chat": None}
        tokenizer = ServedTokenizer(spec, info)
        try:
            info["added_ids"] = tokenizer.encode("", add_special_tokens=True)  # what it adds of its own
            tokenizer._encoded.clear()
            # A SentencePiece detokenizer may drop the leading space it added: the text itself must come back.
            round_trip = all(tokenizer.decode(tokenizer.encode(t, False)).strip() == t.strip() for t in PROBE_TEXTS)
        except (ServedTokenizerError, httpx2.HTTPError, ValueError, AttributeError, OSError) as exc:
            tried.append(f"{root + family.tokenize}: {' '.join(str(exc).split())[:160]}")
            continue
        if not round_trip:
            tried.append(f"{root + family.tokenize}: its ids of the probe texts do not decode back to them")
            continue
        info.update(_described(tokenizer, family))
        if eos_token is not None:  # the model entry's own word
            ids = tokenizer.encode(eos_token, add_special_tokens=False)
            if len(ids) != 1:
                raise ServedTokenizerError(f"eos_token {eos_token!r}: the server at {root} reads it as {ids}, not "
                                           f"one token")
            info["eos_token_id"], info["eos_from"] = ids[0], "the model entry's eos_token"
        info["chat"] = _chat_route(tokenizer, family)
        info["max_model_len"], listed = _model_list(tokenizer)
        info["vocab_size"] = info.get("vocab_size") or listed
        tokenizer = ServedTokenizer(spec, info)
        info["probe_sha256"] = tokenizer.probe_sha256()
        return tokenizer
    raise ServedTokenizerError(f"the server at {spec['url']} offers no tokenizer tokenflip can use ("
                               + "; ".join(tried) + "): name the served model's tokenizer (`--tokenizer`, or a "
                               "model entry of source hf with `tokenizer_only: true`)")


def _described(tokenizer: ServedTokenizer, family: Family) -> dict[str, Any]:
    """What the server's info route says: its end-of-sequence token and chat template."""
    out: dict[str, Any] = {"eos_token_id": None, "eos_from": None, "chat_template_text": None, "vocab_size": None}
    if not family.info:
        return out
    try:
        answer = tokenizer._get(tokenizer.root + family.info)
    except Exception:  # noqa: BLE001 - a route the server was not started with, or one too slow or large
        return out
    if not isinstance(answer, dict):
        return out
    size = answer.get("vocab_size")
    out["vocab_size"] = size if isinstance(size, int) and not isinstance(size, bool) and 0 < size < 2 ** 31 else None
    template = answer.get("chat_template")
    out["chat_template_text"] = template if isinstance(template, str) and len(template) <= LONGEST_TEMPLATE else None
    eos = answer.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if isinstance(eos, str) and eos:
        ids = tokenizer.encode(eos, add_special_tokens=False)
        if len(ids) == 1:
            out["eos_token_id"], out["eos_from"] = ids[0], f"{tokenizer.root + family.info} ({eos!r})"
    return out


def _model_list(tokenizer: ServedTokenizer) -> tuple[int | None, int | None]:
    """The served model's length (vLLM's `max_model_len`) and vocabulary size (llama.cpp's
    `meta.n_vocab`) where the model list states them."""
    def bounded(value):
        return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2 ** 31 else None

    try:
        answer = tokenizer._get(tokenizer.spec["url"].rstrip("/") + "/models")
        mine = [m for m in answer.get("data") or [] if isinstance(m, dict)]
    except Exception:  # noqa: BLE001 - no model list: neither is known (ids stay bounded by 2^31 and the round trip)
        return None, None
    length = next((m.get("max_model_len") for m in mine if m.get("id") == tokenizer.spec["model"]), None)
    served = [m for m in mine if m.get("id") == tokenizer.spec["model"]] or (mine if len(mine) == 1 else [])
    vocabulary = next((m["meta"].get("n_vocab") for m in served if isinstance(m.get("meta"), dict)), None)
    return bounded(length), bounded(vocabulary)


def generation_config(served: ServedTokenizer):
    """The generation config of a served model: the end-of-sequence id the server names (or
    the entry states), none where neither does."""
    from transformers import GenerationConfig

    return GenerationConfig(eos_token_id=served.eos_token_id)


def _chat_route(tokenizer: ServedTokenizer, family: Family) -> str | None:
    """Which way the server renders a chat prompt for a client, if it does (tried once)."""
    if not family.chat:
        return None
    tokenizer.info["chat"] = family.chat
    try:
        return family.chat if tokenizer.chat_ids([{"role": "user", "content": "Hi"}]) else None
    except Exception:  # noqa: BLE001 - an older server without the route
        return None
    finally:
        tokenizer.info["chat"] = None
