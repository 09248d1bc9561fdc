"""Completions as text, for the summary: which were cut at max_new_tokens, which pairs
"agree" only by both giving no answer, what a user's own prompts got (`prompt_texts_frame`:
the texts the cells stored), and the diverged prompts: per pair and prompt, both completions
split at the first differing token (common prefix once, each side's token, each side's rest)
with that step's top-k candidates and logits on both sides, for the report and
`tables/diverged.csv`.

The diverged texts are the prepared tokenizer's decoding of the token ids the cells stored (the
decoding the cells scored), never a re-tokenisation of text; the tokenizer is used only if
its digest is the one the cells recorded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tokenflip.core import storage
from tokenflip.core.specs import Cell, Pair

CELL_COLUMNS = ["prompt_id", "token_ids", "top_ids", "top_logits", "margin", "finish_reason", "correct",
                "verdict", "extracted", "text"]

# Characters of a prompt and of a completion the `texts` table keeps: a user's prompt may be
# a whole document, and the summary is read whole by the report; the cell file holds all.
TEXT_CHARS = 2000
PROMPT_TEXT_COLUMNS = ["model", "benchmark", "engine", "precision", "cell_id", "prompt_index", "prompt_id", "prompt",
                       "prompt_cut", "completion", "completion_cut", "finish_reason", "n_tokens"]

# Each side's text is stored once, whole; `prefix_chars` (the common prefix's length in
# characters) and the differing tokens' texts split it: prefix = text_a[:prefix_chars],
# rest_a = text_a[prefix_chars + len(token_a):] (`parts`). Where the model's prepared
# directory is gone (resources/ removed after the run), the texts are the ones the cells
# stored (the same tokenizer's decoding, made when they ran), unsplit: `prefix_chars` and the
# token texts are null.
# What the pair file says of why each prompt parted (`causes`), whether the streams came
# together again, and whether the final answers agree; a missing value reads back as NaN.
LABEL_COLUMNS = ("cause", "rejoin_step", "same_answer")
COLUMNS = ["pair_id", "label", "axis", "a", "b", "context", "model", "benchmark", "engine", "prompt_id", "step",
           "prefix_chars", "token_a", "token_b", "text_a", "text_b", "token_id_a", "token_id_b",
           "margin_a", "margin_b", "topk_a", "topk_b", "correct_a", "correct_b", "verdict_a", "verdict_b",
           "extracted_a", "extracted_b", "finish_a", "finish_b", "n_tokens_a", "n_tokens_b", *LABEL_COLUMNS]


# Verdicts of a completion in which no answer (or no code) was found.
NO_ANSWER = ("no_answer", "no_code")


def truncation(table: pa.Table, meta: dict[str, Any]) -> dict[str, int]:
    """Completions cut at max_new_tokens (finish reason "length"), and those of them in which
    no answer was found: not wrong answers but unmeasured ones."""
    cut = pc.equal(table.column("finish_reason"), "length")
    no_answer = pc.is_in(table.column("verdict"), pa.array(NO_ANSWER))
    return {"n_cut": int(pc.sum(cut).as_py() or 0), "n_cut_no_answer": int(pc.sum(pc.and_(cut, no_answer)).as_py() or 0),
            "max_new_tokens": int(meta.get("settings", {}).get("max_new_tokens") or 0)}


def answerless_agreements(per_prompt: pd.DataFrame) -> int:
    """Prompts that count as "same answer" only because neither side gave one."""
    both_missing = per_prompt["verdict_a"].isin(NO_ANSWER) & per_prompt["verdict_b"].isin(NO_ANSWER)
    return int((both_missing & per_prompt["same_answer"].astype(bool)).sum())


class TokenizerError(ValueError):
    """The prepared tokenizer is missing or is not the one the cells were decoded with."""


def _clean_cut(decode: Callable[[list[int]], str], ids: list[int], full: str, j: int, step: int) -> int:
    """The nearest token boundary from `j` (moving by `step`) whose decoded prefix is a
    prefix of the whole decoded text: a cut inside a multi-byte character is not one."""
    while 0 < j < len(ids) and not full.startswith(decode(ids[:j])):
        j += step
    return max(0, min(j, len(ids)))


def split_at(decode: Callable[[list[int]], str], ids_a: list[int], ids_b: list[int], step: int) -> dict[str, str]:
    """Both completions as common prefix + each side's differing token + each side's rest,
    such that prefix + token_x + rest_x is exactly decode(ids_x) on both sides. Where the
    token at `step` does not decode on its own (part of a character), the cut moves to the
    nearest clean boundary, so the marked text may span a token more."""
    full_a, full_b = decode(ids_a), decode(ids_b)
    start = step
    while start > 0 and not (full_a.startswith(p := decode(ids_a[:start])) and full_b.startswith(p)):
        start -= 1
    prefix = decode(ids_a[:start])
    out = {"prefix": prefix, "text_a": full_a, "text_b": full_b}
    for side, ids, full in (("a", ids_a, full_a), ("b", ids_b, full_b)):
        end = _clean_cut(decode, ids, full, min(step + 1, len(ids)), +1)
        upto = decode(ids[:end])
        out[f"token_{side}"] = upto[len(prefix):]
        out[f"rest_{side}"] = full[len(upto):]
    return out


def _candidates(decode: Callable[[list[int]], str] | None, ids: Any, logits: Any) -> str:
    """A step's top-k as JSON: [[token text, token id, logit], ...] in rank order (the text
    null without a tokenizer)."""
    return json.dumps([[decode([int(i)]) if decode else None, int(i), round(float(v), 6)]
                       for i, v in zip(ids, logits)])


class Tokenizers:
    """One prepared tokenizer per model, loaded once and checked against the digest the
    cells recorded (meta.model.tokenizer_sha256)."""

    def __init__(self, model_dir: Callable[[str], str]):
        self._model_dir, self._loaded = model_dir, {}

    def decoder(self, model: str, recorded_digest: str | None) -> Callable[[list[int]], str] | None:
        """The model's decoding function, or None where its prepared directory is absent."""
        if model not in self._loaded:
            from tokenflip.models.prepare import ModelError, load_tokenizer, read_manifest

            path = self._model_dir(model)
            if not Path(path).exists():
                self._loaded[model] = None
                return None
            try:
                manifest, tokenizer = read_manifest(path), load_tokenizer(path)
                if hasattr(tokenizer, "check"):  # a server's tokenizer: texts only while it answers, unchanged
                    try:
                        tokenizer.check()
                    except Exception:  # noqa: BLE001 - the server is gone: ids without their texts
                        self._loaded[model] = None
                        return None
            except (ModelError, OSError, ValueError) as exc:
                raise TokenizerError(f"{path}: the prepared tokenizer of model {model!r} cannot be read ({exc}); "
                                     "run the prepare_model rule for it") from None
            if recorded_digest is not None and manifest.get("tokenizer_sha256") != recorded_digest:
                raise TokenizerError(f"{path}: tokenizer_sha256 {str(manifest.get('tokenizer_sha256'))[:12]}… is not "
                                     f"the {recorded_digest[:12]}… its cells were decoded with; prepare it again")
            self._loaded[model] = lambda ids, tok=tokenizer: tok.decode(ids, skip_special_tokens=True)
        return self._loaded[model]


def _step(row: dict[str, Any], step: int, key: str) -> Any:
    values = row[key]
    return values[step] if step < len(values) else None


def pair_diverged(pair: Pair, prompts: pd.DataFrame, path_a: str | Path, path_b: str | Path,
                  decode: Callable[[list[int]], str] | None) -> list[dict[str, Any]]:
    """One row per diverged prompt of `pair` (`prompts`: its first-divergence rows, with
    `prompt_id` and `first_div_step`), read from the two cell files."""
    wanted = set(prompts["prompt_id"])
    sides = {}
    for side, path in (("a", path_a), ("b", path_b)):
        table, _ = storage.read_table(path, columns=CELL_COLUMNS, kind="cell")
        sides[side] = {r["prompt_id"]: r for r in table.to_pylist() if r["prompt_id"] in wanted}
    rows = []
    for first in prompts.to_dict("records"):
        prompt_id, step = first["prompt_id"], int(first["first_div_step"])
        a, b = sides["a"][prompt_id], sides["b"][prompt_id]
        row = {"pair_id": pair.id, "label": pair.label, "axis": pair.axis, "a": str(pair.a.value(pair.axis)),
               "b": str(pair.b.value(pair.axis)), "context": pair.context, "model": pair.a.model,
               "benchmark": pair.a.benchmark, "engine": str(pair.a.value("engine")), "prompt_id": prompt_id,
               "step": step, **(split_at(decode, a["token_ids"], b["token_ids"], step) if decode else
                                {"prefix": None, "text_a": a["text"], "text_b": b["text"], "token_a": None,
                                 "token_b": None, "rest_a": None, "rest_b": None})}
        for side, rec in (("a", a), ("b", b)):
            ids, logits = _step(rec, step, "top_ids"), _step(rec, step, "top_logits")
            row.update({f"token_id_{side}": _step(rec, step, "token_ids"), f"margin_{side}": _step(rec, step, "margin"),
                        f"topk_{side}": _candidates(decode, ids, logits) if ids is not None else "[]",
                        f"correct_{side}": rec["correct"], f"verdict_{side}": rec["verdict"],
                        f"extracted_{side}": rec["extracted"], f"finish_{side}": rec["finish_reason"],
                        f"n_tokens_{side}": len(rec["token_ids"])})
        prefix = row.pop("prefix")
        del row["rest_a"], row["rest_b"]
        row["prefix_chars"] = len(prefix) if prefix is not None else None
        row.update({key: first.get(key) for key in LABEL_COLUMNS})
        rows.append(row)
    return rows


def parts(row: dict[str, Any]) -> dict[str, str]:
    """A stored row's texts split at the first differing token: prefix, rest_a, rest_b
    (unsplit, the whole texts as the rests, where no tokenizer split them)."""
    if row["prefix_chars"] is None or row["prefix_chars"] != row["prefix_chars"]:
        return {"prefix": "", "rest_a": row["text_a"], "rest_b": row["text_b"]}
    start = int(row["prefix_chars"])
    return {"prefix": row["text_a"][:start], "rest_a": row["text_a"][start + len(row["token_a"]):],
            "rest_b": row["text_b"][start + len(row["token_b"]):]}


def diverged_frame(pairs: list[Pair], first_div: pd.DataFrame, layout: Any, cell_metas: dict[str, dict],
                   refuse: Callable[[str, str], None]) -> pd.DataFrame:
    """Every diverged prompt of every summarised pair, as text (see `pair_diverged`); a
    model whose prepared tokenizer cannot be used is refused (`refuse(path, reason)`)."""
    rows: list[dict[str, Any]] = []
    tokenizers = Tokenizers(layout.model_dir)
    by_pair = {pair.id: pair for pair in pairs}
    for pair_id, prompts in (first_div.groupby("pair_id", sort=False) if not first_div.empty else ()):
        pair = by_pair[pair_id]
        try:
            decode = tokenizers.decoder(pair.a.model,
                                        cell_metas.get(pair.a.id, {}).get("model", {}).get("tokenizer_sha256"))
        except TokenizerError as exc:
            refuse(layout.model_dir(pair.a.model), str(exc))
            continue
        rows += pair_diverged(pair, prompts, layout.cell(pair.a.id), layout.cell(pair.b.id), decode)
    return pd.DataFrame(rows, columns=COLUMNS)


def _bounded(text: str | None) -> tuple[str, bool]:
    """The text up to TEXT_CHARS, and whether it was cut there."""
    text = text or ""
    return text[:TEXT_CHARS], len(text) > TEXT_CHARS


def prompt_texts_frame(config: dict[str, Any], cells: list[Cell], cell_metas: dict[str, dict],
                       cell_path: Callable[[str], str]) -> pd.DataFrame:
    """What a user's own prompts (benchmarks of kind `prompts`) got, shown even where nothing
    diverged: per prompt, its text as the user wrote it (a conversation's last turn, from the
    benchmark's data, which the summary checked is the data the cells were made from) and the
    completion of each engine's default cell: a usable cell whose every axis but engine and
    precision is at its plain setting (`plan.at_defaults`: cache on, batch size 1, greedy, no
    intervention, each further axis at its default, a first run). Texts cut at TEXT_CHARS."""
    from tokenflip.run.benchmarks import build_benchmark
    from tokenflip.run.benchmarks.prompts_file import PromptsFileBenchmark
    from tokenflip.study.plan import at_defaults

    rows: list[dict[str, Any]] = []
    prompts: dict[str, dict[str, str]] = {}
    for cell in cells:
        spec = config["benchmarks"][cell.benchmark]
        if (spec.get("kind") != PromptsFileBenchmark.kind or cell.id not in cell_metas
                or not at_defaults(config, cell, ("engine", "precision"))):
            continue
        if cell.benchmark not in prompts:
            prompts[cell.benchmark] = {item.id: item.question
                                       for item in build_benchmark(cell.benchmark, spec).items()}
        table, _ = storage.read_table(cell_path(cell.id), columns=["prompt_index", "prompt_id", "text",
                                                                    "finish_reason", "n_tokens"], kind="cell")
        for rec in table.to_pylist():
            prompt, prompt_cut = _bounded(prompts[cell.benchmark].get(rec["prompt_id"]))
            completion, completion_cut = _bounded(rec["text"])
            rows.append({"model": cell.model, "benchmark": cell.benchmark, "engine": str(cell.engine),
                         "precision": cell.precision, "cell_id": cell.id, "prompt_index": rec["prompt_index"],
                         "prompt_id": rec["prompt_id"], "prompt": prompt, "prompt_cut": prompt_cut,
                         "completion": completion, "completion_cut": completion_cut,
                         "finish_reason": rec["finish_reason"], "n_tokens": rec["n_tokens"]})
    return pd.DataFrame(rows, columns=PROMPT_TEXT_COLUMNS)
