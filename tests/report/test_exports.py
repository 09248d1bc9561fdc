"""The report's CSV files and page hold model-written text that acts on nobody: a field a
spreadsheet would run as a formula is written as text, numbers stay numbers, and
bidirectional and control characters show as ⟨U+XXXX⟩. The CSV is opened as a spreadsheet
opens it: each field into a cell of an openpyxl worksheet (a number where it reads as one,
else text, which openpyxl like a spreadsheet takes as a formula when it starts with '='),
saved as .xlsx and read back."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest

from tokenflip.report.exports import FORMULA_STARTS, csv_field, visible_controls
from tokenflip.report.page import _TEMPLATES, write_tables

openpyxl = pytest.importorskip("openpyxl")

HYPERLINK = '=HYPERLINK("http://example.invalid/","open me")'
HOSTILE = {
    "text_a": HYPERLINK + " then\u202egnp.exe\0 after a NUL",
    "text_b": "+cmd|' /C calc'!A0",
    "extracted_a": "@SUM(1+1)",
    "extracted_b": "-5",
    "verdict_a": "-2+3",
    "verdict_b": "\t=1+1",
    "token_a": "\r=1",
    "token_b": "\u2066plain\u2069",
}


def _frame() -> pd.DataFrame:
    return pd.DataFrame([{"pair_id": "m/b/precision/bf16_vs_fp16/x", "prompt_id": "p-1", "step": 3,
                          "margin_a": -0.5, "correct_a": True, "n_tokens_a": 12, **HOSTILE}])


def _spreadsheet(path: Path):
    """The CSV as a spreadsheet imports it: a field that reads as a number becomes one, any
    other non-empty field text (a formula where it starts with '=')."""
    sheet = openpyxl.Workbook().active
    with open(path, newline="", encoding="utf-8") as fh:
        for r, row in enumerate(csv.reader(fh), start=1):
            for c, field in enumerate(row, start=1):
                try:
                    value: object = float(field)
                except ValueError:
                    value = field or None
                sheet.cell(row=r, column=c, value=value)
    return sheet


def _formulas(sheet) -> list[str]:
    """Cells a spreadsheet would run: openpyxl's formulas ('='), and text that Excel also
    evaluates (a leading '+', '-', '@', tab or carriage return that is not a number)."""
    return [cell.coordinate for row in sheet.iter_rows() for cell in row
            if cell.data_type == "f" or (isinstance(cell.value, str) and cell.value.startswith(FORMULA_STARTS))]


def test_csv_fields_that_would_run_as_formulas_are_written_as_text(tmp_path):
    raw = tmp_path / "raw.csv"  # as pandas writes it (without the NUL, which no worksheet cell holds)
    _frame().replace("\0", "", regex=True).to_csv(raw, index=False)
    formulas = _formulas(_spreadsheet(raw))
    # Each hostile field is a formula; the unquoted carriage return even starts a row ("=1" in A3).
    assert len(formulas) == 6 and "A3" in formulas, formulas

    (path,) = write_tables({"diverged_rows": _frame()}, tmp_path / "tables")
    assert path.name == "diverged.csv"
    sheet = _spreadsheet(path)
    assert _formulas(sheet) == []
    header = [cell.value for cell in sheet[1]]
    row = dict(zip(header, [cell.value for cell in sheet[2]]))
    assert row["text_a"] == "'" + HYPERLINK + " then⟨U+202E⟩gnp.exe after a NUL"
    assert row["text_b"] == "'+cmd|' /C calc'!A0" and row["extracted_a"] == "'@SUM(1+1)"
    assert row["verdict_a"] == "'-2+3" and row["verdict_b"] == "'\t=1+1" and row["token_a"] == "'\r=1"
    assert row["token_b"] == "⟨U+2066⟩plain⟨U+2069⟩"
    # Numbers stay numbers: a number column's negative value, and a text field that is one.
    assert row["margin_a"] == -0.5 and row["extracted_b"] == -5 and row["n_tokens_a"] == 12
    assert [sheet.cell(row=2, column=header.index(k) + 1).data_type for k in ("margin_a", "extracted_b")] == ["n", "n"]
    assert row["prompt_id"] == "p-1" and row["correct_a"] == "True"
    # Saved as a workbook and opened again, every text reads as it was written (an .xlsx is
    # XML, whose readers read a carriage return as a newline).
    sheet.parent.save(tmp_path / "diverged.xlsx")
    again = openpyxl.load_workbook(tmp_path / "diverged.xlsx").active
    assert [[c.value for c in r] for r in again.iter_rows()] == [
        [c.value.replace("\r", "\n") if isinstance(c.value, str) else c.value for c in r] for r in sheet.iter_rows()]
    assert all(c.data_type != "f" for r in again.iter_rows() for c in r)


@pytest.mark.parametrize("text,field", [("=1+1", "'=1+1"), ("-0.5", "-0.5"), ("+3", "+3"), ("-1e-3", "-1e-3"),
                                        ("-5 apples", "'-5 apples"), ("@x", "'@x"), ("a=b", "a=b"),
                                        ("\u202e=1", "⟨U+202E⟩=1"), ("=\0", "'="), ("", ""),
                                        ("-", "'-"), ("x\x07y", "x⟨U+0007⟩y"), ("line\nnext", "line\nnext")])
def test_csv_field(text, field):
    assert csv_field(text) == field


def test_the_page_shows_bidi_and_control_characters_as_their_code_points():
    html = _TEMPLATES.from_string("<p>{{ text }}</p><code>{{ token|visible }}</code>").render(
        text="abc\u202edef\u200f<b>\0", token="\u2067x y")
    assert html == "<p>abc⟨U+202E⟩def⟨U+200F⟩&lt;b&gt;⟨U+0000⟩</p><code>⟨U+2067⟩x␣y</code>"
    assert visible_controls(3) == 3 and visible_controls("tab\tand\nnewline") == "tab\tand\nnewline"


def test_the_page_prints_a_count_held_as_a_float_as_an_integer_and_nan_as_a_dash():
    # A summary column with gaps (an endpoint's count, null for a local cell) reads back as float.
    html = _TEMPLATES.from_string("{{ n }} / {{ most }} / {{ mean }} / {{ gone }} / {{ text }}").render(
        n=32.0, most=0.0, mean=1.83, gone=float("nan"), text="nan")
    assert html == "32 / 0 / 1.83 / – / nan"
