"""What the code benchmarks share: pulling code out of a chat completion, and scoring it by
running the benchmark's tests against it in the two-process sandbox of `execution`."""

from __future__ import annotations

import ast
import builtins
import math
import re
import sys
import threading
import warnings
from abc import abstractmethod

from tokenflip.run.benchmarks.base import Benchmark, BenchmarkError, Item, Score
from tokenflip.run.sandbox import (
    ExecutionResult,
    Limits,
    TestProgram,
    available_layers,
    run_sample,
    sandbox_description,
)

__all__ = ["CodeBenchmark", "extract_code", "find_code", "parses", "undecided_tests", "names_from_solution",
           "VERDICT_OF_STATUS"]

# A sample's verdict from the sandbox's status: a syntax error is the model's failure; a
# sandbox error is nobody's verdict on the model, and is counted apart.
VERDICT_OF_STATUS = {"passed": "passed", "failed": "failed", "syntax error": "failed", "timeout": "timeout",
                     "no code": "no_code", "sandbox error": "sandbox_error"}

_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_PYTHON_TAGS = ("python", "python3", "py", "")
_WARNINGS_LOCK = threading.Lock()


def find_code(text: str | None) -> tuple[str | None, str]:
    """The code of a completion and where it was found: the first fenced block (preferring
    Python blocks and, among them, one that defines a function), or the whole text if it has
    no fence; (None, "none") if there is no code."""
    if text is None:
        return None, "none"
    blocks = _FENCE.findall(text)
    if blocks:
        python = [body for tag, body in blocks if tag.lower() in _PYTHON_TAGS] or [body for _, body in blocks]
        defining = [body for body in python if re.search(r"^\s*(?:async\s+)?def\s", body, re.M)]
        code, rule = (defining or python)[0], "code block"
    else:
        code, rule = text, "whole text"
    code = re.sub(r"\A(?:[ \t]*\n)+", "", code.rstrip())
    return (code, rule) if code.strip() else (None, "none")


def extract_code(text: str | None) -> str | None:
    """The code of a completion, see `find_code`."""
    return find_code(text)[0]


def parses(source: str) -> bool:
    """Whether `source` is syntactically valid Python (nothing is executed)."""
    with _WARNINGS_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
            return False
    return True


def undecided_tests(source: str) -> str | None:
    """Why a benchmark's test code cannot tell a right program from a wrong one (None if it
    can): it does not parse (every sample of the task would fail), or it holds no `assert`
    whose condition reads any name (`pass`, `assert True`: every program would pass)."""
    try:
        tree = _quiet_parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return f"does not parse ({type(exc).__name__}: {exc})"
    if not any(isinstance(node, ast.Assert) and any(isinstance(n, ast.Name) for n in ast.walk(node.test))
               for node in ast.walk(tree)):
        return "holds no assert that reads the solution (any program would pass)"
    return None


def _quiet_parse(source: str) -> ast.Module:
    """ast.parse without the SyntaxWarnings/DeprecationWarnings of dataset code's escapes."""
    with _WARNINGS_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source)


def top_level_names(source: str) -> set[str]:
    """Names a module's top level binds (functions, classes, assignments, imports)."""
    names = set()
    for node in _quiet_parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def names_from_solution(tests: str, context: str = "", reference: str = "") -> tuple[list[str], list[str]]:
    """The names `tests` (run after `context`) use without defining them: standard-library
    modules (imported on the trusted side, so the solution cannot patch them) and the rest,
    which the solution must define. A builtin or module name belongs to the solution only if
    the dataset's `reference` solution defines it (MBPP has a task whose function is `sum`)."""
    loaded, bound = [], set()
    for tree in (_quiet_parse(context), _quiet_parse(tests)):
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load):
                    loaded.append(node.id)
                else:
                    bound.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
    referenced = top_level_names(reference) if reference else set()
    free = [name for name in dict.fromkeys(loaded) if name not in bound]
    modules = [name for name in free if name in sys.stdlib_module_names and name not in referenced]
    solution = [name for name in free if name not in modules and (not hasattr(builtins, name) or name in referenced)]
    return modules, solution


class CodeBenchmark(Benchmark):
    """A benchmark whose completions are programs, scored by executing their tests."""

    def __init__(self, name: str, n: int | None, *, timeout_s: float = 20.0, unsafe_execution: bool = False) -> None:
        super().__init__(name, n)
        if not isinstance(unsafe_execution, bool):
            raise BenchmarkError(f"benchmark {name!r}: unsafe_execution must be true or false, got {unsafe_execution!r}")
        self.unsafe_execution = unsafe_execution
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 600:
            raise BenchmarkError(f"benchmark {name!r}: timeout_s must be a number in (0, 600], got {timeout_s!r}")
        # The wall clock decides a timeout; the CPU limit, one second later, is only the
        # backstop (one thread's CPU time never runs ahead of the wall clock), so a busy
        # loop is reported as a timeout, not as a process killed by SIGXCPU.
        self.limits = Limits(timeout_s=float(timeout_s), cpu_s=math.ceil(timeout_s) + 1)

    answer_rules = ("code block", "whole text", "none")

    def find_answer(self, text: str, finished: bool = True) -> tuple[str | None, str]:
        """The code in scored text, see `find_code`."""
        return find_code(text)

    @abstractmethod
    def sample(self, item: Item, text: str) -> tuple[str, TestProgram] | None:
        """The solution source for scored text (a completion cut at its stop) and the item's
        tests to run against it (in a separate, trusted process), or None if it has no code."""

    def check_isolation(self) -> None:
        """Refuse to execute model-written code where the sandbox is incomplete, unless the
        benchmark spec says `unsafe_execution: true`."""
        layers = available_layers()
        if layers.missing and not self.unsafe_execution:
            raise BenchmarkError(
                f"benchmark {self.name!r}: this machine cannot isolate executed code "
                f"(missing: {', '.join(layers.missing)}; {layers.problem or 'no seccomp'}); "
                "set unsafe_execution: true in the benchmark spec to score without these guarantees")

    def run(self, item: Item, completion: str) -> ExecutionResult:
        """Run the item's tests against the code of the completion (cut at its stop) in the sandbox."""
        self.check_isolation()
        sample = self.sample(item, self.scored_text(completion))
        if sample is None:
            return ExecutionResult(False, "no code", None, 0.0, "", "")
        solution, tests = sample
        if not parses(solution):
            return ExecutionResult(False, "syntax error", None, 0.0, "", "")
        return run_sample(solution, tests, self.limits)

    def score(self, item: Item, completion: str, finished: bool = True) -> Score:
        """The verdict of running the item's tests against the completion's code: passed,
        failed (a syntax error included), timeout, no_code, or sandbox_error, whose sample
        is left unscored (`correct` None) instead of counting as the model's failure."""
        code, rule = self.find_answer(self.scored_text(completion))
        verdict = VERDICT_OF_STATUS[self.run(item, completion).status]
        return Score(code, None if verdict == "sandbox_error" else verdict == "passed", rule, verdict)

    def _describe(self, extra: dict) -> dict:
        return self._description(**extra, unsafe_execution=self.unsafe_execution,
                                 sandbox=sandbox_description(self.limits))
