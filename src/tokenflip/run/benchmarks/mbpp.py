"""MBPP (sanitized or full): write a Python function from a description and three asserts,
prompted 3-shot in the standard [BEGIN]/[DONE] format and scored by running the asserts."""

from __future__ import annotations

from tokenflip.core.excerpt import excerpt
from tokenflip.run.benchmarks.base import SOURCE_SCHEMA, BenchmarkError, Item
from tokenflip.run.benchmarks.coding import CodeBenchmark, find_code, names_from_solution, parses, undecided_tests
from tokenflip.run.benchmarks.sources import Source, check_local, load_records
from tokenflip.run.sandbox import TestProgram

__all__ = ["MBPPBenchmark", "SPLITS", "DEFAULT_HUB_ID", "TEST_TASK_IDS", "SHOT_TASK_IDS", "task_prompt",
           "extract_mbpp_code"]

DEFAULT_HUB_ID = "google-research-datasets/mbpp"
SPLITS = ("sanitized", "full")
TEST_TASK_IDS = range(11, 511)
SHOT_TASK_IDS = (2, 3, 4)


def task_prompt(text: str, tests: list[str]) -> str:
    """The standard MBPP task statement."""
    return (f"You are an expert Python programmer, and here is your task: {text} "
            f"Your code should pass these tests:\n\n" + "\n".join(tests))


def find_mbpp_code(completion: str | None) -> tuple[str | None, str]:
    """The code between [BEGIN] and [DONE] (either may be missing), unfenced if fenced, and
    where it was found (see `coding.find_code`)."""
    if completion is None:
        return None, "none"
    text = completion
    if "[BEGIN]" in text:
        text = text.split("[BEGIN]", 1)[1]
    return find_code(text.split("[DONE]", 1)[0])


def extract_mbpp_code(completion: str | None) -> str | None:
    """The code between [BEGIN] and [DONE], see `find_mbpp_code`."""
    return find_mbpp_code(completion)[0]


class MBPPBenchmark(CodeBenchmark):
    """MBPP test tasks (task_id 11-510) in task_id order."""

    kind = "mbpp"
    # lm-evaluation-harness's mbpp task (until: "[DONE]"), the exemplars' own end marker.
    stops = {"chat": ("[DONE]",), "bare": ("[DONE]",)}
    stop_source = "lm-evaluation-harness mbpp (until: [DONE])"
    scorer = ("execution: test imports + extracted code in a sandboxed candidate process; test imports, setup "
              "code and every assert of test_list in a trusted test process that calls the names the asserts "
              "need from the solution with plain data only")
    spec_schema = {"source": SOURCE_SCHEMA, "split": {"enum": list(SPLITS), "default": "sanitized"},
                   "shots": {"type": "integer", "minimum": 0, "maximum": len(SHOT_TASK_IDS)},
                   "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 600},
                   "unsafe_execution": {"type": "boolean", "default": False}}

    @classmethod
    def default_source(cls, options: dict) -> Source:
        split = options.get("split", "sanitized")
        return Source(hub=DEFAULT_HUB_ID, config=split if isinstance(split, str) else None, split="test")

    def __init__(self, name: str = "mbpp", n: int | None = None, *, split: str = "sanitized",
                 source: Source | None = None, shots: int = 3, timeout_s: float = 20.0,
                 unsafe_execution: bool = False) -> None:
        super().__init__(name, n, timeout_s=timeout_s, unsafe_execution=unsafe_execution)
        if split not in SPLITS:
            raise BenchmarkError(f"{self._label()}: split must be one of {list(SPLITS)}, got {split!r}")
        if isinstance(shots, bool) or not isinstance(shots, int) or not 0 <= shots <= len(SHOT_TASK_IDS):
            raise BenchmarkError(f"{self._label()}: shots must be an integer from 0 to {len(SHOT_TASK_IDS)}")
        self.split, self.shots = split, shots
        self.source = source or Source(hub=DEFAULT_HUB_ID, config=split, split="test")
        check_local(self._label(), self.source)
        self._items: list[Item] | None = None
        self._tasks: dict[str, dict] = {}
        self._shots: list[dict] | None = None

    @property
    def prompt_format(self) -> str:
        return (f"chat, {self.shots}-shot multi-turn (task_ids {list(SHOT_TASK_IDS[:self.shots])}): "
                "'You are an expert Python programmer...' with the asserts; answers as [BEGIN]/[DONE]")

    def _label(self) -> str:
        return f"benchmark {self.name!r} (mbpp)"

    def _task(self, index: int, record: dict, label: str) -> dict:
        try:
            text = record["prompt"] if self.split == "sanitized" else record["text"]
            task = {"task_id": int(record["task_id"]), "text": text, "code": record["code"],
                    "test_list": list(record["test_list"])}
        except (KeyError, TypeError, ValueError) as e:
            raise BenchmarkError(f"{self._label()}: record {index} of {label} is not an MBPP {self.split} "
                                 f"record ({type(e).__name__}: {e})") from e
        tests = task["test_list"]
        if not isinstance(record["test_list"], list) or not tests or not all(
                isinstance(t, str) and t.strip() for t in tests):
            # An empty list would pass any program; a string would be split into characters.
            raise BenchmarkError(f"{self._label()}: record {index} (task_id {task['task_id']}) of {label}: "
                                 f"test_list must be a non-empty list of assert statements, got "
                                 f"{excerpt(record['test_list'])}")
        for number, test in enumerate(tests):
            why = undecided_tests(test)
            if why:
                raise BenchmarkError(f"{self._label()}: record {index} (task_id {task['task_id']}) of {label}: "
                                     f"test_list[{number}] {excerpt(test)} {why}")
        imports = record.get("test_imports") or []
        task["imports"] = "\n".join(imports) if isinstance(imports, list) else str(imports)
        task["setup"] = record.get("test_setup_code") or ""
        for key in ("imports", "setup"):
            if not isinstance(task[key], str) or not parses(task[key]):
                raise BenchmarkError(f"{self._label()}: record {index} (task_id {task['task_id']}) of {label}: its "
                                     f"test {key} {excerpt(task[key])} do not parse (every sample would fail)")
        return task

    def items(self) -> list[Item]:
        """The first n test tasks of the drawn order of the test tasks by task_id (all 257
        sanitized / 500 full if n is None)."""
        if self._items is None:
            records = load_records(self._label(), self.source)
            tasks = [self._task(i, r, self.source.label()) for i, r in enumerate(records)]
            tasks = sorted((t for t in tasks if t["task_id"] in TEST_TASK_IDS), key=lambda t: t["task_id"])
            tasks = [task for _, task in self.drawn(tasks)]
            items = []
            for task in tasks:
                item_id = f"mbpp-{task['task_id']:03d}"
                self._tasks[item_id] = task
                items.append(Item(id=item_id, question=task_prompt(task["text"], task["test_list"]),
                                  gold=task["code"], solution=task["code"]))
            self._items = self.checked(items, f"{self._label()} from {self.source.label()}")
        return list(self._items)

    def _shot_source(self) -> Source:
        if self.source.hub is not None:
            return Source(hub=self.source.hub, config=self.source.config, split="prompt",
                          revision=self.source.revision)
        return self.source

    def shot_tasks(self) -> list[dict]:
        """The few-shot tasks, in SHOT_TASK_IDS order."""
        if self._shots is None:
            if self.shots == 0:
                self._shots = []
            else:
                source = self._shot_source()
                records = load_records(f"{self._label()} shots", source)
                by_id = {t["task_id"]: t for t in (self._task(i, r, source.label()) for i, r in enumerate(records))}
                wanted = SHOT_TASK_IDS[: self.shots]
                missing = [i for i in wanted if i not in by_id]
                if missing:
                    raise BenchmarkError(f"{self._label()}: shot task_ids {missing} not in {source.label()}")
                self._shots = [by_id[i] for i in wanted]
        return self._shots

    def task(self, item: Item) -> dict:
        """The item's task: task_id, text, code, test_list and setup code."""
        self.items()
        return self._tasks[item.id]

    def messages(self, item: Item) -> list[dict]:
        """One user/assistant turn per shot ([BEGIN] code [DONE]), then the task."""
        messages = []
        for shot in self.shot_tasks():
            messages += [
                {"role": "user", "content": task_prompt(shot["text"], shot["test_list"])},
                {"role": "assistant", "content": f"[BEGIN]\n{shot['code'].strip()}\n[DONE]"},
            ]
        messages.append({"role": "user", "content": item.question})
        return messages

    def bare_text(self, item: Item) -> str:
        """The standard MBPP text prompt: each shot as its task and "[BEGIN] code [DONE]",
        then the task and "[BEGIN]", where the model writes the code."""
        parts = []
        for message in self.chat_messages(item):
            parts.append(message["content"].strip() + ("\n\n" if message["role"] == "assistant" else "\n"))
        return "".join(parts) + "[BEGIN]\n"

    def find_answer(self, text: str, finished: bool = True) -> tuple[str | None, str]:
        """The code between [BEGIN] and [DONE], see `find_mbpp_code`."""
        return find_mbpp_code(text)

    def sample(self, item: Item, completion: str) -> tuple[str, TestProgram] | None:
        """Solution: test imports and the extracted code. Tests: test imports, setup code and
        every assert of test_list; names they use but do not define are the solution's (standard
        modules among them are imported on the trusted side instead)."""
        code = self.find_answer(completion)[0]
        if code is None:
            return None
        task = self.task(item)
        tests = f"{task['setup']}\n" + "\n".join(task["test_list"]) + "\n"
        modules, proxies = names_from_solution(tests, task["imports"], task["code"])
        prelude = task["imports"] + "".join(f"\nimport {m}" for m in modules) + "\n"
        return f"{task['imports']}\n{code}\n", TestProgram(prelude=prelude, tests=tests, proxies=tuple(proxies))

    def describe(self) -> dict:
        """Prompt format, n, scorer, split, shots, sandbox and source."""
        shots = [t["task_id"] for t in self.shot_tasks()]
        return self._describe({"split": self.split, "shots": self.shots, "shot_task_ids": shots,
                               "test_task_ids": f"{TEST_TASK_IDS.start}-{TEST_TASK_IDS.stop - 1}",
                               "source": self.source.describe(),
                               "shot_source": self._shot_source().describe() if shots else None})
