"""Built-in arithmetic word problems, generated from a seed, so the default config needs no data."""

from __future__ import annotations

import random
from collections.abc import Callable

from tokenflip.run.benchmarks.base import BenchmarkError, Item, MathBenchmark

__all__ = ["ArithmeticBenchmark", "GENERATOR_VERSION", "make_item"]

GENERATOR_VERSION = 1

_NAMES = ["Mia", "Liam", "Ava", "Noah", "Zoe", "Omar", "Priya", "Ken", "Lena", "Sam", "Rosa", "Ivan"]
_GOODS = ["notebooks", "pens", "apples", "toy cars", "cupcakes", "books", "candles", "mugs"]
_EVENTS = ["a school trip", "a birthday party", "the new term", "a picnic", "a family visit"]
_THINGS = ["stickers", "marbles", "pencils", "stamps", "cards", "shells", "beads", "buttons"]
_PLACES = ["classroom", "library", "toy shop", "craft room", "bookstore"]
_ACTIVITIES = [
    ("read", "read", "pages"),
    ("biked", "bike", "miles"),
    ("swam", "swim", "laps"),
    ("walked", "walk", "blocks"),
]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]

_Problem = tuple[str, list[str], int]


def _buying(rng: random.Random) -> _Problem:
    name, goods, event = rng.choice(_NAMES), rng.choice(_GOODS), rng.choice(_EVENTS)
    a, p = rng.randint(2, 9), rng.randint(2, 12)
    total = a * p
    question = (
        f"{name} is getting ready for {event} and buys {a} {goods} at the store for ${p} each. "
        f"How many dollars does {name} spend altogether?"
    )
    return question, [f"{name} spends {a} * {p} = {total} dollars."], total


def _sharing(rng: random.Random) -> _Problem:
    name, things = rng.choice(_NAMES), rng.choice(_THINGS)
    k, q = rng.randint(2, 8), rng.randint(3, 15)
    total = k * q
    question = (
        f"{name} has {total} {things} and wants to share all of them equally among {k} friends, "
        f"keeping none. How many {things} does each friend get?"
    )
    return question, [f"Each friend gets {total} / {k} = {q} {things}."], q


def _groups(rng: random.Random) -> _Problem:
    place, things = rng.choice(_PLACES), rng.choice(_THINGS)
    g, m, extra = rng.randint(2, 9), rng.randint(3, 20), rng.randint(1, 30)
    shelved = g * m
    total = shelved + extra
    question = (
        f"A {place} has {g} shelves with {m} {things} on each shelf, and another {extra} {things} "
        f"in a box by the door. How many {things} are there in total?"
    )
    steps = [
        f"The shelves hold {g} * {m} = {shelved} {things}.",
        f"With the box there are {shelved} + {extra} = {total} {things}.",
    ]
    return question, steps, total


def _difference(rng: random.Random) -> _Problem:
    name = rng.choice(_NAMES)
    past, verb, unit = rng.choice(_ACTIVITIES)
    day1, day2 = rng.sample(_DAYS, 2)
    a = rng.randint(20, 90)
    b = rng.randint(5, a - 1)
    diff = a - b
    question = (
        f"{name} {past} {a} {unit} on {day1} and {b} {unit} on {day2}. "
        f"How many more {unit} did {name} {verb} on {day1} than on {day2}?"
    )
    return question, [f"{name} did {a} - {b} = {diff} more {unit} on {day1}."], diff


def _change(rng: random.Random) -> _Problem:
    name, goods = rng.choice(_NAMES), rng.choice(_GOODS)
    a, p = rng.randint(2, 6), rng.randint(2, 9)
    cost = a * p
    bill = rng.choice([b for b in (20, 50, 100) if b > cost])
    change = bill - cost
    question = (
        f"{name} buys {a} {goods} for ${p} each and pays with a ${bill} bill. "
        f"How much change, in dollars, does {name} get back from the cashier?"
    )
    steps = [
        f"The {goods} cost {a} * {p} = {cost} dollars.",
        f"The change is {bill} - {cost} = {change} dollars.",
    ]
    return question, steps, change


def _packs(rng: random.Random) -> _Problem:
    name, things = rng.choice(_NAMES), rng.choice(_THINGS)
    a, b, c = rng.randint(5, 40), rng.randint(2, 6), rng.randint(3, 10)
    d = rng.randint(1, a)
    bought = b * c
    held = a + bought
    left = held - d
    question = (
        f"{name} starts with {a} {things}, buys {b} packs with {c} {things} in each pack, "
        f"and then gives {d} {things} to a friend. How many {things} does {name} have now?"
    )
    steps = [
        f"The packs hold {b} * {c} = {bought} {things}.",
        f"{name} then has {a} + {bought} = {held} {things}.",
        f"After giving some away, {name} has {held} - {d} = {left} {things}.",
    ]
    return question, steps, left


def _baking(rng: random.Random) -> _Problem:
    name = rng.choice(_NAMES)
    c, bags, eaten = rng.randint(3, 8), rng.randint(2, 12), rng.randint(1, 6)
    rest = bags * c
    baked = rest + eaten
    question = (
        f"{name} bakes {baked} cookies, eats {eaten} of them while they cool, and packs the rest "
        f"into bags of {c} cookies each. How many bags does {name} fill?"
    )
    steps = [
        f"{name} packs {baked} - {eaten} = {rest} cookies.",
        f"That fills {rest} / {c} = {bags} bags.",
    ]
    return question, steps, bags


TEMPLATES: dict[str, Callable[[random.Random], _Problem]] = {
    "buying": _buying,
    "sharing": _sharing,
    "groups": _groups,
    "difference": _difference,
    "change": _change,
    "packs": _packs,
    "baking": _baking,
}


def make_item(seed: int, index: int) -> Item:
    """Item `index` of the set for `seed`; depends on nothing else."""
    rng = random.Random(f"{seed}:{index}")
    template = TEMPLATES[rng.choice(sorted(TEMPLATES))]
    question, steps, answer = template(rng)
    solution = "\n".join([*steps, f"#### {answer}"])
    return Item(id=f"arithmetic-s{seed}-{index:04d}", question=question, gold=str(answer), solution=solution)


class ArithmeticBenchmark(MathBenchmark):
    """Generated arithmetic word problems with exact positive integer answers below 1000."""

    kind = "arithmetic"
    spec_schema = {"seed": {"type": "integer", "minimum": 0, "default": 0}}

    def __init__(self, name: str = "arithmetic", n: int = 16, seed: int = 0) -> None:
        if n is None:
            raise BenchmarkError(f"benchmark {name!r} (arithmetic): n is required")
        super().__init__(name, n)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise BenchmarkError(f"benchmark {name!r} (arithmetic): seed must be an integer, got {seed!r}")
        self.seed = seed

    def items(self) -> list[Item]:
        """Items 0..n-1 for this seed."""
        return self.checked([make_item(self.seed, i) for i in range(self.n)], f"benchmark {self.name!r}")

    def describe(self) -> dict:
        """Provenance: generator version, seed and template names."""
        return self._describe({
            # the data set's recorded name (stable across moves of the module: cells keep it)
            "builtin": "tokenflip.benchmarks.arithmetic",
            "generator_version": GENERATOR_VERSION,
            "seed": self.seed,
            "templates": sorted(TEMPLATES),
        })
