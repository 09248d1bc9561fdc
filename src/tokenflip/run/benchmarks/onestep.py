"""Built-in one-step word problems, answered in one line: a scored benchmark a 135M model
can do within a short budget.

Each item is one operation (multiply, divide, add or subtract on small numbers) told in a
sentence; the prompt shows worked examples as earlier chat turns, so the model answers
in the same shape: one sentence with the calculation, then `#### <number>`. That puts the
answer within about 20 new tokens, after the calculation (where a divergence can still
change it), and the scorer reads exactly the integer that follows the first `####`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from tokenflip.run.benchmarks.base import Benchmark, BenchmarkError, Item

__all__ = ["OneStepBenchmark", "GENERATOR_VERSION", "MAX_SHOTS", "OPERATIONS", "SYSTEM_PROMPT", "make_item",
           "operation_of", "exemplar", "extract_final"]

GENERATOR_VERSION = 1

SYSTEM_PROMPT = "Answer in one line, then write '#### <number>'."

_NAMES = ["Mia", "Liam", "Ava", "Noah", "Zoe", "Omar", "Priya", "Ken", "Lena", "Sam", "Rosa", "Ivan"]
_GOODS = ["pens", "apples", "books", "mugs", "cupcakes", "candles", "kites", "socks"]
_THINGS = ["stickers", "marbles", "pencils", "stamps", "cards", "shells", "beads", "buttons"]

# (question, worked answer line without the final '####', answer)
_Problem = tuple[str, str, int]


def _multiply(rng: random.Random) -> _Problem:
    name, goods = rng.choice(_NAMES), rng.choice(_GOODS)
    count, price = rng.randint(2, 9), rng.randint(2, 9)
    total = count * price
    return (f"{name} buys {count} {goods} at ${price} each. How many dollars does {name} spend?",
            f"{name} spends {count} * {price} = {total} dollars.", total)


def _divide(rng: random.Random) -> _Problem:
    name, things = rng.choice(_NAMES), rng.choice(_THINGS)
    friends, each = rng.randint(2, 9), rng.randint(2, 9)
    total = friends * each
    return (f"{name} shares {total} {things} equally among {friends} friends. "
            f"How many {things} does each friend get?",
            f"Each friend gets {total} / {friends} = {each} {things}.", each)


def _add(rng: random.Random) -> _Problem:
    name, things = rng.choice(_NAMES), rng.choice(_THINGS)
    have, found = rng.randint(2, 9), rng.randint(2, 9)
    total = have + found
    return (f"{name} has {have} {things} and gets {found} more. How many {things} does {name} have now?",
            f"{name} has {have} + {found} = {total} {things}.", total)


def _subtract(rng: random.Random) -> _Problem:
    name, things = rng.choice(_NAMES), rng.choice(_THINGS)
    have = rng.randint(10, 19)
    given = rng.randint(2, 9)
    left = have - given
    return (f"{name} has {have} {things} and gives {given} away. How many {things} are left?",
            f"{name} has {have} - {given} = {left} {things} left.", left)


OPERATIONS: dict[str, Callable[[random.Random], _Problem]] = {
    "multiply": _multiply,
    "divide": _divide,
    "add": _add,
    "subtract": _subtract,
}
MAX_SHOTS = 3

_FINAL = re.compile(r"####[ \t]*(-?\d+)(?![\d.,]*\d)")


def make_item(seed: int, index: int) -> Item:
    """Item `index` of the set for `seed`; depends on nothing else. Its id ends with its
    operation, which picks the worked examples shown before it."""
    rng = random.Random(f"onestep:{seed}:{index}")
    operation = rng.choice(sorted(OPERATIONS))
    question, line, answer = OPERATIONS[operation](rng)
    return Item(id=f"onestep-s{seed}-{index:04d}-{operation}", question=question, gold=str(answer),
                solution=f"{line}\n#### {answer}")


def operation_of(item: Item) -> str:
    """The operation of an item made by `make_item` (the last part of its id)."""
    operation = item.id.rsplit("-", 1)[-1]
    if operation not in OPERATIONS:
        raise BenchmarkError(f"item {item.id!r} is not a onestep item")
    return operation


def exemplar(operation: str, index: int = 0) -> tuple[str, str]:
    """Fixed worked example `index` for `operation`: (question, answer) as chat turns show them."""
    question, line, answer = OPERATIONS[operation](random.Random(f"onestep-exemplar:{operation}:{index}"))
    return question, f"{line}\n#### {answer}"


def extract_final(completion: str) -> str | None:
    """The integer right after the first `####`, or None: exactly what the prompt asks for.

    No fallback to other numbers in the text, so an answer counts only when the model
    finished it in the asked format within the token budget."""
    match = _FINAL.search(completion)
    if match is None:
        return None
    return str(int(match.group(1)))


class OneStepBenchmark(Benchmark):
    """Generated one-step word problems with a few-shot chat prompt and exact integer scoring."""

    kind = "onestep"
    answer_rules = ("####", "none")
    scorer = "exact integer after the first '####'"
    spec_schema = {
        "seed": {"type": "integer", "minimum": 0, "default": 0},
        "shots": {"type": "integer", "minimum": 0, "maximum": MAX_SHOTS, "default": 1,
                  "description": "worked examples of the item's operation, shown as earlier chat turns"},
    }

    def __init__(self, name: str = "onestep", n: int = 32, seed: int = 0, shots: int = 1) -> None:
        if n is None:
            raise BenchmarkError(f"benchmark {name!r} (onestep): n is required")
        super().__init__(name, n)
        for key, value in (("seed", seed), ("shots", shots)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BenchmarkError(f"benchmark {name!r} (onestep): {key} must be a non-negative integer, "
                                     f"got {value!r}")
        if shots > MAX_SHOTS:
            raise BenchmarkError(f"benchmark {name!r} (onestep): shots must be at most {MAX_SHOTS}, "
                                 f"got {shots}")
        self.seed = seed
        self.shots = shots

    @property
    def prompt_format(self) -> str:  # type: ignore[override]
        return f"chat, {self.shots}-shot (worked examples as earlier turns)"

    def items(self) -> list[Item]:
        """Items 0..n-1 for this seed."""
        return self.checked([make_item(self.seed, i) for i in range(self.n)], f"benchmark {self.name!r}")

    def messages(self, item: Item) -> list[dict]:
        """System instruction, the worked examples as user/assistant turns, then the question."""
        turns: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
        for index in range(self.shots):
            question, answer = exemplar(operation_of(item), index)
            turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        return turns + [{"role": "user", "content": item.question}]

    def find_answer(self, text: str, finished: bool = True) -> tuple[str | None, str]:
        """Only the integer after the first `####` counts, see `extract_final`."""
        answer = extract_final(text)
        return answer, "####" if answer is not None else "none"

    def describe(self) -> dict:
        """Provenance: generator version, seed, operations, shots and the system prompt."""
        return self._description(system_prompt=SYSTEM_PROMPT, shots=self.shots, source={
            # the data set's recorded name (stable across moves of the module: cells keep it)
            "builtin": "tokenflip.benchmarks.onestep",
            "generator_version": GENERATOR_VERSION,
            "seed": self.seed,
            "operations": sorted(OPERATIONS),
            "exemplars": "per operation, fixed (independent of the seed)",
        })
