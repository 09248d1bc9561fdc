"""The benchmark interface: items to prompt with and a scorer for completions."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from tokenflip.core.excerpt import excerpt
from tokenflip.run.benchmarks.answers import NUMERIC_RULES, answers_match, find_answer
from tokenflip.run.benchmarks.errors import BenchmarkError
from tokenflip.run.benchmarks.sources import parse_source

__all__ = [
    "BenchmarkError",
    "Item",
    "Score",
    "Benchmark",
    "MathBenchmark",
    "MATH_SYSTEM_PROMPT",
]

MATH_SYSTEM_PROMPT = "Solve the math word problem step by step. End with a line '#### <number>'."


@dataclass(frozen=True)
class Item:
    """One prompt of a benchmark with its normalised gold answer."""

    id: str
    question: str
    gold: str
    solution: str | None = None


@dataclass(frozen=True)
class Score:
    """How one completion scored: the answer found (normalised; for code, the code run), the
    rule that found it (one of the kind's `answer_rules`), whether it is correct (None when
    it could not be decided: a sandbox failure is not the model's failure) and the verdict:
    correct | wrong | no_answer, or for code passed | failed | timeout | no_code | sandbox_error,
    or not_scored where the benchmark has no answers to score (correct None: no accuracy)."""

    extracted: str | None
    correct: bool | None
    rule: str
    verdict: str


VERDICTS = ("correct", "wrong", "no_answer", "passed", "failed", "timeout", "no_code", "sandbox_error", "not_scored")


# Keys every benchmark entry of a config takes, whatever its kind.
COMMON_SPEC_SCHEMA: dict[str, Any] = {
    "kind": {"type": "string"},
    "n": {"type": "integer", "minimum": 1,
          "description": "the first n items of the drawn order (default: all): a random sample of n "
                         "without replacement"},
    # The study's prompts are a seeded random sample of the benchmark (its verdicts assume prompts
    # in random order: a source sorted by date, topic or length would bias every look at a prefix).
    "order": {"enum": ["random", "source"], "default": "random",
              "description": "random: the items in a seeded random order (a prefix is a random sample without "
                             "replacement); source: the source's own order (a paper's \"first n\"; the verdicts' "
                             "guarantee then assumes that order is random)"},
    "order_seed": {"type": "integer", "minimum": 0, "maximum": 4294967295, "default": 0,
                   "description": "the seed of the random order (recorded with every cell)"},
    "max_new_tokens": {"type": "integer", "minimum": 1},
    # How a prompt reaches the model (arXiv 2609.26621 §2 measures with bare prompts, no system
    # prompt and no chat template; App. VI replicates with the native chat template).
    "format": {"enum": ["chat", "bare"], "default": "chat",
               "description": "chat: the tokenizer's chat template; bare: plain text, no template"},
    "system_prompt": {"type": "boolean", "default": True,
                      "description": "keep the benchmark's system instruction (as a system turn, or as text)"},
    # No schema default: the default depends on the kind and the format (`default_stop`), and
    # `config.validate` writes it into the entry, so that every cell records the stops it used.
    "stop": {"type": "array", "maxItems": 16, "uniqueItems": True,
             "items": {"type": "string", "minLength": 1, "maxLength": 64},
             "description": "stop sequences: a completion ends at the first one, and only the text before "
                            "it is scored (default: the kind's, from the harness its benchmark comes from)"},
}
PROMPT_KEYS = ("format", "system_prompt")
ORDER_KEYS = ("order", "order_seed")
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
    # Which rule may find an answer, in the order they are tried (the `answer_rule` column).
    answer_rules: ClassVar[tuple[str, ...]] = NUMERIC_RULES
    # Default stop sequences per prompt format, with the harness they come from.
    stops: ClassVar[dict[str, tuple[str, ...]]] = {"chat": (), "bare": ("Question:",)}
    stop_source: ClassVar[str] = "the bare format's own \"Question:\" turns"
    # format (chat | bare) and system_prompt, from the config entry (see COMMON_SPEC_SCHEMA)
    prompt_style: dict[str, Any] = {"format": "chat", "system_prompt": True}
    stop: tuple[str, ...] = ()

    @classmethod
    def default_stop(cls, prompt_format: str) -> tuple[str, ...]:
        """The stop sequences of this kind in this prompt format when the config names none."""
        return cls.stops.get(prompt_format, ())

    @classmethod
    def from_spec(cls, name: str, spec: dict[str, Any]) -> "Benchmark":
        """Build from a config entry: its keys besides kind and max_new_tokens are the
        constructor's keyword arguments; a `source` mapping is parsed against the kind's
        default source."""
        options = {k: v for k, v in spec.items()
                   if k not in ("kind", "max_new_tokens", "stop", *PROMPT_KEYS, *ORDER_KEYS)}
        if "source" in cls.spec_schema:
            options["source"] = parse_source(f"benchmark {name!r} ({cls.kind})", options.get("source"),
                                             cls.default_source(options))
        return cls(name, **options)

    def configure(self, spec: dict[str, Any]) -> "Benchmark":
        """Take the keys every kind shares from a config entry: prompt style and stops
        (`build_benchmark` calls it after the kind's own `from_spec`, so no kind can miss it)."""
        self.prompt_style = {key: spec.get(key, COMMON_SPEC_SCHEMA[key]["default"]) for key in PROMPT_KEYS}
        order, seed = (spec.get(key, COMMON_SPEC_SCHEMA[key]["default"]) for key in ORDER_KEYS)
        if order not in COMMON_SPEC_SCHEMA["order"]["enum"]:
            raise BenchmarkError(f"benchmark {self.name!r}: order must be 'random' or 'source', "
                                 f"got {excerpt(order)}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
            raise BenchmarkError(f"benchmark {self.name!r}: order_seed must be an integer from 0 to 2^32 - 1, "
                                 f"got {excerpt(seed)}")
        self.order, self.order_seed = order, seed
        stop = spec.get("stop")
        if stop is None:
            stop = self.default_stop(self.prompt_style["format"])
        if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
            raise BenchmarkError(f"benchmark {self.name!r}: stop must be a list of non-empty strings, got {stop!r}")
        self.stop = tuple(stop)
        return self

    @classmethod
    def default_source(cls, options: dict[str, Any]):
        """Where the data comes from when the config names no source."""
        raise NotImplementedError

    def __init__(self, name: str, n: int | None) -> None:
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise BenchmarkError(f"benchmark {name!r}: n must be a positive integer, got {n!r}")
        self.name = name
        self.n = n

    # How the items are ordered (`configure` sets them from the config entry): a benchmark built
    # by hand keeps its source's order; a study's default is a seeded random order.
    order: str = "source"
    order_seed: int = 0
    population: int | None = None  # the items drawn from (None: generated, one at a time)

    @abstractmethod
    def items(self) -> list[Item]:
        """The first `n` items of the drawn order, always the same for one seed."""

    def drawn(self, records: list) -> list[tuple[int, Any]]:
        """The records a study takes, as (index in the source, record): all of them in a
        seeded random order (a permutation of the whole source, so a larger n extends the same
        order and a block is a slice of it), or in the source's order; cut at n."""
        self.population = len(records)
        indices = list(range(len(records)))
        if self.order == "random":
            indices = [int(i) for i in np.random.default_rng(self.order_seed).permutation(len(records))]
        return [(i, records[i]) for i in indices[: self.n]]

    def order_description(self) -> dict:
        """How the items were ordered, for provenance: the drawn order is part of a cell."""
        if self.population is None:
            return {"kind": "generated", "note": "each item made independently from the seed: already in random order"}
        return ({"kind": "random", "seed": self.order_seed, "population": self.population} if self.order == "random"
                else {"kind": "source", "population": self.population})

    def checked(self, items: list[Item], where: str) -> list[Item]:
        """`items` if they can make a cell: at least one, every id unique (a prompt id keys
        every comparison; two items sharing one would be compared with each other), and the
        question and gold answer text (a number there is a record of another format)."""
        if not items:
            raise BenchmarkError(f"{where}: no items (empty data or n too small)")
        seen: dict[str, int] = {}
        for index, item in enumerate(items):
            for key in ("question", "gold"):
                if not isinstance(getattr(item, key), str):
                    raise BenchmarkError(f"{where}: item {index} ({item.id}): its {key} must be a string, got "
                                         f"{type(getattr(item, key)).__name__} {excerpt(getattr(item, key))}")
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

    def sources(self) -> list:
        """Where the items and the exemplars come from (the kinds that read data)."""
        return [src for src in (getattr(self, attr, None) for attr in ("source", "exemplar_source")) if src is not None]

    @property
    def reads_hub(self) -> bool:
        """Whether any of its data is on the hub: fetched by the cells, never when planning."""
        return any(src.hub is not None for src in self.sources())

    def data_files(self) -> list[str]:
        """The local files the benchmark's items and prompts are read from (a `path` source,
        an installed package's file; exemplar and shot sources too): inputs of the jobs that
        read them, so that an edited file reruns them. Hub sources have none."""
        files = []
        for source in self.sources():
            if source.hub is not None:
                continue
            path = str(source.path) if source.path is not None else str(source.package_file())
            if path not in files:
                files.append(path)
        return files

    def scored_text(self, completion: str) -> str:
        """What of a completion is scored: the text before its first stop sequence (a base
        model writes its own next question after its answer; lm-eval cuts there too)."""
        cut = min((i for i in (completion.find(s) for s in self.stop) if i >= 0), default=len(completion))
        return completion[:cut]

    @abstractmethod
    def find_answer(self, text: str, finished: bool = True) -> tuple[str | None, str]:
        """The final answer in scored text, normalised like `Item.gold` (or None), and the
        rule of `answer_rules` that found it. `finished`: the completion ended by itself (EOS
        or a stop), not at the token limit, where it may not have given its answer yet."""

    def extract(self, completion: str, finished: bool = True) -> str | None:
        """The final answer of a completion (cut at its stop), or None."""
        return self.find_answer(self.scored_text(completion), finished)[0]

    def score(self, item: Item, completion: str, finished: bool = True) -> Score:
        """Whether the completion's answer, read from the text before its stop, equals the gold."""
        answer, rule = self.find_answer(self.scored_text(completion), finished)
        if answer is None:
            return Score(None, False, rule, "no_answer")
        correct = self.matches(answer, item, rule)
        return Score(answer, correct, rule, "correct" if correct else "wrong")

    def matches(self, answer: str, item: Item, rule: str = "") -> bool:
        """Whether a found answer, found by `rule`, equals the item's gold answer (numerically
        by default, in the forms the rule's reading allows)."""
        return answers_match(answer, item.gold, rule)

    def is_correct(self, item: Item, completion: str) -> bool:
        """Whether the completion scores as correct (see `score`)."""
        return self.score(item, completion).correct is True

    @abstractmethod
    def describe(self) -> dict:
        """Prompt format, n, scorer and source, for provenance and the report."""

    def _description(self, **extra) -> dict:
        """The fields every benchmark's `describe()` shares, followed by its own."""
        return {"name": self.name, "kind": self.kind, "n": len(self.items()), "n_requested": self.n,
                "order": self.order_description(),
                "prompt_format": self.prompt_format, "prompt_style": dict(self.prompt_style),
                "stop": list(self.stop), "stop_source": self.stop_source
                if self.stop == self.default_stop(self.prompt_style["format"]) else "the config's `stop`",
                "scorer": self.scorer, "answer_rules": list(self.answer_rules), **extra}


class MathBenchmark(Benchmark):
    """A benchmark of word problems with one numeric final answer, prompted 0-shot in chat."""

    prompt_format = "chat, 0-shot"
    scorer = ("numeric final answer of the text before the stop: the first '#### N' (after '=' on its line), "
              "else 'the answer is N', else the last number; equal within 1e-6")

    def messages(self, item: Item) -> list[dict]:
        """System instruction, then the question as the user turn."""
        return [
            {"role": "system", "content": MATH_SYSTEM_PROMPT},
            {"role": "user", "content": item.question},
        ]

    def find_answer(self, text: str, finished: bool = True) -> tuple[str | None, str]:
        """The final numeric answer, see `answers.find_answer`."""
        return find_answer(text, finished)

    def _describe(self, source: dict) -> dict:
        return self._description(system_prompt=MATH_SYSTEM_PROMPT, source=source)
