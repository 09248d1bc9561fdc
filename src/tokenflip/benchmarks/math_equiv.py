"""Competition-math answers: the last \\boxed{...} of a solution, LaTeX normalisation, and an
equivalence check (string, numeric, element-wise, then sympy) that says which rule decided."""

from __future__ import annotations

import re
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

__all__ = ["Verdict", "last_boxed", "normalize_math", "math_equal", "to_sympy", "RULES"]

RULES = ("exact", "normalized", "numeric", "elementwise", "sympy", "no-answer", "unparsed")

_MAX_SYMPY_CHARS = 200
_MAX_EXPONENT = 1000
_SYMPY_SECONDS = 2.0


@dataclass(frozen=True)
class Verdict:
    """Whether two answers are equal, and the rule that decided (one of RULES); "unparsed"
    means no rule could compare them."""

    equal: bool
    rule: str

    def __bool__(self) -> bool:
        return self.equal


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


def _replace_command(s: str, name: str, arity: int, build) -> str:
    """Replace \\name{a}{b}... (arity groups; a bare single character counts as a group)."""
    pattern = re.compile(r"\\" + name + r"(?![a-zA-Z])")
    out, pos = [], 0
    while (m := pattern.search(s, pos)) is not None:
        i, args = m.end(), []
        for _ in range(arity):
            while i < len(s) and s[i] == " ":
                i += 1
            if i < len(s) and s[i] == "{":
                group = _braced(s, i)
                if group is None:
                    break
                args.append(group[0])
                i = group[1]
            elif i < len(s) and s[i] not in "\\{}[":
                args.append(s[i])
                i += 1
            else:
                break
        if len(args) != arity:
            out.append(s[pos:m.end()])
            pos = m.end()
            continue
        out.append(s[pos:m.start()] + build(*args))
        pos = i
    out.append(s[pos:])
    return "".join(out)


_UNIT_WORDS = (
    "degrees?", "units?", "square units", "sq units", "cm", "centimeters?", "m", "meters?", "km", "kilometers?",
    "mm", "inch(?:es)?", "in", "feet", "foot", "ft", "yards?", "miles?", "mph", "hours?", "minutes?", "seconds?",
    "days?", "weeks?", "years?", "cents?", "dollars?", "pounds?", "ounces?", "grams?", "kg", "liters?",
    "gallons?", "people", "students?", "ways", "points?", "marbles", "inches", "sq\\.? ?(?:ft|in|m|cm|units)",
)
_UNIT = r"(?:" + "|".join(_UNIT_WORDS) + r")"
_TEXT_CMDS = ("text", "textbf", "textit", "mathrm", "mathbf", "mbox", "operatorname", "textnormal", "mathit")


def normalize_math(answer: str | None) -> str | None:
    """Canonical string form of a LaTeX answer: no spaces, \\left/\\right, \\dfrac/\\tfrac,
    units, degrees, dollar and percent signs, thousands commas, `x =` prefix or trailing `.`."""
    if answer is None:
        return None
    s = answer.strip()
    s = s.replace("\n", " ").replace("\\!", "").replace("\\displaystyle", "")
    s = re.sub(r"(?<!\\)\\[,;: ]", " ", s).replace("~", " ")
    s = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\degree", "", s)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = s.strip().rstrip(".").strip()
    units = r"\s*\\(?:" + "|".join(_TEXT_CMDS) + r")\{\s*" + _UNIT + r"\s*\}(?:\s*\^\s*\{?\d\}?)?$"
    if re.search(r"\S", re.sub(units, "", s)):
        s = re.sub(units, "", s)
    s = re.sub(r"(?<=[\d}])\s+" + _UNIT + r"(?:\^\d)?$", "", s)
    for cmd in _TEXT_CMDS:
        s = _replace_command(s, cmd, 1, lambda a: a)
    s = _replace_command(s, "frac", 2, lambda a, b: "\\frac{" + a + "}{" + b + "}")
    s = _replace_command(s, "sqrt", 1, lambda a: "\\sqrt{" + a + "}")
    s = re.sub(r"\s+", "", s)
    s = s.replace("{,}", ",")
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    m = re.fullmatch(r"(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?\w+\}?)?=([^=<>]+)", s)
    if m:
        s = m.group(1)
    s = re.sub(r"(?<![\d}])\.(\d)", r"0.\1", s)
    s = s.rstrip(".")
    if re.fullmatch(r"\(([A-Za-z])\)", s):
        s = s[1]
    return s


def _decimal(s: str) -> Decimal | None:
    if not re.fullmatch(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?", s):
        return None
    try:
        return Decimal(s)
    except InvalidOperation:
        return None


_FUNCTIONS = {
    "sqrt": "sqrt", "sin": "sin", "cos": "cos", "tan": "tan", "cot": "cot", "sec": "sec", "csc": "csc",
    "arcsin": "asin", "arccos": "acos", "arctan": "atan", "ln": "log", "log": "log", "exp": "exp",
}
_CONSTANTS = {"pi": "pi", "infty": "oo", "infinity": "oo"}


def _latex_to_python(s: str) -> str | None:
    s = _replace_command(s, "frac", 2, lambda a, b: f"(({a})/({b}))")
    s = re.sub(r"\\sqrt\[([^\]]+)\]\{", lambda m: "\\root{" + m.group(1) + "}{", s)
    s = _replace_command(s, "root", 2, lambda n, a: f"(({a})**(1/({n})))")
    s = _replace_command(s, "sqrt", 1, lambda a: f"sqrt({a})")
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/")
    s = re.sub(r"\\([a-zA-Z]+)", lambda m: " " + (_FUNCTIONS.get(m.group(1)) or _CONSTANTS.get(m.group(1))
                                               or "\0") + " ", s)
    if "\0" in s:
        return None
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    if not re.fullmatch(r"[0-9a-zA-Z+\-*/().\s]*", s) or not s.strip():
        return None
    known = set(_FUNCTIONS.values()) | set(_CONSTANTS.values())

    def word(m: re.Match) -> str:
        name = m.group()
        if name in known:
            return name
        return "*".join("I" if c == "i" else c for c in name)

    return re.sub(r"[A-Za-z]+", word, s)


def _sympy_names() -> dict:
    import sympy

    names = {name: getattr(sympy, name) for name in (
        "Symbol", "Integer", "Float", "Rational", "Add", "Mul", "Pow", "sqrt", "sin", "cos", "tan", "cot", "sec", "csc",
        "asin", "acos", "atan", "log", "exp", "pi", "oo", "I")}
    names["__builtins__"] = {}
    return names


def _safe_powers(expr) -> bool:
    import sympy

    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Integer) and abs(int(node)) > 10**30:
            return False
        if isinstance(node, sympy.Pow) and node.exp.is_number:
            try:
                if abs(complex(node.exp.evalf(15))) > _MAX_EXPONENT:
                    return False
            except (TypeError, ValueError):
                return False
    return True


def to_sympy(answer: str):
    """A sympy expression for a normalised answer, or None if it does not parse safely.
    Only digits, operators, single-letter symbols and a whitelist of functions are accepted."""
    if len(answer) > _MAX_SYMPY_CHARS:
        return None
    code = _latex_to_python(answer)
    if code is None:
        return None
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    transformations = standard_transformations + (implicit_multiplication_application, convert_xor)
    try:
        raw = parse_expr(code, global_dict=_sympy_names(), transformations=transformations, evaluate=False)
        if not _safe_powers(raw):
            return None
        return parse_expr(code, global_dict=_sympy_names(), transformations=transformations)
    except Exception:
        return None


@contextmanager
def _time_limit(seconds: float):
    usable = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise TimeoutError("sympy comparison took too long")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _sympy_equal(a: str, b: str) -> bool | None:
    x, y = to_sympy(a), to_sympy(b)
    if x is None or y is None:
        return None
    import sympy

    try:
        with _time_limit(_SYMPY_SECONDS):
            if sympy.simplify(x - y) == 0:
                return True
            if x.is_number and y.is_number:
                dx, dy = complex(sympy.N(x)), complex(sympy.N(y))
                return abs(dx - dy) <= 1e-6 * max(1.0, abs(dy))
            return False
    except Exception:
        return None


def _split_top(s: str) -> list[str]:
    parts, depth, current = [], 0, []
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
    parts.append("".join(current))
    return parts


def _sequence(s: str) -> tuple[str, list[str], str] | None:
    """(open, elements, close) of a tuple/interval/list like (a,b), [a,b), \\{a,b\\} or a,b."""
    m = re.fullmatch(r"(\(|\[|\\\{)(.*)(\)|\]|\\\})", s)
    if m and _balanced(m.group(2)):
        parts = _split_top(m.group(2))
        if len(parts) > 1:
            return m.group(1), parts, m.group(3)
    parts = _split_top(s)
    return ("", parts, "") if len(parts) > 1 else None


def _balanced(s: str) -> bool:
    depth = 0
    for c in s:
        depth += c in "([{"
        depth -= c in ")]}"
        if depth < 0:
            return False
    return depth == 0


def _scalar_equal(a: str, b: str) -> tuple[bool | None, str]:
    if a == b:
        return True, "normalized"
    if re.fullmatch(r"[A-Za-z]+", a) and re.fullmatch(r"[A-Za-z]+", b):
        return False, "normalized"
    da, db = _decimal(a), _decimal(b)
    if da is not None and db is not None:
        return abs(da - db) <= Decimal("1e-6") * max(Decimal(1), abs(db)), "numeric"
    verdict = _sympy_equal(a, b)
    return verdict, "sympy"


def math_equal(predicted: str | None, gold: str | None) -> Verdict:
    """Whether a predicted answer equals the gold one, and which rule decided: exact strings,
    normalised strings, decimal values, element-wise for tuples/intervals/lists, or sympy
    (difference simplifies to 0, or numeric values agree to 1e-6)."""
    if predicted is None or gold is None:
        return Verdict(False, "no-answer")
    if predicted.strip() == gold.strip():
        return Verdict(True, "exact")
    a, b = normalize_math(predicted), normalize_math(gold)
    if not a:
        return Verdict(False, "no-answer")
    equal, rule = _scalar_equal(a, b)
    if equal:
        return Verdict(True, rule)
    sa, sb = _sequence(a), _sequence(b)
    if sa and sb and len(sa[1]) == len(sb[1]):
        if sa[0] == sb[0] and sa[2] == sb[2]:
            unmatched = list(sb[1])
            ordered = sa[0] != ""
            for i, element in enumerate(sa[1]):
                candidates = [unmatched[0]] if ordered else unmatched
                hit = next((g for g in candidates if _scalar_equal(element, g)[0]), None)
                if hit is None:
                    break
                unmatched.remove(hit)
            else:
                return Verdict(True, "elementwise")
        return Verdict(False, "elementwise")
    return Verdict(False, rule if equal is not None else "unparsed")
