"""GSM8K grade-school math, loaded from a local file or the Hugging Face hub, prompted 0-shot
in chat or few-shot with chain-of-thought exemplars drawn by seed from a separate pool."""

from __future__ import annotations

import random
import re
from pathlib import Path

from tokenflip.core.excerpt import excerpt
from tokenflip.run.benchmarks.answers import normalize_answer
from tokenflip.run.benchmarks.base import MATH_SYSTEM_PROMPT, SOURCE_SCHEMA, BenchmarkError, Item, MathBenchmark
from tokenflip.run.benchmarks.sources import Source, check_local, load_records, parse_source

__all__ = [
    "GSM8KBenchmark",
    "DEFAULT_HUB_ID",
    "DEFAULT_CONFIG",
    "DEFAULT_SPLIT",
    "DEFAULT_EXEMPLAR_SPLIT",
    "PROMPTS",
    "gold_from_answer",
    "exemplar_answer",
]

DEFAULT_HUB_ID = "openai/gsm8k"
DEFAULT_CONFIG = "main"
DEFAULT_SPLIT = "test"
DEFAULT_EXEMPLAR_SPLIT = "train"
PROMPTS = ("chat", "fewshot")

_CALCULATOR = re.compile(r"<<[^<>]*>>")


def gold_from_answer(answer: str) -> str | None:
    """Normalised gold answer from a GSM8K "answer" field (the text after the last "#### ")."""
    if "####" not in answer:
        return None
    return normalize_answer(answer.rsplit("####", 1)[1].strip())


def _checked_record(where: str, record: dict) -> tuple[str, str, str]:
    """A record's question, answer and gold, or an error naming the record: both fields must
    be text (a number or a list would reach the tokenizer or the answer rule as something else)."""
    try:
        question, answer = record["question"], record["answer"]
    except (KeyError, TypeError) as e:
        raise BenchmarkError(f"{where} lacks 'question'/'answer'") from e
    for key, value in (("question", question), ("answer", answer)):
        if not isinstance(value, str):
            raise BenchmarkError(f"{where}: {key} must be a string, got {type(value).__name__} {excerpt(value)}")
    gold = gold_from_answer(answer)
    if gold is None:
        raise BenchmarkError(f"{where} has no numeric answer after '####'")
    return question, answer, gold


def _same_data(a: Source, b: Source) -> bool:
    """Whether two sources name the same records: one local file, or one hub split."""
    if a.path is not None or b.path is not None:
        return a.path is not None and b.path is not None and Path(a.path).resolve() == Path(b.path).resolve()
    return (a.hub, a.config, a.split) == (b.hub, b.config, b.split)


def exemplar_answer(answer: str) -> str:
    """A GSM8K answer as a worked exemplar: calculator annotations `<<...>>` removed."""
    return _CALCULATOR.sub("", answer).strip()


class GSM8KBenchmark(MathBenchmark):
    """GSM8K problems in dataset order, prompted 0-shot in chat (default) or `shots`-shot."""

    kind = "gsm8k"
    # lm-evaluation-harness's gsm8k task (until: "Question:", "</s>", "<|im_end|>"): a base
    # model writes its own next "Question: ..." after its answer.
    stops = {"chat": ("Question:", "</s>", "<|im_end|>"), "bare": ("Question:", "</s>", "<|im_end|>")}
    stop_source = "lm-evaluation-harness gsm8k (until: Question:, </s>, <|im_end|>)"
    spec_schema = {"source": SOURCE_SCHEMA, "prompt": {"enum": list(PROMPTS), "default": "chat"},
                   "shots": {"type": "integer", "minimum": 1}, "seed": {"type": "integer", "minimum": 0},
                   "exemplars": SOURCE_SCHEMA}

    @classmethod
    def from_spec(cls, name: str, spec: dict) -> "GSM8KBenchmark":
        """A config entry: `source` (default the hub's openai/gsm8k test split), `prompt`
        chat|fewshot, and for fewshot `shots`, `seed` and an `exemplars` source (default
        the train split)."""
        where = f"benchmark {name!r} (gsm8k)"
        source = parse_source(where, spec.get("source"), Source(hub=DEFAULT_HUB_ID, config=DEFAULT_CONFIG,
                                                               split=DEFAULT_SPLIT))
        prompt = spec.get("prompt", "chat")
        if prompt != "fewshot" and ({"shots", "exemplars"} & set(spec)):
            raise BenchmarkError(f"{where}: 'shots' and 'exemplars' apply only with prompt: fewshot")
        exemplars = None
        if "exemplars" in spec:
            exemplars = parse_source(f"{where} exemplars", spec["exemplars"],
                                     Source(hub=DEFAULT_HUB_ID, config=DEFAULT_CONFIG, split=DEFAULT_EXEMPLAR_SPLIT))
        if source.path is not None:
            location = {"path": source.path}
        elif source.package is not None:
            raise BenchmarkError(f"{where}: a package source is not supported for gsm8k; use a path or the hub")
        else:
            location = {"hub": source.hub, "config": source.config, "split": source.split,
                        "revision": source.revision}
        options = {key: spec[key] for key in ("prompt", "shots", "seed") if key in spec}
        return cls(name, n=spec.get("n"), **location, exemplars=exemplars, **options)

    def __init__(
        self,
        name: str = "gsm8k",
        n: int | None = None,
        *,
        path: str | Path | None = None,
        hub: str = DEFAULT_HUB_ID,
        config: str = DEFAULT_CONFIG,
        split: str = DEFAULT_SPLIT,
        revision: str | None = None,
        prompt: str = "chat",
        shots: int = 8,
        seed: int = 0,
        exemplars: Source | None = None,
    ) -> None:
        super().__init__(name, n)
        self.path = Path(path) if path is not None else None
        self.hub, self.config, self.split, self.revision = hub, config, split, revision
        if self.path is not None:
            self.source = Source(path=self.path)
        else:
            self.source = Source(hub=hub, config=config, split=split, revision=revision)
        check_local(self._label(), self.source)
        if prompt not in PROMPTS:
            raise BenchmarkError(f"{self._label()}: prompt must be one of {list(PROMPTS)}, got {prompt!r}")
        for key, value, low in (("shots", shots, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise BenchmarkError(f"{self._label()}: {key} must be an integer >= {low}, got {value!r}")
        self.prompt, self.shots, self.seed = prompt, shots, seed
        if exemplars is None and prompt == "fewshot":
            exemplars = Source(hub=DEFAULT_HUB_ID, config=DEFAULT_CONFIG, split=DEFAULT_EXEMPLAR_SPLIT,
                               revision=revision if self.path is None and hub == DEFAULT_HUB_ID else None)
        self.exemplar_source = exemplars if prompt == "fewshot" else None
        if self.exemplar_source is not None:
            check_local(self._label() + " exemplars", self.exemplar_source)
            if _same_data(self.exemplar_source, self.source):
                raise BenchmarkError(f"{self._label()}: the few-shot exemplars come from the data being evaluated "
                                     f"({self.source.label()}), so prompts would show other items' answers; "
                                     "draw them from another split (the default is the train split)")
        self._items: list[Item] | None = None
        self._pool: list[tuple[str, str]] | None = None
        self._order: list[int] | None = None
        self._chosen: list[int] | None = None
        self._excluded = 0

    @property
    def prompt_format(self) -> str:
        if self.prompt == "chat":
            return "chat, 0-shot"
        return f"chat, {self.shots}-shot chain-of-thought (multi-turn exemplars, seed {self.seed})"

    def _label(self) -> str:
        return f"benchmark {self.name!r} (gsm8k)"

    def source_label(self) -> str:
        """The source tried: the local path, or hub id@revision."""
        return self.source.label()

    def items(self) -> list[Item]:
        """The first n records of the drawn order (all if n is None or larger than the split)."""
        if self._items is None:
            records = load_records(self._label(), self.source)
            # every record checked in the source's order (an error names its place there), then drawn
            self._items = [item for _, item in self.drawn(self.checked(
                [self._item(index, record) for index, record in enumerate(records)],
                f"{self._label()} from {self.source_label()}"))]
        return list(self._items)

    def _item(self, index: int, record: dict) -> Item:
        question, answer, gold = _checked_record(f"{self._label()}: record {index} of {self.source_label()}", record)
        return Item(id=f"gsm8k-{index:04d}", question=question, gold=gold, solution=answer)

    def _exemplar_pool(self) -> tuple[list[tuple[str, str]], list[int]]:
        if self._pool is None:
            where = f"{self._label()} exemplars"
            pool = []
            for index, record in enumerate(load_records(where, self.exemplar_source)):
                question, answer, _ = _checked_record(
                    f"{where}: record {index} of {self.exemplar_source.label()}", record)
                pool.append((question, exemplar_answer(answer)))
            if len(pool) <= self.shots:
                raise BenchmarkError(f"{where}: {len(pool)} records, need more than shots={self.shots}")
            order = list(range(len(pool)))
            random.Random(self.seed).shuffle(order)
            self._pool, self._order = pool, order
        return self._pool, self._order

    def exemplar_indices(self, item: Item | None = None) -> list[int]:
        """Pool indices of the exemplars (the same for every item): the first `shots` of the
        seeded order whose question is none of the evaluated items' (two files can share
        records), so that no prompt shows an evaluated item's answer."""
        if self._chosen is None:
            pool, order = self._exemplar_pool()
            evaluated = {other.question.strip() for other in self.items()}
            allowed = [index for index in order if pool[index][0].strip() not in evaluated]
            if len(allowed) < self.shots:
                raise BenchmarkError(f"{self._label()} exemplars: {len(allowed)} records that are not evaluated "
                                     f"items, need shots={self.shots}")
            self._chosen = allowed[: self.shots]
            self._excluded = len(order) - len(allowed)
        return list(self._chosen)

    def messages(self, item: Item) -> list[dict]:
        """System instruction, then (fewshot) one user/assistant turn per exemplar, then the question."""
        messages = [{"role": "system", "content": MATH_SYSTEM_PROMPT}]
        if self.prompt == "fewshot":
            pool, _ = self._exemplar_pool()
            for index in self.exemplar_indices(item):
                question, answer = pool[index]
                messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": item.question})
        return messages

    def describe(self) -> dict:
        """Provenance: the source (local path and sha256, or hub coordinates), the number of items
        and, for few-shot, the exemplar source, seed, indices and how many pool records were
        left out because they are evaluated items."""
        info = self._describe(self.source.describe())
        info["n_requested"] = self.n
        info["n"] = len(self.items())
        info["prompt"] = self.prompt
        if self.prompt == "fewshot":
            info["fewshot"] = {
                "shots": self.shots,
                "seed": self.seed,
                "selection": "first `shots` of random.Random(seed).shuffle(pool indices) whose question is not "
                             "an evaluated item's",
                "exemplar_format": "question as user turn; answer without <<calculator>> annotations, ending '#### N'",
                "source": self.exemplar_source.describe(),
                "exemplar_indices": self.exemplar_indices(),
                "excluded_evaluated": self._excluded,
            }
        return info
