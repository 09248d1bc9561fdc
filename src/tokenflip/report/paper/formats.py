"""How the papers rows print their figures (a dash where there is none) and their selections
(`ANY`: every value of an axis counts)."""

from __future__ import annotations

import math
from typing import Any, Callable

ANY = object()  # a select value that lifts an axis's default: every value counts


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _pct(x: float) -> str:
    return "–" if _missing(x) else f"{100 * x:.0f}%"


def _num(x: float) -> str:
    return "–" if _missing(x) else f"{x:.3g}"


def _pp(x: float) -> str:
    return "–" if _missing(x) else f"{100 * x:+.0f} pp"


def _power(x: float) -> str:
    if _missing(x):
        return "–"
    return "FP32 KL is 0" if math.isinf(x) else f"10^{math.log10(x):.1f}"


def _both(fmt: Callable[[Any], str], sep: str = " vs ") -> Callable[[tuple], str]:
    return lambda pair: sep.join(fmt(x) for x in pair)


def _words(value: Any) -> str:
    if value is ANY:
        return "any"
    if isinstance(value, (tuple, list, set, frozenset)):
        return " / ".join(sorted(map(str, value)))
    return str(value)
