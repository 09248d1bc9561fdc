"""GSM8K grade-school math, loaded from a local JSONL file or the Hugging Face hub."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from .answers import normalize_answer
from .base import BenchmarkError, Item, MathBenchmark

__all__ = ["GSM8KBenchmark", "DEFAULT_HUB_ID", "DEFAULT_CONFIG", "DEFAULT_SPLIT", "gold_from_answer"]

DEFAULT_HUB_ID = "openai/gsm8k"
DEFAULT_CONFIG = "main"
DEFAULT_SPLIT = "test"


def gold_from_answer(answer: str) -> str | None:
    """Normalised gold answer from a GSM8K "answer" field (the text after the last "#### ")."""
    if "####" not in answer:
        return None
    return normalize_answer(answer.rsplit("####", 1)[1].strip())


class GSM8KBenchmark(MathBenchmark):
    """GSM8K problems in dataset order, prompted 0-shot in chat."""

    kind = "gsm8k"

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
    ) -> None:
        super().__init__(name, n)
        self.path = Path(path) if path is not None else None
        self.hub, self.config, self.split, self.revision = hub, config, split, revision
        if self.path is not None and not self.path.is_file():
            raise BenchmarkError(f"{self._label()}: local file not found: {self.path}")
        self._items: list[Item] | None = None

    def _label(self) -> str:
        return f"benchmark {self.name!r} (gsm8k)"

    def source_label(self) -> str:
        """The source tried: the local path, or hub id@revision."""
        if self.path is not None:
            return str(self.path)
        return f"{self.hub}@{self.revision or 'unpinned'} (config {self.config!r}, split {self.split!r})"

    def _records(self) -> Iterable[dict]:
        if self.path is not None:
            return self._read_jsonl()
        return self._load_hub()

    def _read_jsonl(self) -> list[dict]:
        records = []
        try:
            with self.path.open(encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise BenchmarkError(f"{self._label()}: bad JSON in {self.path}:{lineno}: {e}") from e
                    if self.n is not None and len(records) >= self.n:
                        break
        except OSError as e:
            raise BenchmarkError(f"{self._label()}: cannot read {self.path}: {e}") from e
        return records

    def _load_hub(self) -> Iterable[dict]:
        try:
            import datasets

            return datasets.load_dataset(self.hub, self.config, split=self.split, revision=self.revision)
        except Exception as e:
            raise BenchmarkError(
                f"{self._label()}: cannot load from the Hugging Face hub {self.source_label()}: "
                f"{type(e).__name__}: {e}"
            ) from e

    def items(self) -> list[Item]:
        """The first n records (all if n is None or larger than the split)."""
        if self._items is None:
            items = []
            for index, record in enumerate(self._records()):
                if self.n is not None and index >= self.n:
                    break
                items.append(self._item(index, record))
            self._items = items
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

    def describe(self) -> dict:
        """Provenance: local path and its sha256, or hub id, config, split and revision."""
        if self.path is not None:
            source = {"path": str(self.path), "sha256": hashlib.sha256(self.path.read_bytes()).hexdigest()}
        else:
            source = {"hub": self.hub, "config": self.config, "split": self.split, "revision": self.revision}
        return self._describe(source)
