"""The benchmark interface: items to prompt with and a scorer for completions."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from .answers import answers_match, extract_answer

__all__ = [
    "BenchmarkError",
    "Item",
    "Benchmark",
    "MathBenchmark",
    "MATH_SYSTEM_PROMPT",
]

MATH_SYSTEM_PROMPT = "Solve the math word problem step by step. End with a line '#### <number>'."


class BenchmarkError(ValueError):
    """A benchmark cannot be built or loaded from its spec."""


@dataclass(frozen=True)
class Item:
    """One prompt of a benchmark with its normalised gold answer."""

    id: str
    question: str
    gold: str
    solution: str | None = None


# Keys every benchmark entry of a config takes, whatever its kind.
COMMON_SPEC_SCHEMA: dict[str, Any] = {
    "kind": {"type": "string"},
    "n": {"type": "integer", "minimum": 1, "description": "the first n items (default: all)"},
    "max_new_tokens": {"type": "integer", "minimum": 1},
    # How a prompt reaches the model (arXiv 2609.26621 §2 measures with bare prompts, no system
    # prompt and no chat template; App. VI replicates with the native chat template).
    "format": {"enum": ["chat", "bare"], "default": "chat",
               "description": "chat: the tokenizer's chat template; bare: plain text, no template"},
    "system_prompt": {"type": "boolean", "default": True,
                      "description": "keep the benchmark's system instruction (as a system turn, or as text)"},
}
PROMPT_KEYS = ("format", "system_prompt")
# A `source:` mapping: exactly one of a path, hub coordinates or a package file (checked by
# `sources.parse_source` when the benchmark is built).
SOURCE_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "minProperties": 1,
    "properties": {key: {"type": "string", "minLength": 1}
                   for key in ("path", "hub", "config", "split", "revision", "package", "file")},
}


class Benchmark(ABC):
    """A fixed, ordered list of items, how to prompt with them, and how to score answers.

    A kind is registered in `benchmarks.BENCHMARKS` by its class; `spec_schema` is the
    JSON schema of the keys a config entry of this kind takes besides COMMON_SPEC_SCHEMA
    (defaults included: the config fills them in), and `from_spec` builds one."""

    kind: ClassVar[str] = ""
    prompt_format: str = ""
    scorer: str = ""
    spec_schema: ClassVar[dict[str, Any]] = {}
    # format (chat | bare) and system_prompt, from the config entry (see COMMON_SPEC_SCHEMA)
    prompt_style: dict[str, Any] = {"format": "chat", "system_prompt": True}

    @classmethod
    def from_spec(cls, name: str, spec: dict[str, Any]) -> "Benchmark":
        """Build from a config entry: its keys besides kind and max_new_tokens are the
        constructor's keyword arguments; a `source` mapping is parsed against the kind's
        default source."""
        from .sources import parse_source

        options = {k: v for k, v in spec.items() if k not in ("kind", "max_new_tokens", *PROMPT_KEYS)}
        if "source" in cls.spec_schema:
            options["source"] = parse_source(f"benchmark {name!r} ({cls.kind})", options.get("source"),
                                             cls.default_source(options))
        bench = cls(name, **options)
        bench.prompt_style = {key: spec.get(key, COMMON_SPEC_SCHEMA[key]["default"]) for key in PROMPT_KEYS}
        return bench

    @classmethod
    def default_source(cls, options: dict[str, Any]):
        """Where the data comes from when the config names no source."""
        raise NotImplementedError

    def __init__(self, name: str, n: int | None) -> None:
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise BenchmarkError(f"benchmark {name!r}: n must be a positive integer, got {n!r}")
        self.name = name
        self.n = n

    @abstractmethod
    def items(self) -> list[Item]:
        """The first `n` items, always in the same order."""

    def checked(self, items: list[Item], where: str) -> list[Item]:
        """`items` if they can make a cell: at least one, and every id unique (a prompt id
        keys every comparison; two items sharing one would be compared with each other)."""
        if not items:
            raise BenchmarkError(f"{where}: no items (empty data or n too small)")
        seen: dict[str, int] = {}
        for index, item in enumerate(items):
            if item.id in seen:
                raise BenchmarkError(f"{where}: records {seen[item.id]} and {index} have the same id {item.id!r}")
            seen[item.id] = index
        return items

    @abstractmethod
    def messages(self, item: Item) -> list[dict]:
        """Chat messages for `tokenizer.apply_chat_template`."""

    def chat_messages(self, item: Item) -> list[dict]:
        """`messages`, without the system turn when the config turns the system prompt off."""
        messages = self.messages(item)
        if self.prompt_style["system_prompt"]:
            return messages
        return [m for m in messages if m["role"] != "system"]

    def bare_text(self, item: Item) -> str:
        """The prompt as plain text for `format: bare` (base checkpoints, no chat template):
        the system instruction (if kept) as a line, each earlier turn as
        "Question: …\nAnswer: …", and the item as "Question: …\nAnswer:"."""
        parts = []
        for message in self.chat_messages(item):
            if message["role"] == "system":
                parts.append(message["content"].strip() + "\n\n")
            elif message["role"] == "user":
                parts.append(f"Question: {message['content'].strip()}\nAnswer:")
            else:
                parts.append(f" {message['content'].strip()}\n\n")
        return "".join(parts)

    @abstractmethod
    def extract(self, completion: str) -> str | None:
        """The final answer in a completion, normalised like `Item.gold`, or None."""

    def is_correct(self, item: Item, completion: str) -> bool:
        """Whether the completion's extracted answer equals the item's gold answer."""
        return answers_match(self.extract(completion), item.gold)

    @abstractmethod
    def describe(self) -> dict:
        """Prompt format, n, scorer and source, for provenance and the report."""

    def _description(self, **extra) -> dict:
        """The fields every benchmark's `describe()` shares, followed by its own."""
        return {"name": self.name, "kind": self.kind, "n": len(self.items()), "n_requested": self.n,
                "prompt_format": self.prompt_format, "prompt_style": dict(self.prompt_style),
                "scorer": self.scorer, **extra}


class MathBenchmark(Benchmark):
    """A benchmark of word problems with one numeric final answer, prompted 0-shot in chat."""

    prompt_format = "chat, 0-shot"
    scorer = "numeric final answer (#### / 'The answer is' / last number), tolerance 1e-6"

    def messages(self, item: Item) -> list[dict]:
        """System instruction, then the question as the user turn."""
        return [
            {"role": "system", "content": MATH_SYSTEM_PROMPT},
            {"role": "user", "content": item.question},
        ]

    def extract(self, completion: str) -> str | None:
        """The final numeric answer, see `answers.extract_answer`."""
        return extract_answer(completion)

    def _describe(self, source: dict) -> dict:
        return self._description(system_prompt=MATH_SYSTEM_PROMPT, source=source)
