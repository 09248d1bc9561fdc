"""Final-answer extraction and numeric comparison shared by the math benchmarks."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["extract_answer", "normalize_answer", "answers_match"]

_NUMBER = re.compile(r"(?:(?<![\w.])-)?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_ANSWER_IS = re.compile(r"[Tt]he answer is")
_TOLERANCE = 1e-6


def normalize_answer(text: str | None) -> str | None:
    """Canonical form of a number: no commas, `$`, spaces or trailing `.`; "18.00" -> "18"."""
    if text is None:
        return None
    cleaned = re.sub(r"[\s,$]", "", text).rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _first_number(text: str) -> str | None:
    match = _NUMBER.search(text)
    return normalize_answer(match.group()) if match else None


def extract_answer(completion: str) -> str | None:
    """Final numeric answer of a completion, normalised, or None if it has no number.

    Prefers the number after the last "####", then after the last "The answer is",
    then the last number anywhere in the text.
    """
    if "####" in completion:
        found = _first_number(completion.rsplit("####", 1)[1])
        if found is not None:
            return found
    said = list(_ANSWER_IS.finditer(completion))
    if said:
        found = _first_number(completion[said[-1].end():])
        if found is not None:
            return found
    numbers = _NUMBER.findall(completion)
    return normalize_answer(numbers[-1]) if numbers else None


def answers_match(predicted: str | None, gold: str | None) -> bool:
    """Whether two normalised answers are numerically equal (tolerance 1e-6); None never matches."""
    a, b = normalize_answer(predicted), normalize_answer(gold)
    if a is None or b is None:
        return False
    return abs(float(a) - float(b)) <= _TOLERANCE
