"""Literal values every consumer can take. A config's values and a data file's records
reach tokenizers, file names, C strings and Parquet files, none of which takes a lone
surrogate (which YAML and JSON both read from "\\ud800") or a NUL character; and a number
reaches arithmetic, where YAML's `.nan` and `.inf` pass every schema bound (NaN compares
false with all of them) and poison every result."""

from __future__ import annotations

import math
from typing import Any, Iterator

from tokenflip.core.excerpt import excerpt

__all__ = ["unencodable", "literal_problems"]


def unencodable(text: str) -> str | None:
    """Why `text` cannot be written as UTF-8 (a lone surrogate such as "\\ud800") or passed
    as a file name or C string (a NUL character), or None."""
    if "\0" in text:
        return (f"{excerpt(text)} holds a NUL character at position {text.index(chr(0))}, which no file name or "
                f"C string can hold")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"{excerpt(text)} holds {text[exc.start]!r} at position {exc.start}, which UTF-8 cannot encode "
                f"(a lone surrogate); no tokenizer or file can take it")
    return None


def literal_problems(value: Any, where: str = "") -> Iterator[str]:
    """`key.path: why` for every key or string value, at any depth, that cannot be encoded
    (`unencodable`), and every number that is not finite."""
    if isinstance(value, float) and not math.isfinite(value):
        yield f"{where or '(top level)'}: {value!r} is not a finite number"
    elif isinstance(value, str):
        why = unencodable(value)
        if why:
            yield f"{where or '(top level)'}: {why}"
    elif isinstance(value, dict):
        for key, sub in value.items():
            path = f"{where}.{key}" if where else str(key)
            if isinstance(key, str) and unencodable(key):
                yield f"{where or '(top level)'}: key {unencodable(key)}"
            yield from literal_problems(sub, path)
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            yield from literal_problems(sub, f"{where}.{index}" if where else str(index))
