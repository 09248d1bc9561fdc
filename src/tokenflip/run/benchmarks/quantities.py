"""Numbers as people write them besides plain digits, read the way a careful grader reads
them: `70 000` (digits grouped by spaces), `70k` and `1.45 million` (a scale), `eighteen`
and `one hundred and five` (words), `3 degrees below zero` (-3), `2 hours and 40 minutes`
(one quantity in two units) and `75%` (a percent of the gold's 0.75 as well as 75).

`rewrite` turns each form into plain digits and reports which reading made which value, so
that the answer rules (`answers`) read one form and each row records the reading
(`answer_rule` "####, percent"). What a grader would not accept stays wrong: a unit the
question did not ask for ("0.54 km" where the answer is 540 metres) is not converted,
and a share written as a fraction ("0.75" where the question asks for a percent) is not
scaled; only the units a mixed quantity names itself are candidates.
"""

from __future__ import annotations

import re
from decimal import Decimal

__all__ = ["READINGS", "MIXED_UNITS", "rewrite", "percent_values", "candidates"]

_N = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
# One quantity in two units: (reading, larger unit, smaller unit, smaller units per larger).
MIXED_UNITS = (
    ("days and hours", r"days?", r"hours?|hrs?", 24),
    ("hours and minutes", r"hours?|hrs?|h", r"minutes?|mins?", 60),
    ("minutes and seconds", r"minutes?|mins?", r"seconds?|secs?", 60),
    ("dollars and cents", r"dollars?", r"cents?", 100),
    ("feet and inches", r"feet|foot|ft", r"inch(?:es)?", 12),
    ("pounds and ounces", r"pounds?|lbs?", r"ounces?|oz", 16),
)
READINGS = ("spaced digits", "scale word", "number words", "below zero", *(m[0] for m in MIXED_UNITS), "percent")

_SPACED = re.compile(r"(?<![\d.,])\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?!\d|[.,]\d|\s*/|-)")
_SCALES = {"k": 1000, "thousand": 1000, "million": 10**6, "billion": 10**9}
_SCALED = re.compile(rf"(?<![\w.])\$?({_N})(?:([kK])\b|\s+(thousand|million|billion)\b)", re.I)
_BELOW_ZERO = re.compile(rf"(?<![\w.\-\u2212])({_N})\s*(?:°\s*[CF]?|degrees?(?:\s+(?:Celsius|Fahrenheit))?)?"
                         rf"\s+below\s+(?:zero|0)\b", re.I)
_MIXED = [(name, re.compile(rf"(?<![\w.])\$?({_N})\s*(?:{big})\s*(?:,\s*|\s+and\s+|\s+)?({_N})\s*(?:{small})\b",
                            re.I), factor) for name, big, small, factor in MIXED_UNITS]
_PERCENT = re.compile(rf"({_N})\s*(?:%|percent\b|per\s+cent\b)", re.I)

_UNIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
               "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TEN_WORDS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_WORD_VALUES = {**{w: i for i, w in enumerate(_UNIT_WORDS)}, **{w: 20 + 10 * i for i, w in enumerate(_TEN_WORDS)}}
_WORD = rf"(?:{'|'.join(sorted(_WORD_VALUES, key=len, reverse=True))}|hundred|thousand|million|billion)"
_WORDS = re.compile(rf"\b{_WORD}(?:(?:[\s-]+(?:and[\s-]+)?){_WORD})*\b", re.I)


def _plain(value: Decimal) -> str:
    """A Decimal as digits, without exponent or trailing zeros."""
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _number(text: str) -> Decimal:
    return Decimal(text.replace(",", ""))


def _words_value(text: str) -> Decimal:
    """"one hundred and five" -> 105, "two thousand three hundred" -> 2300."""
    total = current = 0
    for word in re.split(r"[\s-]+", text.lower()):
        if word in _WORD_VALUES:
            current += _WORD_VALUES[word]
        elif word == "hundred":
            current = (current or 1) * 100
        elif word in _SCALES:
            total += (current or 1) * _SCALES[word]
            current = 0
    return Decimal(total + current)


def rewrite(text: str, words: bool = True) -> tuple[str, dict[str, str]]:
    """`text` with every number of these forms as plain digits, and {value: reading} of the
    values they made. Number words are read only where the text holds no digits (`words`; in
    running text "one" is rarely the answer)."""
    readings: dict[str, str] = {}

    def substitute(pattern: re.Pattern, reading: str, value_of, unit: str = ""):
        nonlocal text

        def replace(match: re.Match) -> str:
            value = _plain(value_of(match))
            readings.setdefault(value, reading)
            return f"{value} {unit}" if unit else value

        text = pattern.sub(replace, text)

    if words and not re.search(r"\d", text):
        substitute(_WORDS, "number words", lambda m: _words_value(m.group(0)))
    substitute(_SPACED, "spaced digits", lambda m: _number(re.sub(r"\s", "", m.group(0))))
    substitute(_SCALED, "scale word",
               lambda m: _number(m.group(1)) * _SCALES[(m.group(2) or m.group(3)).lower()])
    substitute(_BELOW_ZERO, "below zero", lambda m: -_number(m.group(1)), unit="degrees")
    for name, pattern, factor in _MIXED:
        substitute(pattern, name, lambda m, f=factor: _number(m.group(1)) * f + _number(m.group(2)),
                   unit=name.rsplit(" ", 1)[-1])
    return text, readings


def percent_values(text: str, normalise) -> set[str]:
    """The normalised values `text` writes as a percent ("75%", "75 percent")."""
    return {normalise(m.group(1)) for m in _PERCENT.finditer(text)}


def candidates(value: Decimal, reading: str | None) -> list[Decimal]:
    """The values a grader accepts for an answer read this way: a percent as itself or as a
    fraction (75% is 0.75); a mixed quantity in either of its own units (2 hours and 40
    minutes is 160 minutes or 8/3 hours); anything else as itself."""
    if reading == "percent":
        return [value, value / 100]
    factor = next((f for name, _, _, f in MIXED_UNITS if name == reading), None)
    return [value, value / factor] if factor else [value]
