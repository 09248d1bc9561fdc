"""The wire between the trusted test process and the candidate process: length-prefixed JSON
messages whose values are plain data in a strict tagged form. Nothing but these types can
cross, so no object the candidate builds (say, one whose `__eq__` is always true) can reach a
test's comparison. Standard library only: both sandboxed processes import it.

Values: None, bool, str and finite or non-finite floats are JSON natives; everything else is a
one-key object: {"i": int}, {"f": float}, {"c": [re, im]}, {"b": hex}, {"l": [...]},
{"t": [...]}, {"s": [...]}, {"z": [...]} (frozenset), {"d": [[k, v], ...]}, {"q": [n, d]}
(fractions.Fraction), {"e": str} (decimal.Decimal), {"h": handle}.

Numbers of other types (any `numbers.Number`) cross as the number they are, not as a handle:
a Fraction or Decimal result that equals the expected value passes, as in the official
HumanEval harness, where the test compares the solution's own object."""

import decimal
import fractions
import json
import math
import numbers
import os
import re
import struct

MAX_MESSAGE_BYTES = 64 * 1024**2
MAX_DEPTH = 200
_HEADER = struct.Struct(">Q")


class WireError(Exception):
    """A message that is not well-formed, too big, or a closed channel."""


def send(fd: int, message: dict) -> None:
    data = json.dumps(message, allow_nan=True, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise WireError("channel closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd: int) -> dict:
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size))
    if size > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {size} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        message = json.loads(_read_exactly(fd, size))
    except (ValueError, RecursionError) as e:
        raise WireError(f"malformed message: {type(e).__name__}") from None
    if type(message) is not dict:
        raise WireError("a message must be an object")
    return message


_BASES = (bool, int, float, complex, str, bytes, list, tuple, set, frozenset, dict)


def _plain_kind(value):
    """The plain type whose data `value` holds: its own type, or for an instance of a subclass
    (a Counter, a namedtuple) the builtin it derives from, whose data is what gets sent."""
    kind = type(value)
    if kind in _BASES or value is None:
        return kind
    return next((base for base in _BASES if isinstance(value, base)), kind)


def _as_plain(value, kind):
    if type(value) is kind:
        return value
    if kind in (list, tuple, set, frozenset):
        return kind(kind.__iter__(value))
    if kind is dict:
        return dict(dict.items(value))
    return {int: int.__int__, float: float.__float__, complex: complex.__complex__, str: str.__str__,
            bytes: bytes.__bytes__, bool: bool.__bool__}[kind](value)


def encode(value, handle_of, depth: int = 0):
    """`value` in wire form: plain data (an instance of a subclass of a plain type, say a
    Counter, is sent as the data of that type); anything else becomes a handle through
    `handle_of`, or raises TypeError if `handle_of` is None. The receiver's `decode` builds
    only exact plain types, so no method of the sender's objects ever runs on its side."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply to send")
    kind = _plain_kind(value)
    if kind is not type(value):
        value = _as_plain(value, kind)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return {"i": value}
    if kind is float:
        return value if math.isfinite(value) else {"f": repr(value)}
    if kind is complex:
        return {"c": [encode(value.real, None), encode(value.imag, None)]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind in (list, tuple, set, frozenset):
        tag = {list: "l", tuple: "t", set: "s", frozenset: "z"}[kind]
        return {tag: [encode(v, handle_of, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[encode(k, handle_of, depth + 1), encode(v, handle_of, depth + 1)] for k, v in value.items()]}
    if isinstance(value, numbers.Number):
        return _number(value)
    if handle_of is None:
        raise TypeError(f"a {kind.__name__} cannot be sent; only plain data can")
    return {"h": handle_of(value)}


def _number(value):
    """A number of a type without its own tag, as exact data of the nearest one: a Decimal by
    its digits, a rational as numerator and denominator, a real as a float, else a complex."""
    if isinstance(value, decimal.Decimal):
        return {"e": decimal.Decimal.__str__(value)}
    if isinstance(value, numbers.Rational):
        return {"q": [encode(int(value.numerator), None), encode(int(value.denominator), None)]}
    if isinstance(value, numbers.Real):
        return encode(float(value), None)
    return encode(complex(value), None)


_DECIMAL = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:Infinity|Inf|s?NaN\d*)")


def _float(value):
    if type(value) is float:
        return value
    if type(value) is int and not isinstance(value, bool):
        return float(value)
    raise WireError("malformed float")


def decode(value, handle, depth: int = 0):
    """The inverse of `encode`, rejecting anything else; `handle(n)` maps a handle number to
    its object (or raises WireError where handles are not accepted)."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is float:
        return value
    if kind is not dict or len(value) != 1:
        raise WireError(f"malformed value of type {kind.__name__}")
    ((tag, body),) = value.items()
    if tag == "i" and type(body) is int:
        return body
    if tag == "f" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "c" and type(body) is list and len(body) == 2:
        return complex(_float(decode(body[0], handle, depth + 1)), _float(decode(body[1], handle, depth + 1)))
    if tag == "b" and type(body) is str:
        try:
            return bytes.fromhex(body)
        except ValueError:
            raise WireError("malformed bytes") from None
    if tag in ("l", "t", "s", "z") and type(body) is list:
        items = [decode(v, handle, depth + 1) for v in body]
        if tag == "l":
            return items
        if tag == "t":
            return tuple(items)
        try:
            return set(items) if tag == "s" else frozenset(items)
        except TypeError:
            raise WireError("unhashable set element") from None
    if tag == "d" and type(body) is list:
        result = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise WireError("malformed dict entry")
            try:
                result[decode(pair[0], handle, depth + 1)] = decode(pair[1], handle, depth + 1)
            except TypeError:
                raise WireError("unhashable dict key") from None
        return result
    if tag == "q" and type(body) is list and len(body) == 2:
        numerator, denominator = (decode(v, handle, depth + 1) for v in body)
        if type(numerator) is not int or type(denominator) is not int or denominator == 0:
            raise WireError("malformed fraction")
        return fractions.Fraction(numerator, denominator)
    if tag == "e" and type(body) is str and _DECIMAL.fullmatch(body):
        return decimal.Decimal(body)
    if tag == "h" and type(body) is int:
        return handle(body)
    raise WireError(f"unknown or malformed tag {tag!r}")
