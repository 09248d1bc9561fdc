"""GSM8K answers written with units and words, scored as a careful grader reads them, each
with the rule (place and reading) recorded in `answer_rule`; and the forms a grader would
not accept, which stay wrong."""

from __future__ import annotations

import pytest

from tokenflip.run.benchmarks import Item, build_benchmark
from tokenflip.run.benchmarks.answers import NUMERIC_RULES, answers_match, find_answer


def _score(completion: str, gold: str):
    bench = build_benchmark("g", {"kind": "gsm8k", "format": "bare", "system_prompt": False})
    score = bench.score(Item(id="x", question="q", gold=gold), completion)
    assert score.rule in bench.answer_rules
    return score


@pytest.mark.parametrize(("completion", "gold", "extracted", "rule"), [
    # one quantity in two units: the total in the smaller unit, matched in either unit
    ("He works 2 hours and 40 minutes.\n#### 2 hours and 40 minutes", "160", "160", "####, hours and minutes"),
    ("#### 2 hours and 30 minutes", "2.5", "150", "####, hours and minutes"),
    ("#### 1 minute 30 seconds", "90", "90", "####, minutes and seconds"),
    ("The answer is 5 dollars and 50 cents.", "5.5", "550", "answer is, dollars and cents"),
    ("So the film lasts 1 hour and 30 minutes.", "90", "90", "last number, hours and minutes"),
    # below zero is negative
    ("#### 3 degrees below zero", "-3", "-3", "####, below zero"),
    ("The answer is 12 °C below zero.", "-12", "-12", "answer is, below zero"),
    # a percent is its number and its fraction
    ("#### 75%", "0.75", "75", "####, percent"),
    ("#### 75%", "75", "75", "####, percent"),
    ("The answer is 40 percent.", "0.4", "40", "answer is, percent"),
    # number words (where the answer holds no digits)
    ("#### eighteen dollars", "18", "18", "####, number words"),
    ("The answer is eighteen dollars.", "18", "18", "answer is, number words"),
    ("#### one hundred and twenty-five", "125", "125", "####, number words"),
    ("#### two thousand three hundred", "2300", "2300", "####, number words"),
    # digits grouped by spaces, scale words
    ("#### 70 000", "70000", "70000", "####, spaced digits"),
    ("#### 1\u202f250\u202f000 dollars", "1250000", "1250000", "####, spaced digits"),
    ("#### 70k", "70000", "70000", "####, scale word"),
    ("#### $1.45 million", "1450000", "1450000", "####, scale word"),
    ("The answer is 3 thousand.", "3000", "3000", "answer is, scale word"),
])
def test_a_number_in_words_or_units_is_read_as_a_grader_reads_it(completion, gold, extracted, rule):
    score = _score(completion, gold)
    assert (score.extracted, score.rule, score.correct, score.verdict) == (extracted, rule, True, "correct")


@pytest.mark.parametrize(("completion", "gold", "extracted", "rule", "why"), [
    # A unit the question did not ask for is not converted: a grader marks 0.54 km wrong
    # when the question asks for metres (the answer must be in the asked unit).
    ("She walks 540 m, which is 0.54 km", "540", "0.54", "last number", "unit conversion not asked for"),
    ("#### 0.54 km", "540", "0.54", "####", "unit conversion not asked for"),
    # A fraction where the question asks for a percent is not scaled up (75% is 0.75, but a
    # bare 0.75 is not the percent the question asked for).
    ("#### 0.75", "75", "0.75", "####", "a fraction is not the percent asked for"),
    # A mixed quantity matches in its own units only, not in a third one.
    ("#### 2 hours and 40 minutes", "9600", "160", "####, hours and minutes", "seconds were not named"),
    # Below zero is not the magnitude.
    ("#### 3 degrees below zero", "3", "-3", "####, below zero", "below zero is negative"),
    # A percent of something else stays wrong in both readings.
    ("#### 25%", "75", "25", "####, percent", "the other share"),
])
def test_what_a_grader_would_not_accept_stays_wrong(completion, gold, extracted, rule, why):
    score = _score(completion, gold)
    assert (score.extracted, score.rule, score.correct, score.verdict) == (extracted, rule, False, "wrong"), why


@pytest.mark.parametrize(("completion", "extracted", "rule"), [
    ("He ran 3 hours and then 5 miles.", "5", "last number"),       # "5 miles" is no minutes
    ("#### none\nso it is 5", None, "####"),                        # "none" holds no "one"
    ("Each of the 2 boxes has 100 balls, so 200 balls.", "200", "last number"),
    ("#### 2 1/2", "2.5", "####"),                                  # a mixed number, not spaced digits
    ("He buys 3 500-ml bottles.", "500", "last number"),            # a count, then a size
    ("It is 5 degrees above zero.", "5", "last number"),
    ("#### 3:30", None, "####"),                                    # a time of day stays no number
    ("It took one day, so the total is 12 apples.", "12", "last number"),  # no words beside digits
])
def test_other_text_keeps_its_reading(completion, extracted, rule):
    assert find_answer(completion) == (extracted, rule)


def test_every_rule_is_declared_and_matching_without_a_rule_is_plain():
    assert all(rule in NUMERIC_RULES for rule in ("####", "####, percent", "last number, hours and minutes", "none"))
    assert answers_match("75", "0.75", "####, percent") and not answers_match("75", "0.75")
