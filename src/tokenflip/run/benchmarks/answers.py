"""The final numeric answer of a completion (GSM8K and the built-in word problems), which
rule found it, and numeric comparison with the gold answer.

The rules follow lm-evaluation-harness's GSM8K task (its "strict-match" filter takes the
first `#### N`, its "flexible-extract" the last number) and read the number as a person
would where its regexes cannot: `#### $18`, `#### 18.00`, `#### **18**`, `1,000`, `−10`
(Unicode minus), `1/2`, `2 1/2` and `#### twelve` are numbers, `#### 9 * 2 = 18` answers 18,
"The answer is 9 sprints of 60 meters, i.e. 540 meters." answers 540, and `#### 3:30` (a
time) is no number. The completion is cut at its stop sequence before any rule reads it
(`Benchmark.scored_text`), so a base model's own next "Question: ... #### N" is never read.
tests/run/test_benchmarks.py checks every rule against lm-eval's filters and a careful judge.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from tokenflip.run.benchmarks import quantities

__all__ = ["extract_answer", "find_answer", "normalize_answer", "answers_match", "NUMERIC_RULES"]

# Which rule found the answer, in the order they are tried; where the number was written in
# another form (`quantities`), its reading follows: "####, percent".
_PLACES = ("####", "answer is", "last number")
NUMERIC_RULES = (*_PLACES, *(f"{place}, {reading}" for place in _PLACES for reading in quantities.READINGS), "none")

_MINUS = "-\u2212"  # hyphen-minus and the Unicode minus sign
# A number: optional sign and `$`, digits with or without thousands commas, decimals; not
# part of a word, a decimal, or a time of day ("3:30").
_NUM = (rf"(?:(?<![\w.])[{_MINUS}])?\$?(?<![\w.:])(?:\d{{1,3}}(?:,\d{{3}})+(?!\d)|\d+)(?:\.\d+)?(?![\d:])"
        rf"|(?:(?<![\w.])[{_MINUS}])?\$?(?<![\w.])\.\d+")
# A quantity: a mixed number (2 1/2), a fraction (5/2) or a number.
_QUANTITY = re.compile(rf"(?P<whole>{_NUM})\s+(?P<mn>\d+)\s*/\s*(?P<md>\d+)(?![\d.,/])"
                       rf"|(?P<num>{_NUM})\s*/\s*(?P<den>\d+)(?![\d.,/])"
                       rf"|(?P<plain>{_NUM})")
_DECIMAL_COMMA = re.compile(rf"\s*(?:\*\*)?\s*([{_MINUS}]?\$?\d+),(\d{{1,2}})(?:\*\*)?\s*\.?\s*$")
_TIME = re.compile(r"\d:\d\d")
_ANSWER_IS = re.compile(r"\b(?:final\s+)?answer\s*(?:is|:)\s*:?", re.I)
# Where the sentence that states the answer ends: a line break, or a full stop before a
# capitalised word ("18 dollars. She ..."), not the one in "i.e. 540".
_SENTENCE_END = re.compile(r"\n|\.\s+(?=[A-Z])")
# A restatement within that sentence: the number after the last one is the answer.
_RESTATED = re.compile(r"=|\bi\.\s?e\.?|\bthat is\b|\bwhich is\b", re.I)
_UNITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
          "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_WORD_NUMBER = re.compile(rf"\b(?:(?P<tens>{'|'.join(_TENS)})(?:[\s-](?P<unit>{'|'.join(_UNITS[1:10])}))?"
                          rf"|(?P<small>{'|'.join(_UNITS)}))\b", re.I)
_TOLERANCE = Decimal("1e-6")


def normalize_answer(text: str | None) -> str | None:
    """Canonical form of a number: no commas, `$`, spaces or trailing `.`, a Unicode minus
    as `-`; "18.00" -> "18", "0.50" -> "0.5"."""
    if text is None:
        return None
    cleaned = re.sub(r"[\s,$]", "", text).replace("\u2212", "-").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _value(match: re.Match) -> str | None:
    """The normalised value of a `_QUANTITY` match (a fraction's quotient)."""
    if match.group("plain") is not None:
        return normalize_answer(match.group("plain"))
    if match.group("num") is not None:
        whole, numerator, denominator = "0", match.group("num"), match.group("den")
    else:
        whole, numerator, denominator = match.group("whole"), match.group("mn"), match.group("md")
    parts = [normalize_answer(p) for p in (whole, numerator)]
    if None in parts or int(denominator) == 0:
        return None
    sign = -1 if parts[0].startswith("-") or parts[1].startswith("-") else 1
    value = abs(Decimal(parts[0])) + abs(Decimal(parts[1])) / Decimal(denominator)
    return normalize_answer(str(sign * value))


def _word_number(text: str) -> str | None:
    """A number written as one English word or two ("twelve", "twenty-five"), or None."""
    match = _WORD_NUMBER.search(text)
    if match is None:
        return None
    if match.group("small"):
        return str(_UNITS.index(match.group("small").lower()))
    unit = _UNITS.index(match.group("unit").lower()) if match.group("unit") else 0
    return str(20 + 10 * _TENS.index(match.group("tens").lower()) + unit)


def _stated(span: str) -> str | None:
    """The number a statement gives: after its last restatement ("= 18", "i.e. 540") if that
    part holds exactly one number, else its first number."""
    marks = list(_RESTATED.finditer(span))
    if marks:
        tail = list(_QUANTITY.finditer(span, marks[-1].end()))
        if len(tail) == 1:
            return _value(tail[0])
    first = _QUANTITY.search(span)
    return _value(first) if first else None


def _final_line(text: str) -> str:
    """What follows "####": the rest of its line, or the next non-empty line if that is blank."""
    lines = text.split("\n")
    return next((line for line in lines if line.strip()), "")


def _hash_answer(line: str) -> str | None:
    """The number of a "####" line, or None for a time of day or text without a number."""
    comma = _DECIMAL_COMMA.match(line)
    if comma:  # "#### 2,5": a decimal comma (a thousands comma has three digits after it)
        return normalize_answer(f"{comma.group(1)}.{comma.group(2)}")
    if _TIME.search(line) and not _QUANTITY.search(_TIME.sub(" ", line)):
        return None
    return _stated(line) or _word_number(line)


def _last_stated(text: str) -> str | None:
    """The answer of a text without an answer line, as a reader takes it: in its last
    sentence that holds a number, the result after its last "=", else its last number."""
    for sentence in reversed(_SENTENCE_END.split(text)):
        found = list(_QUANTITY.finditer(sentence))
        if not found:
            continue
        equals = sentence.rfind("=")
        after = [m for m in found if m.start() > equals] if equals >= 0 else []
        return _value(after[0] if after else found[-1])
    return None


def find_answer(completion: str, finished: bool = True) -> tuple[str | None, str]:
    """The final numeric answer of a completion, normalised, and the rule that found it:

    - "####": the first "####" decides, with the number on its line (after "=" if the line
      is an equation); a time or a word that is no number there is no answer;
    - "answer is": the sentence after the first "answer is" / "answer:" (after its last
      restatement, "i.e. 540");
    - "last number": for a completion that ended by itself (`finished`; not one cut at the
      token limit, which gave no answer yet), its last sentence's result;
    - else (None, "none")."""
    if "####" in completion:
        found, rule = _read(_final_line(completion.split("####", 1)[1]), _hash_answer, "####")
        return found, rule if found is not None else "####"
    said = _ANSWER_IS.search(completion)
    if said:
        rest = completion[said.end():]
        end = _SENTENCE_END.search(rest)
        found, rule = _read(rest[:end.start()] if end else rest, _stated, "answer is")
        if found is not None:
            return found, rule
    if finished:
        found, rule = _read(completion, _last_stated, "last number", words=False)
        if found is not None:
            return found, rule
    return None, "none"


def _read(text: str, rule, place: str, words: bool = True) -> tuple[str | None, str]:
    """`rule` applied to `text` with its numbers in other forms as digits (`quantities`), and
    the rule's name: the place, with the reading that made the answer if one did."""
    plain, readings = quantities.rewrite(text, words)
    found = rule(plain)
    reading = readings.get(found) if found is not None else None
    if found is not None and reading is None and found in quantities.percent_values(plain, normalize_answer):
        reading = "percent"
    return found, f"{place}, {reading}" if reading else place


def extract_answer(completion: str, finished: bool = True) -> str | None:
    """The final numeric answer of a completion, normalised, or None (see `find_answer`)."""
    return find_answer(completion, finished)[0]


def answers_match(predicted: str | None, gold: str | None, rule: str = "") -> bool:
    """Whether two answers are numerically equal (within 1e-6, in exact decimal arithmetic,
    so large integers that differ in one digit never match); None never matches. `rule`:
    the rule that found `predicted`; a percent or a mixed quantity also matches in the
    forms its reading allows (`quantities.candidates`: 75% is 0.75)."""
    a, b = normalize_answer(predicted), normalize_answer(gold)
    if a is None or b is None:
        return False
    reading = rule.partition(", ")[2] or None
    return any(abs(value - Decimal(b)) <= _TOLERANCE for value in quantities.candidates(Decimal(a), reading))
