"""Competition-math answers: which answer a solution gives, and whether it equals the gold
answer, decided by math-verify (the parser and verifier of Hugging Face's evaluations; its
differences from a careful human judge on rewrites of MATH-500's real answers are stated in
tests/run/test_benchmarks_math.py).

math-verify reads the whole scored text itself: a \\boxed{...} answer first, then a
"final answer is $...$" statement, then the last LaTeX or plain expression. `find_math_answer`
says which of these the text holds, for the `answer_rule` column."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

__all__ = ["MathAnswer", "last_boxed", "find_math_answer", "math_equal", "RULES"]

# Which rule found the answer, in math-verify's order of preference.
RULES = ("boxed", "final answer", "last expression", "none")
# math-verify's own time limits (a signal alarm): an exponent tower in a model's answer
# must not hold a cell for long.
_SECONDS = 3
_FINAL_ANSWER = re.compile(r"final answer is", re.I)


@dataclass(frozen=True)
class MathAnswer:
    """What math-verify parsed from a text (opaque, for `math_equal`), its string form and
    the rule that found it."""

    parsed: list
    text: str | None
    rule: str


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """Content of the balanced {...} group opening at text[start], and the index after it."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif text[i] == "}" and text[i - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[start + 1:i], i + 1
    return None


def last_boxed(text: str | None) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}, or `\\boxed 5`) with balanced braces."""
    if not text:
        return None
    starts = [m for m in re.finditer(r"\\(?:boxed|fbox)\b", text)]
    for match in reversed(starts):
        i = match.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            group = _braced(text, i)
            if group is not None:
                return group[0].strip()
            continue
        token = re.match(r"[^\s$]+", text[i:])
        if token and i > match.end():
            return token.group().rstrip(".")
    return None




def _limits() -> dict:
    # math-verify's time limits use SIGALRM, which only the main thread may set.
    seconds = _SECONDS if threading.current_thread() is threading.main_thread() else None
    return {"parsing_timeout": seconds}


def _parse(text: str) -> list:
    from math_verify import parse

    return parse(text, **_limits())


def find_math_answer(text: str | None) -> MathAnswer:
    """The answer a solution gives, as math-verify parses it, and which rule found it."""
    if not text or not text.strip():
        return MathAnswer([], None, "none")
    parsed = _parse(text)
    if not parsed:
        return MathAnswer([], None, "none")
    shown = parsed[-1] if isinstance(parsed[-1], str) else str(parsed[0])
    if last_boxed(text) is not None:
        rule = "boxed"
    elif _FINAL_ANSWER.search(text):
        rule = "final answer"
    else:
        rule = "last expression"
    return MathAnswer(parsed, shown, rule)


def gold_answer(gold: str) -> list:
    """A dataset's gold answer as math-verify parses it (as the content of a \\boxed{})."""
    return _parse("$\\boxed{" + gold + "}$")


def math_equal(answer: MathAnswer, gold: str | list) -> bool:
    """Whether a parsed answer equals the gold answer (a string, or `gold_answer`'s parse)."""
    if not answer.parsed:
        return False
    from math_verify import verify

    seconds = _limits()["parsing_timeout"]
    return bool(verify(gold_answer(gold) if isinstance(gold, str) else gold, answer.parsed, timeout_seconds=seconds))


def math_score(text: str, item, gold: dict) -> "Score":
    """math-verify's verdict on scored `text` against `item`'s gold answer (parsed once per
    item into `gold`): the one math scorer of MATH-500 and of a prompts file scored `math`."""
    from tokenflip.run.benchmarks.base import Score

    answer = find_math_answer(text)
    if answer.text is None:
        return Score(None, False, answer.rule, "no_answer")
    if item.id not in gold:
        gold[item.id] = gold_answer(item.gold)
    correct = math_equal(answer, gold[item.id])
    return Score(answer.text, correct, answer.rule, "correct" if correct else "wrong")
