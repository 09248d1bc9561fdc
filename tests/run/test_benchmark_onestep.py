"""Tests for the built-in one-step word problems: generation, gold answers, prompt and scorer."""

from __future__ import annotations

import re

import pytest

from tokenflip.run.benchmarks.base import BenchmarkError, Item
from tokenflip.run.benchmarks.onestep import (
    MAX_SHOTS,
    OPERATIONS,
    SYSTEM_PROMPT,
    OneStepBenchmark,
    exemplar,
    extract_final,
    operation_of,
)

# Each operation's question, read back with a pattern of its own and solved here, apart
# from the generator.
QUESTION_FORMS = {
    "multiply": (re.compile(r"^\w+ buys (\d+) [a-z]+ at \$(\d+) each\. How many dollars does \w+ spend\?$"),
                 lambda a, b: a * b),
    "divide": (re.compile(r"^\w+ shares (\d+) ([a-z]+) equally among (\d+) friends\. "
                          r"How many \2 does each friend get\?$"), None),
    "add": (re.compile(r"^\w+ has (\d+) ([a-z]+) and gets (\d+) more\. How many \2 does \w+ have now\?$"),
            lambda a, b: a + b),
    "subtract": (re.compile(r"^\w+ has (\d+) ([a-z]+) and gives (\d+) away\. How many \2 are left\?$"),
                 lambda a, b: a - b),
}


def solve(question: str) -> tuple[str, int]:
    """(operation, answer) of a question, worked out from its text alone."""
    for operation, (pattern, apply) in QUESTION_FORMS.items():
        match = pattern.match(question)
        if match is None:
            continue
        numbers = [int(g) for g in match.groups() if g.isdigit()]
        if operation == "divide":
            total, friends = numbers
            assert total % friends == 0, question
            return operation, total // friends
        return operation, apply(*numbers)
    raise AssertionError(f"question in no known form: {question!r}")


def onestep(n: int, seed: int = 0, shots: int = 1) -> OneStepBenchmark:
    return OneStepBenchmark("quick", n=n, seed=seed, shots=shots)


# --- items -------------------------------------------------------------------------------


def test_items_are_deterministic_and_independent_of_n():
    assert onestep(40).items() == onestep(40).items()
    assert onestep(40).items()[:7] == onestep(7).items()
    assert onestep(40, shots=3).items() == onestep(40, shots=0).items()


def test_seed_changes_items():
    a, b = onestep(30, seed=0).items(), onestep(30, seed=1).items()
    assert [i.question for i in a] != [i.question for i in b]
    assert all(i.id.startswith("onestep-s1-") for i in b)


def test_ids_unique_and_carry_the_operation():
    items = onestep(300).items()
    assert len({i.id for i in items}) == 300
    for item in items:
        assert re.fullmatch(r"onestep-s0-\d{4}-(add|divide|multiply|subtract)", item.id)


def test_gold_answers_are_right():
    for item in onestep(300, seed=3).items():
        operation, answer = solve(item.question)
        assert operation_of(item) == operation
        assert item.gold == str(answer)
        assert answer > 0
        # The worked solution is in the format the scorer reads.
        assert extract_final(item.solution) == item.gold


def test_every_operation_occurs():
    operations = [operation_of(i) for i in onestep(100).items()]
    assert set(operations) == set(OPERATIONS)
    assert min(operations.count(op) for op in OPERATIONS) >= 10


def test_operation_of_rejects_foreign_items():
    with pytest.raises(BenchmarkError, match="not a onestep item"):
        operation_of(Item(id="arithmetic-s0-0001", question="?", gold="1"))


# --- prompt --------------------------------------------------------------------------------


@pytest.mark.parametrize("shots", [0, 1, MAX_SHOTS])
def test_messages_are_system_examples_then_question(shots):
    bench = onestep(12, shots=shots)
    for item in bench.items():
        messages = bench.messages(item)
        assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert messages[-1] == {"role": "user", "content": item.question}
        turns = messages[1:-1]
        assert len(turns) == 2 * shots
        assert [m["role"] for m in turns] == ["user", "assistant"] * shots
        assert all(set(m) == {"role", "content"} and m["content"].strip() for m in messages)
        for question, answer in zip(turns[::2], turns[1::2]):
            # Examples show the item's own operation, solved right, in the asked format.
            operation, gold = solve(question["content"])
            assert operation == operation_of(item)
            assert answer["content"].endswith(f"\n#### {gold}")
            assert question["content"] != item.question
        assert len({m["content"] for m in turns[::2]}) == shots


def test_exemplars_are_fixed_and_distinct():
    for operation in OPERATIONS:
        shown = [exemplar(operation, i) for i in range(MAX_SHOTS)]
        assert shown == [exemplar(operation, i) for i in range(MAX_SHOTS)]
        assert len(set(shown)) == MAX_SHOTS


# --- scorer --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("Mia spends 3 * 4 = 12 dollars.\n#### 12", "12"),
        ("Mia spends 3 * 4 = 12 dollars.\n#### 12<|im_end|>", "12"),
        ("####12", "12"),
        ("#### 12 more", "12"),
        ("#### 12.", "12"),
        ("#### 012", "12"),
        ("#### -3", "-3"),
        ("#### 12\n#### 13", "12"),          # the first answer counts
        ("So 7 - 2 = 5.\n#### 5 marbles, or 6", "5"),
        ("Mia spends 3 * 4 = 12 dollars.", None),   # no final line: not answered
        ("Mia spends 3 * 4 = 12 dollars.\n###", None),  # cut off by the token budget
        ("#### twelve", None),
        ("####\n12", None),
        ("#### 12.5", None),
        ("#### 1,234", None),
        ("", None),
    ],
)
def test_extract_final(completion, expected):
    assert extract_final(completion) == expected


def test_is_correct_on_hand_made_completions():
    bench = onestep(1)
    item = bench.items()[0]
    gold = int(item.gold)
    assert bench.is_correct(item, f"Some line.\n#### {gold}")
    assert bench.is_correct(item, item.solution)
    assert not bench.is_correct(item, f"Some line.\n#### {gold + 1}")
    assert not bench.is_correct(item, f"The answer is {gold}.")  # not the asked format
    assert not bench.is_correct(item, f"#### {gold + 1}\n#### {gold}")
    assert bench.is_correct(item, f"#### {gold}\nThen {gold + 5} more words.")


# --- construction and provenance -------------------------------------------------------


def test_describe_is_complete():
    description = onestep(5, seed=7, shots=2).describe()
    assert description["name"] == "quick"
    assert description["kind"] == "onestep"
    assert description["n"] == description["n_requested"] == 5
    assert description["prompt_format"] == "chat, 2-shot (worked examples as earlier turns)"
    assert description["scorer"] == "exact integer after the first '####'"
    assert description["system_prompt"] == SYSTEM_PROMPT
    assert description["shots"] == 2
    source = description["source"]
    assert source["builtin"] == "tokenflip.benchmarks.onestep"
    assert isinstance(source["generator_version"], int)
    assert source["seed"] == 7
    assert source["operations"] == sorted(OPERATIONS)


def test_from_spec_takes_the_schema_keys():
    spec = {"kind": "onestep", "n": 6, "seed": 2, "shots": 2, "max_new_tokens": 32}
    assert set(spec) - {"kind", "n", "max_new_tokens"} == set(OneStepBenchmark.spec_schema)
    bench = OneStepBenchmark.from_spec("q", spec)
    assert (bench.name, bench.n, bench.seed, bench.shots) == ("q", 6, 2, 2)
    assert bench.items() == onestep(6, seed=2).items()


@pytest.mark.parametrize(
    "kwargs",
    [{"n": 0}, {"n": None}, {"n": "5"}, {"seed": -1}, {"seed": True}, {"seed": "0"},
     {"shots": -1}, {"shots": MAX_SHOTS + 1}, {"shots": 1.0}],
)
def test_bad_arguments(kwargs):
    with pytest.raises(BenchmarkError):
        OneStepBenchmark("q", **{"n": 3, **kwargs})
