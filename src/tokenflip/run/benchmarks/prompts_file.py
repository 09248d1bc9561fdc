"""A team's own prompts (its traffic, its test set) from a JSONL, CSV or Parquet file or a hub
dataset: each record a text prompt or a chat conversation, optionally with an answer to score
exactly, numerically or by math equivalence, or not scored at all."""

from __future__ import annotations

import math
from typing import Any

from tokenflip.core.excerpt import excerpt
from tokenflip.core.inputs import InputError, loads_json
from tokenflip.run.benchmarks.answers import NUMERIC_RULES, find_answer, normalize_answer
from tokenflip.run.benchmarks.base import SOURCE_SCHEMA, Benchmark, BenchmarkError, Item, Score
from tokenflip.run.benchmarks.math_equiv import RULES as MATH_RULES
from tokenflip.run.benchmarks.math_equiv import math_score
from tokenflip.run.benchmarks import sources
from tokenflip.run.benchmarks.sources import Source, check_local, located_records

__all__ = ["PromptsFileBenchmark", "SCORERS", "EXTENSIONS", "RECORD_KEYS", "ROLES", "MAX_RECORDS",
           "MAX_PROMPT_CHARS", "MAX_TURNS", "MAX_ID_CHARS"]

# How an answer is scored, where a record has one: see `PromptsFileBenchmark.scorer`.
SCORERS = {
    "none": "not scored: the replies are compared, no accuracy is measured",
    "exact": "exact: the text before the stop, stripped, equals the answer stripped",
    "numeric": ("numeric final answer of the text before the stop ('#### N', else 'the answer is N', else the "
                "last number) equal to the answer within 1e-6"),
    "math": ("math-verify on the text before the stop (\\boxed{...} first, then 'final answer is $...$', then the "
             "last expression) verified against the parsed answer"),
}
EXTENSIONS = (".jsonl", ".json", ".csv", ".parquet")
RECORD_KEYS = ("id", "prompt", "messages", "answer")
ROLES = ("system", "user", "assistant")
# Bounds on a prompts file besides its size (sources.MAX_DATA_BYTES): a sample of traffic,
# not a corpus; each prompt within any model's context many times over (the tokenizer check
# before any job holds each one to its model's own context).
MAX_RECORDS = sources.MAX_RECORDS
MAX_PROMPT_CHARS = 2**20
MAX_TURNS = 1000
MAX_ID_CHARS = 200


class PromptsFileBenchmark(Benchmark):
    """The records of a file of prompts in file order; a record's `messages` are its prompt
    as written, a `prompt` is one user turn (chat) or the whole text (bare)."""

    kind = "prompts"
    prompt_format = "the file's own: a conversation as written; a text prompt as the user turn, or verbatim (bare)"
    spec_schema = {"source": SOURCE_SCHEMA,
                   "scorer": {"enum": list(SCORERS), "default": "none",
                              "description": "how a record's answer is scored (none: no accuracy, replies compared)"}}
    # A user's prompts have no turn markers to stop at: a reply ends with its turn (chat) or at
    # the token limit (bare), unless the config names stops.
    stops = {"chat": (), "bare": ()}
    stop_source = "none: a user's own prompts have no turn markers to stop at (set `stop` for a base model)"

    @classmethod
    def from_spec(cls, name: str, spec: dict[str, Any]) -> "PromptsFileBenchmark":
        """A config entry; `source` is required: this kind has no data of its own."""
        if spec.get("source") is None:
            raise BenchmarkError(f"benchmark {name!r} (prompts): 'source' is required: the file of prompts "
                                 "({path: my.jsonl}) or a hub dataset ({hub: org/name, split: test})")
        return super().from_spec(name, spec)

    @classmethod
    def default_source(cls, options: dict) -> Source:
        """No default data: a source's omitted hub keys stay unset."""
        return Source()

    def __init__(self, name: str = "prompts", n: int | None = None, *, source: Source, scorer: str = "none") -> None:
        super().__init__(name, n)
        if scorer not in SCORERS:
            raise BenchmarkError(f"{self._label()}: scorer must be one of {', '.join(SCORERS)}, got {scorer!r}")
        self.source, self.scorer_name, self.scorer = source, scorer, SCORERS[scorer]
        self.answer_rules = {"none": ("whole text",), "exact": ("whole text", "none"), "numeric": NUMERIC_RULES,
                             "math": MATH_RULES}[scorer]
        file = source.path.name if source.path is not None else source.file
        if file is not None and not file.lower().removesuffix(".gz").endswith(EXTENSIONS):
            raise BenchmarkError(f"{self._label()}: {source.label()}: cannot tell the file's format from its name; "
                                 f"a prompts file ends in {', '.join(EXTENSIONS)} (or one of these and .gz)")
        check_local(self._label(), source)
        self._items: list[Item] | None = None
        self._conversations: dict[str, list[dict]] = {}
        self._gold: dict[str, list] = {}

    def _label(self) -> str:
        return f"benchmark {self.name!r} (prompts)"

    def items(self) -> list[Item]:
        """The first n records of the drawn order (all if n is None); every record of the file
        is checked."""
        if self._items is None:
            label = self.source.label()
            records = located_records(self._label(), self.source, MAX_RECORDS)
            items, conversations, seen = [], {}, {}
            for index, (location, record) in enumerate(records):
                where = f"{self._label()}: {label} {location}"
                item, conversation = self._item(where, index, record)
                if item.id in seen:
                    raise BenchmarkError(f"{where}: id {item.id!r} is already the id of {seen[item.id]}")
                seen[item.id] = location
                items.append(item)
                if conversation is not None:
                    conversations[item.id] = conversation
            items = [item for _, item in self.drawn(items)]
            self._conversations = {item.id: conversations[item.id] for item in items if item.id in conversations}
            self._items = self.checked(items, f"{self._label()} from {label}")
        return list(self._items)

    def _item(self, where: str, index: int, record: dict) -> tuple[Item, list[dict] | None]:
        """A record's item and, for a `messages` record, its conversation."""
        unknown = [key for key in record if key not in RECORD_KEYS]
        if unknown:
            raise BenchmarkError(f"{where}: unknown key {excerpt(unknown[0])}; a record takes {', '.join(RECORD_KEYS)}")
        present = {key: value for key, value in record.items() if value is not None}  # a null cell is no value
        given = [key for key in ("prompt", "messages") if key in present]
        if len(given) != 1:
            raise BenchmarkError(f"{where}: a record needs exactly one of 'prompt' (text) or 'messages' (a "
                                 f"conversation), got {' and '.join(map(repr, given)) or 'neither'}")
        if "prompt" in present:
            prompt, conversation = present["prompt"], None
            if not isinstance(prompt, str) or not prompt.strip():
                raise BenchmarkError(f"{where}: 'prompt' must be non-empty text, got {excerpt(prompt)}")
            _check_length(where, len(prompt))
        else:
            conversation = _conversation(where, present["messages"])
            prompt = conversation[-1]["content"]
        item_id = present.get("id", f"{self.name}-{index:04d}")
        if not isinstance(item_id, str) or not item_id.strip() or len(item_id) > MAX_ID_CHARS:
            raise BenchmarkError(f"{where}: 'id' must be non-empty text of at most {MAX_ID_CHARS} characters, "
                                 f"got {excerpt(item_id)}")
        return Item(id=item_id, question=prompt, gold=self._gold_of(where, present)), conversation

    def _gold_of(self, where: str, record: dict) -> str:
        """The record's answer as text ("" where it has none), in the form its scorer compares."""
        if "answer" not in record:
            if self.scorer_name != "none":
                raise BenchmarkError(f"{where}: no 'answer', which scorer {self.scorer_name!r} needs in every "
                                     "record (or set scorer: none)")
            return ""
        answer = record["answer"]
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or (
                isinstance(answer, float) and not math.isfinite(answer)):
            raise BenchmarkError(f"{where}: 'answer' must be text or a number, got {type(answer).__name__} "
                                 f"{excerpt(answer)}")
        gold = str(answer).strip()
        if not gold and self.scorer_name != "none":
            raise BenchmarkError(f"{where}: 'answer' is empty")
        if self.scorer_name == "numeric":
            number = normalize_answer(gold)
            if number is None:
                raise BenchmarkError(f"{where}: 'answer' {excerpt(gold)} is not a number, which scorer 'numeric' "
                                     "compares (use scorer: exact or math)")
            return number
        return gold

    def messages(self, item: Item) -> list[dict]:
        """The record's conversation as written, or its text prompt as the one user turn."""
        if self._items is None:
            self.items()
        conversation = self._conversations.get(item.id)
        return [dict(turn) for turn in conversation] if conversation else [{"role": "user", "content": item.question}]

    def bare_text(self, item: Item) -> str:
        """A text prompt exactly as written; a conversation framed turn by turn (`Benchmark.bare_text`)."""
        if self._items is None:
            self.items()
        return super().bare_text(item) if item.id in self._conversations else item.question

    def find_answer(self, text: str, finished: bool = True) -> tuple[str | None, str]:
        """The reply's answer as its scorer reads it: the whole text (exact, none), the final
        number (numeric), or what math-verify parses (math)."""
        if self.scorer_name == "numeric":
            return find_answer(text, finished)
        if self.scorer_name == "math":
            answer = find_math_answer(text)
            return answer.text, answer.rule
        stripped = text.strip()
        return (stripped, "whole text") if stripped or self.scorer_name == "none" else (None, "none")

    def matches(self, answer: str, item: Item, rule: str = "") -> bool:
        if self.scorer_name == "exact":
            return answer == item.gold
        return super().matches(answer, item, rule)

    def score(self, item: Item, completion: str, finished: bool = True) -> Score:
        """The scorer's verdict; with scorer none, "not_scored" and no correctness (the report
        then measures no accuracy), the reply's text standing as its answer so that two
        replies agree when their texts do."""
        text = self.scored_text(completion)
        if self.scorer_name == "none":
            return Score(text.strip(), None, "whole text", "not_scored")
        if self.scorer_name != "math":
            return super().score(item, completion, finished)
        return math_score(text, item, self._gold)

    def describe(self) -> dict:
        """Prompt format, n, scorer and its rules, and the source (path and sha256, or hub coordinates)."""
        info = self._description(scorer_name=self.scorer_name, source=self.source.describe())
        if self.scorer_name == "math":
            from importlib import metadata

            info["math_verify"] = metadata.version("math-verify")
        return info


def _check_length(where: str, chars: int) -> None:
    if chars > MAX_PROMPT_CHARS:
        raise BenchmarkError(f"{where}: the prompt holds {chars:,} characters, more than the {MAX_PROMPT_CHARS:,} "
                             "a prompt may hold")


def _conversation(where: str, messages: Any) -> list[dict]:
    """A `messages` value as a checked conversation: JSON text (a CSV cell) is read first."""
    if isinstance(messages, str):
        try:
            messages = loads_json(messages, "'messages'")
        except InputError as e:
            raise BenchmarkError(f"{where}: 'messages' is text but {str(e).split(': ', 1)[-1]}") from None
    if not isinstance(messages, list) or not messages:
        raise BenchmarkError(f"{where}: 'messages' must be a non-empty list of turns, got {excerpt(messages)}")
    if len(messages) > MAX_TURNS:
        raise BenchmarkError(f"{where}: 'messages' holds {len(messages):,} turns, more than the {MAX_TURNS:,} a "
                             "conversation may hold")
    turns = []
    for index, turn in enumerate(messages):
        at = f"'messages'[{index}]"
        if not isinstance(turn, dict):
            raise BenchmarkError(f"{where}: {at} must be a mapping with 'role' and 'content', got {excerpt(turn)}")
        extra = [key for key in turn if key not in ("role", "content")]
        if extra:
            raise BenchmarkError(f"{where}: {at} has unknown key {excerpt(extra[0])}; a turn takes role and content")
        role, content = turn.get("role"), turn.get("content")
        if role not in ROLES:
            raise BenchmarkError(f"{where}: {at}['role'] must be one of {', '.join(ROLES)}, got {excerpt(role)}")
        if not isinstance(content, str) or not content.strip():
            raise BenchmarkError(f"{where}: {at}['content'] must be non-empty text, got {excerpt(content)}")
        if role == "system" and index:
            raise BenchmarkError(f"{where}: {at} is a system turn; only the first turn may be one")
        turns.append({"role": role, "content": content})
    if turns[-1]["role"] != "user":
        raise BenchmarkError(f"{where}: the last turn must be the user's (the model replies to it), got "
                             f"{turns[-1]['role']!r}")
    _check_length(where, sum(len(turn["content"]) for turn in turns))
    return turns
