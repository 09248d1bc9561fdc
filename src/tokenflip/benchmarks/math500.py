"""MATH-500 competition problems, prompted 0-shot in chat and scored on the last \\boxed{...}."""

from __future__ import annotations

import re

from .base import SOURCE_SCHEMA, Benchmark, BenchmarkError, Item
from .math_equiv import RULES, Verdict, last_boxed, math_equal
from .sources import Source, check_local, load_records

__all__ = ["Math500Benchmark", "DEFAULT_SOURCE", "BOXED_SYSTEM_PROMPT"]

DEFAULT_SOURCE = Source(hub="HuggingFaceH4/MATH-500", split="test")
BOXED_SYSTEM_PROMPT = "Solve the math problem step by step. Put your final answer within \\boxed{}."


class Math500Benchmark(Benchmark):
    """MATH-500 problems in dataset order; gold is the `answer` field."""

    kind = "math500"
    prompt_format = "chat, 0-shot"
    scorer = ("last \\boxed{...} with balanced braces, then the first rule that holds: exact, normalized "
              "(spaces, \\left/\\right, \\dfrac, units, degrees, $, %, trailing '.'), numeric (1e-6), "
              "elementwise (tuples/intervals/lists), sympy (difference simplifies to 0)")
    spec_schema = {"source": SOURCE_SCHEMA}

    @classmethod
    def default_source(cls, options: dict) -> Source:
        return DEFAULT_SOURCE

    def __init__(self, name: str = "math500", n: int | None = None, *, source: Source = DEFAULT_SOURCE) -> None:
        super().__init__(name, n)
        self.source = source
        check_local(self._label(), source)
        self._items: list[Item] | None = None

    def _label(self) -> str:
        return f"benchmark {self.name!r} (math500)"

    def items(self) -> list[Item]:
        """The first n records (all if n is None)."""
        if self._items is None:
            records = load_records(self._label(), self.source)
            if self.n is not None:
                records = records[: self.n]
            items, seen = [], set()
            for index, record in enumerate(records):
                try:
                    problem, answer = record["problem"], record["answer"]
                except (KeyError, TypeError) as e:
                    raise BenchmarkError(f"{self._label()}: record {index} of {self.source.label()} "
                                         "lacks 'problem'/'answer'") from e
                slug = re.sub(r"[^A-Za-z0-9]+", "-", str(record.get("unique_id", "")).removeprefix("test/")
                              .removesuffix(".json")).strip("-")
                item_id = f"math500-{slug}" if slug and slug not in seen else f"math500-{index:04d}"
                seen.add(slug)
                items.append(Item(id=item_id, question=problem, gold=str(answer), solution=record.get("solution")))
            self._items = self.checked(items, f"{self._label()} from {self.source.label()}")
        return list(self._items)

    def messages(self, item: Item) -> list[dict]:
        """System instruction asking for a boxed answer, then the problem."""
        return [
            {"role": "system", "content": BOXED_SYSTEM_PROMPT},
            {"role": "user", "content": item.question},
        ]

    def extract(self, completion: str) -> str | None:
        """Content of the completion's last \\boxed{...}, or None."""
        return last_boxed(completion)

    def judge(self, item: Item, completion: str) -> Verdict:
        """Whether the boxed answer equals the gold answer, and which rule decided."""
        return math_equal(self.extract(completion), item.gold)

    def is_correct(self, item: Item, completion: str) -> bool:
        """See `judge`."""
        return self.judge(item, completion).equal

    def describe(self) -> dict:
        """Prompt format, n, scorer and its rules, and the source."""
        return self._description(system_prompt=BOXED_SYSTEM_PROMPT, rules=list(RULES),
                                 source=self.source.describe())
