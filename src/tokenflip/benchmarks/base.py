"""The benchmark interface: items to prompt with and a scorer for completions."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

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


class Benchmark(ABC):
    """A fixed, ordered list of items, how to prompt with them, and how to score answers."""

    kind: str = ""
    prompt_format: str = ""
    scorer: str = ""

    def __init__(self, name: str, n: int | None) -> None:
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise BenchmarkError(f"benchmark {name!r}: n must be a positive integer, got {n!r}")
        self.name = name
        self.n = n

    @abstractmethod
    def items(self) -> list[Item]:
        """The first `n` items, always in the same order."""

    @abstractmethod
    def messages(self, item: Item) -> list[dict]:
        """Chat messages for `tokenizer.apply_chat_template`."""

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
                "prompt_format": self.prompt_format, "scorer": self.scorer, **extra}


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
