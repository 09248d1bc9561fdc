"""MATH-500 competition problems, prompted 0-shot (chat or bare) to put the final answer in
\\boxed{}, and scored by math-verify on the text before the stop sequence."""

from __future__ import annotations

import re

from tokenflip.run.benchmarks.base import SOURCE_SCHEMA, Benchmark, BenchmarkError, Item, Score
from tokenflip.run.benchmarks.math_equiv import RULES, find_math_answer, math_score
from tokenflip.run.benchmarks.sources import Source, check_local, load_records

__all__ = ["Math500Benchmark", "DEFAULT_SOURCE", "BOXED_SYSTEM_PROMPT", "BARE_INSTRUCTION"]

DEFAULT_SOURCE = Source(hub="HuggingFaceH4/MATH-500", split="test")
BOXED_SYSTEM_PROMPT = "Solve the math problem step by step. Put your final answer within \\boxed{}."
# The bare prompt keeps the request for a boxed answer even without a system prompt (a base
# model has no other way to learn the answer format): lm-evaluation-harness's minerva_math
# layout ("Problem:" ... "Solution:"), 0-shot, with the instruction between them.
BARE_INSTRUCTION = "Solve the problem step by step and put your final answer within \\boxed{}."


class Math500Benchmark(Benchmark):
    """MATH-500 problems in dataset order; gold is the `answer` field."""

    kind = "math500"
    prompt_format = "chat, 0-shot"
    scorer = ("math-verify 0.9 on the text before the stop: its parse of the answer (\\boxed{...} first, then "
              "'final answer is $...$', then the last expression) verified against the parsed gold answer")
    spec_schema = {"source": SOURCE_SCHEMA}
    answer_rules = RULES
    # lm-evaluation-harness's minerva_math stop ("Problem:"): a base model poses itself the
    # next problem after its solution. A chat reply ends with its turn.
    stops = {"chat": (), "bare": ("Problem:",)}
    stop_source = "lm-evaluation-harness minerva_math (until: Problem:)"

    @classmethod
    def default_source(cls, options: dict) -> Source:
        return DEFAULT_SOURCE

    def __init__(self, name: str = "math500", n: int | None = None, *, source: Source = DEFAULT_SOURCE) -> None:
        super().__init__(name, n)
        self.source = source
        check_local(self._label(), source)
        self._items: list[Item] | None = None
        self._gold: dict[str, list] = {}

    def _label(self) -> str:
        return f"benchmark {self.name!r} (math500)"

    def items(self) -> list[Item]:
        """The first n records of the drawn order (all if n is None)."""
        if self._items is None:
            records = load_records(self._label(), self.source)
            items, seen = [], set()
            for index, record in enumerate(records):  # every record checked in the source's order, then drawn
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
            self._items = [item for _, item in self.drawn(self.checked(items, f"{self._label()} from "
                                                                                f"{self.source.label()}"))]
        return list(self._items)

    def messages(self, item: Item) -> list[dict]:
        """System instruction asking for a boxed answer, then the problem."""
        return [
            {"role": "system", "content": BOXED_SYSTEM_PROMPT},
            {"role": "user", "content": item.question},
        ]

    def bare_text(self, item: Item) -> str:
        """"Problem:", the problem, the request for a boxed answer, then "Solution:"."""
        return f"Problem:\n{item.question.strip()}\n\n{BARE_INSTRUCTION}\n\nSolution:"

    def find_answer(self, text: str, finished: bool = True) -> tuple[str | None, str]:
        """The answer math-verify reads in the text, and which rule found it."""
        answer = find_math_answer(text)
        return answer.text, answer.rule

    def score(self, item: Item, completion: str, finished: bool = True) -> Score:
        """math-verify's verdict on the text before the stop against the gold answer."""
        return math_score(self.scored_text(completion), item, self._gold)

    def describe(self) -> dict:
        """Prompt format, n, scorer and its rules, and the source."""
        from importlib import metadata

        return self._description(system_prompt=BOXED_SYSTEM_PROMPT, bare_instruction=BARE_INSTRUCTION,
                                 math_verify=metadata.version("math-verify"), source=self.source.describe())
