"""Model-written text made safe to open, in the page and in the CSV files beside it.

The report shows and exports what models wrote, verbatim. Two things in such text act on
the reader instead of being read:
- a CSV field that starts with `=`, `+`, `-`, `@`, a tab or a carriage return is a formula
  when the file is opened in a spreadsheet ("CSV injection": `=HYPERLINK(...)` is a link,
  `=cmd|...` asks to run a program). Such a text field gets a leading `'` (OWASP's
  recommendation), which spreadsheets show as text. Number columns are left as they are
  (-0.5 is a number, not a formula), and so is a text field that is exactly a decimal
  number (an extracted answer "-5"), which every spreadsheet reads as that number.
- bidirectional controls (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C) reorder
  the text around them so that what is shown is not what is there ("Trojan Source"), and
  other control characters show as nothing. In the page and in the CSV each is written as
  a visible ⟨U+202E⟩; NUL, which no CSV reader takes, is removed from the CSV.
`csv_frame` is what every CSV writer of the report writes; `visible_controls` is applied to
every value the page's templates print (`page._TEMPLATES`' finalize), after `printed`.
"""

from __future__ import annotations

import math
import numbers
import re
from pathlib import Path
from typing import Any

import pandas as pd

from tokenflip.core import storage

__all__ = ["FORMULA_STARTS", "HIDDEN_CONTROLS", "visible_controls", "csv_field", "csv_frame", "write_csv"]

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
# C0 controls but tab, newline and carriage return, and DEL: shown as nothing in a page, and
# refused by spreadsheet files (XML 1.0 cannot hold them).
_C0 = "".join(chr(c) for c in range(0x20) if chr(c) not in "\t\n\r") + "\x7f"
HIDDEN_CONTROLS = BIDI_CONTROLS + _C0
_HIDDEN = re.compile(f"[{re.escape(HIDDEN_CONTROLS)}]")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _mark(match: re.Match) -> str:
    return f"⟨U+{ord(match.group()):04X}⟩"


def printed(value: Any) -> Any:
    """A value as the page prints it: a float that holds a count (a column with gaps is float
    in pandas) as an integer, and NaN as "–", never "nan"."""
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if value.is_integer():
            return int(value)
    return value


def visible_controls(value: Any) -> Any:
    """`value` with each bidirectional or control character written as ⟨U+XXXX⟩ (a str
    stays a str, markup stays markup); anything else unchanged."""
    if isinstance(value, str) and _HIDDEN.search(value):
        return type(value)(_HIDDEN.sub(_mark, str(value)))
    return value


def csv_field(text: str) -> str:
    """A text field as the CSV holds it: NUL removed, other controls made visible, and a
    leading `'` where it would start a formula (not where it is exactly a decimal number)."""
    text = visible_controls(text.replace("\0", ""))
    if text.startswith(FORMULA_STARTS) and not _PLAIN_NUMBER.fullmatch(text):
        return "'" + text
    return text


def _field(value: Any) -> Any:
    if isinstance(value, str):
        return csv_field(value)
    if value is None or isinstance(value, (numbers.Number, bool)):  # numbers (and NaN) stay numbers
        return value
    try:
        if pd.isna(value):
            return value
    except (TypeError, ValueError):  # a list or an array: written as its text
        pass
    return csv_field(str(value))


def csv_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` as its CSV file holds it: every text (non-numeric) column's fields and every
    column name through `csv_field`; numeric and boolean columns as they are."""
    out = frame.copy()
    for column in out.columns:
        if not (pd.api.types.is_numeric_dtype(out[column]) or pd.api.types.is_datetime64_any_dtype(out[column])):
            out[column] = out[column].astype(object).map(_field)
    out.columns = [csv_field(c) if isinstance(c, str) else c for c in out.columns]
    return out


def write_csv(rows: pd.DataFrame | list[dict[str, Any]], path: str | Path) -> Path:
    """Write a table of the report as CSV (atomically), its text made safe by `csv_frame`.
    Lines end in CRLF (RFC 4180), so that a field holding a lone carriage return is quoted
    like one holding a newline: unquoted, a reader would start a new row there, and the text
    after it would be a field of its own, unprotected."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    with storage.atomic_path(path) as tmp:
        csv_frame(frame).to_csv(tmp, index=False, lineterminator="\r\n")
    return Path(path)
