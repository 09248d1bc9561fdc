"""What the code benchmarks share: pulling code out of a chat completion, and scoring a program
by running it against its tests in the sandbox of `execution`."""

from __future__ import annotations

import ast
import re
import threading
import warnings
from abc import abstractmethod

from .base import Benchmark, BenchmarkError, Item
from .execution import ExecutionResult, Limits, run_program, sandbox_description

__all__ = ["CodeBenchmark", "extract_code", "parses"]

_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_PYTHON_TAGS = ("python", "python3", "py", "")
_WARNINGS_LOCK = threading.Lock()


def extract_code(text: str | None) -> str | None:
    """The code of a completion: the first fenced block (preferring Python blocks and, among
    them, one that defines a function), or the whole text if it has no fence."""
    if text is None:
        return None
    blocks = _FENCE.findall(text)
    if blocks:
        python = [body for tag, body in blocks if tag.lower() in _PYTHON_TAGS] or [body for _, body in blocks]
        defining = [body for body in python if re.search(r"^\s*(?:async\s+)?def\s", body, re.M)]
        code = (defining or python)[0]
    else:
        code = text
    code = re.sub(r"\A(?:[ \t]*\n)+", "", code.rstrip())
    return code if code.strip() else None


def parses(source: str) -> bool:
    """Whether `source` is syntactically valid Python (nothing is executed)."""
    with _WARNINGS_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
            return False
    return True


class CodeBenchmark(Benchmark):
    """A benchmark whose completions are programs, scored by executing their tests."""

    def __init__(self, name: str, n: int | None, *, timeout_s: float = 20.0) -> None:
        super().__init__(name, n)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 600:
            raise BenchmarkError(f"benchmark {name!r}: timeout_s must be a number in (0, 600], got {timeout_s!r}")
        self.limits = Limits(timeout_s=float(timeout_s), cpu_s=max(1, int(timeout_s)))

    def extract(self, completion: str) -> str | None:
        """The code in the completion, see `extract_code`."""
        return extract_code(completion)

    @abstractmethod
    def program(self, item: Item, completion: str) -> str | None:
        """The full program (code and tests) to run for a completion, or None if it has no code."""

    def run(self, item: Item, completion: str) -> ExecutionResult:
        """Execute the completion's program against the item's tests in the sandbox."""
        program = self.program(item, completion)
        if program is None:
            return ExecutionResult(False, "no code", None, 0.0, "", "")
        if not parses(program):
            return ExecutionResult(False, "syntax error", None, 0.0, "", "")
        return run_program(program, self.limits)

    def is_correct(self, item: Item, completion: str) -> bool:
        """Whether the program ran all of the item's tests without an error."""
        return self.run(item, completion).passed

    def _describe(self, extra: dict) -> dict:
        return self._description(**extra, sandbox=sandbox_description(self.limits))
