"""What a command reads from its command line, checked before it does any work.

A file named on the command line may be anything the shell can name: a directory, a device
(`/dev/zero` never ends), a pipe (a read waits forever), a gigabyte, a JSON document nested
deeper than the parser's recursion, a number where a table belongs. Each is refused here
with the option, the file and what is wrong, before it is opened for reading; what is read
is capped, parsed without recursion limits being reached, and holds finite numbers only.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from tokenflip.core.excerpt import redacted

__all__ = ["InputError", "shown", "yaml_problem", "kernel_file", "check_input_file", "check_input_dir", "check_output", "loads_json",
           "read_json_file", "check_yaml_file", "MAX_TEXT_FILE_BYTES", "MAX_DEPTH", "MAX_NODES",
           "MAX_INT_DIGITS"]

# A config or calibration file is a few kB; a megabyte is no file of either kind.
MAX_TEXT_FILE_BYTES = 2**20
# Configs and job specs nest a handful of levels; the parsers recurse per level.
MAX_DEPTH = 64
# Values of a YAML file with its aliases expanded: a config has hundreds.
MAX_NODES = 100_000
# Digits of an integer any file of tokenflip's may hold (a token id, a count, a 64-bit seed
# has at most 20): Python's parser takes 4,300, and arithmetic on them is slow.
MAX_INT_DIGITS = 40
# Characters of a value quoted in a message (a 10,000-character value would bury it).
SHOWN_CHARS = 80


class InputError(ValueError):
    """An input named on the command line that cannot be used (the message names it)."""


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """`value` quoted for a message, cut to `limit` characters with its length said."""
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text):,} characters)"


def _label(where: str, path: Any) -> str:
    """`--option path` for a message: the path as typed where it is short and printable."""
    text = str(path)
    named = text if len(text) <= 4 * SHOWN_CHARS and text.isprintable() else shown(text)
    return f"{where} {named}" if where else named


def _path(path: str | os.PathLike, where: str) -> Path:
    if not os.fspath(path).strip():
        raise InputError(f"{where + ': ' if where else ''}an empty path")
    return Path(path)


def _stat(path: Path, where: str) -> os.stat_result | None:
    """The file's status, None where it does not exist; an error for a name no file can have."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # a name too long, a loop of links, no permission
        raise InputError(f"{_label(where, path)}: {exc.strerror or exc}") from None
    except ValueError as exc:  # an embedded NUL
        raise InputError(f"{_label(where, path)}: {exc}") from None


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _existing(path: str | os.PathLike, where: str, is_kind, missing: str, noun: str) -> tuple[Path, os.stat_result]:
    """`path` and its stat if it exists and `is_kind(mode)`; else `InputError` saying which."""
    path = _path(path, where)
    st = _stat(path, where)
    if st is None:
        raise InputError(f"{_label(where, path)}: {missing}")
    if not is_kind(st.st_mode):
        raise InputError(f"{_label(where, path)}: {_kind(st.st_mode)}, not a {noun}")
    return path, st


# Trees of files that stat as regular but are the kernel's: /proc/self/environ holds the
# process's whole environment, keys included, and reads as a file of 0 bytes.
KERNEL_TREES = ("/proc", "/sys", "/dev")


def kernel_file(path: str | os.PathLike) -> str | None:
    """The kernel tree `path` reaches (through any symlink), or None: such a file is no data,
    and whatever it holds must not be read into a message."""
    real = os.path.realpath(path)
    return next((tree for tree in KERNEL_TREES if real == tree or real.startswith(tree + "/")), None)


def check_input_file(path: str | os.PathLike, where: str = "", max_bytes: int | None = None) -> Path:
    """`path` as a Path if it is a regular file (of at most `max_bytes`), not one of the
    kernel's (`kernel_file`); else `InputError`."""
    path, st = _existing(path, where, stat.S_ISREG, "file not found", "file")
    if tree := kernel_file(path):
        raise InputError(f"{_label(where, path)}: a file of the kernel's {tree} tree, not a data file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputError(f"{_label(where, path)}: {st.st_size:,} bytes, more than the {max_bytes:,} such a file "
                         f"can need")
    return path


def check_input_dir(path: str | os.PathLike, where: str = "") -> Path:
    """`path` as a Path if it is an existing directory; else `InputError`."""
    return _existing(path, where, stat.S_ISDIR, "no such directory", "directory")[0]


def check_output(path: str | os.PathLike, where: str = "", directory: bool = False) -> Path:
    """`path` as a Path if a command may create or replace it there: absent, or the kind it
    writes (a regular file, or with `directory` a directory), under parents that are
    directories. A device, a pipe or a directory is never replaced by a file."""
    path = _path(path, where)
    st = _stat(path, where)
    if st is not None:
        wanted = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
        if not wanted:
            raise InputError(f"{_label(where, path)}: {_kind(st.st_mode)}, not "
                             f"{'a directory' if directory else 'a file'} to write")
        return path
    for parent in path.absolute().parents:
        st = _stat(parent, where)
        if st is not None:
            if not stat.S_ISDIR(st.st_mode):
                raise InputError(f"{_label(where, path)}: {parent} is {_kind(st.st_mode)}, not a directory")
            break
    return path


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is beyond the largest number a float holds")
    return value


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits:,} digits, more than the {MAX_INT_DIGITS} any id or count has")
    return int(text)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON/YAML, without recursion (a stack of (value, depth))."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


def loads_json(text: str, where: str, finite: bool = True) -> Any:
    """JSON text parsed, or `InputError` naming `where`: not JSON, a number that is not
    finite (NaN, Infinity, 1e309), an integer of more than `MAX_INT_DIGITS` digits, or nested
    deeper than `MAX_DEPTH`. Every JSON a file, a server or a command line gives is read here.
    `finite=False`: NaN and infinities read as floats (tokenflip's own metadata records a
    missing figure as NaN; what reads it checks each value it uses)."""
    numbers = {"parse_float": _finite, "parse_constant": _no_constant} if finite else {}
    try:
        value = json.loads(text, parse_int=_bounded_int, **numbers)
    except RecursionError:
        raise InputError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError is one
        raise InputError(f"{where}: not valid JSON ({' '.join(str(exc).split())[:200]})") from None
    if _depth(value) > MAX_DEPTH:
        raise InputError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    return value


def _read_text(path: Path, where: str, max_bytes: int) -> str:
    with path.open("rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew since it was checked
        raise InputError(f"{_label(where, path)}: more than {max_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{_label(where, path)}: not UTF-8 text (byte {exc.start})") from None


def read_json_file(path: str | os.PathLike, where: str, max_bytes: int = MAX_TEXT_FILE_BYTES) -> Any:
    """A JSON file named by option `where`: a regular file of at most `max_bytes`, parsed
    by `loads_json`."""
    path = check_input_file(path, where, max_bytes)
    text = _read_text(path, where, max_bytes)
    if not text.strip():
        raise InputError(f"{_label(where, path)}: an empty file")
    return loads_json(text, _label(where, path))


def check_yaml_file(path: str | os.PathLike, where: str, max_bytes: int = MAX_TEXT_FILE_BYTES) -> Path:
    """A YAML file named by option `where`, before the config loader builds it: a regular
    file of at most `max_bytes`, nested at most `MAX_DEPTH` deep (PyYAML's composer recurses
    per level) and of at most `MAX_NODES` values once its aliases are expanded (ten nested
    aliases of ten make billions: each consumer that walks the config would walk them all).
    Its events are read one by one; nothing is built."""
    import yaml

    path = check_input_file(path, where, max_bytes)
    text = _read_text(path, where, max_bytes)
    label = _label(where, path)
    open_: list[list[Any]] = []  # [anchor, values inside] of each collection being read
    sizes: dict[str, int] = {}   # anchor -> values it expands to
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(open_) >= MAX_DEPTH:
                    raise InputError(f"{label}: nested deeper than {MAX_DEPTH} levels "
                                     f"(line {event.start_mark.line + 1})")
                open_.append([event.anchor, 1])
                continue
            if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                anchor, n = open_.pop()
            elif isinstance(event, yaml.ScalarEvent):
                anchor, n = event.anchor, 1
            elif isinstance(event, yaml.AliasEvent):
                anchor, n = None, sizes.get(event.anchor, 1)
            else:
                continue
            if anchor:
                sizes[anchor] = n
            if open_:
                open_[-1][1] += n
            if (open_[-1][1] if open_ else n) > MAX_NODES:
                raise InputError(f"{label}: more than {MAX_NODES:,} values once its aliases (*name) are expanded "
                                 f"(line {event.start_mark.line + 1})")
    except yaml.YAMLError as exc:
        raise InputError(f"{label}: not valid YAML: {yaml_problem(exc)}") from None
    return path


def yaml_problem(exc: Exception) -> str:
    """What PyYAML found wrong, and where (line, column), without the excerpt of the file it
    prints under it: that line may be a credential."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or type(exc).__name__
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{redacted(' '.join(str(problem).split()))[:200]}{at}"
