"""GSM8K grade-school math, loaded from a local file or the Hugging Face hub, prompted 0-shot
in chat or few-shot with chain-of-thought exemplars drawn by seed from a separate pool."""

from __future__ import annotations

import random
import re
from pathlib import Path

from .answers import normalize_answer
from .base import MATH_SYSTEM_PROMPT, SOURCE_SCHEMA, BenchmarkError, Item, MathBenchmark
from .sources import Source, check_local, load_records, parse_source

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


def exemplar_answer(answer: str) -> str:
    """A GSM8K answer as a worked exemplar: calculator annotations `<<...>>` removed."""
    return _CALCULATOR.sub("", answer).strip()


class GSM8KBenchmark(MathBenchmark):
    """GSM8K problems in dataset order, prompted 0-shot in chat (default) or `shots`-shot."""

    kind = "gsm8k"
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
        self._items: list[Item] | None = None
        self._pool: list[tuple[str, str]] | None = None
        self._order: list[int] | None = None

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
        """The first n records (all if n is None or larger than the split)."""
        if self._items is None:
            records = load_records(self._label(), self.source)
            if self.n is not None:
                records = records[: self.n]
            self._items = self.checked([self._item(index, record) for index, record in enumerate(records)],
                                       f"{self._label()} from {self.source_label()}")
        return list(self._items)

    def _item(self, index: int, record: dict) -> Item:
        where = f"{self._label()}: record {index} of {self.source_label()}"
        try:
            question, answer = record["question"], record["answer"]
        except (KeyError, TypeError) as e:
            raise BenchmarkError(f"{where} lacks 'question'/'answer'") from e
        gold = gold_from_answer(answer)
        if gold is None:
            raise BenchmarkError(f"{where} has no numeric answer after '####'")
        return Item(id=f"gsm8k-{index:04d}", question=question, gold=gold, solution=answer)

    def _exemplar_pool(self) -> tuple[list[tuple[str, str]], list[int]]:
        if self._pool is None:
            where = f"{self._label()} exemplars"
            pool = []
            for index, record in enumerate(load_records(where, self.exemplar_source)):
                try:
                    question, answer = record["question"], record["answer"]
                except (KeyError, TypeError) as e:
                    raise BenchmarkError(f"{where}: record {index} lacks 'question'/'answer'") from e
                if gold_from_answer(answer) is None:
                    raise BenchmarkError(f"{where}: record {index} has no numeric answer after '####'")
                pool.append((question, exemplar_answer(answer)))
            if len(pool) <= self.shots:
                raise BenchmarkError(f"{where}: {len(pool)} records, need more than shots={self.shots}")
            order = list(range(len(pool)))
            random.Random(self.seed).shuffle(order)
            self._pool, self._order = pool, order
        return self._pool, self._order

    def exemplar_indices(self, item: Item) -> list[int]:
        """Pool indices of the item's exemplars: the first `shots` of the seeded order whose
        question is not the item's own."""
        pool, order = self._exemplar_pool()
        own = item.question.strip()
        chosen = []
        for index in order:
            if pool[index][0].strip() != own:
                chosen.append(index)
                if len(chosen) == self.shots:
                    break
        return chosen

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
        and, for few-shot, the exemplar source, seed, indices and per-item substitutions."""
        info = self._describe(self.source.describe())
        info["n_requested"] = self.n
        info["n"] = len(self.items())
        info["prompt"] = self.prompt
        if self.prompt == "fewshot":
            _, order = self._exemplar_pool()
            default = order[: self.shots]
            substitutions = {}
            for item in self.items():
                chosen = self.exemplar_indices(item)
                if chosen != default:
                    substitutions[item.id] = chosen
            info["fewshot"] = {
                "shots": self.shots,
                "seed": self.seed,
                "selection": "first `shots` of random.Random(seed).shuffle(pool indices), skipping the item itself",
                "exemplar_format": "question as user turn; answer without <<calculator>> annotations, ending '#### N'",
                "source": self.exemplar_source.describe(),
                "exemplar_indices": default,
                "substitutions": substitutions,
            }
        return info
