"""The diverged prompts, read side by side: per pair, both completions at the first token
where they part, with that step's top-k candidates on both sides. The page shows a bounded
number of them (a study of thousands of pairs keeps its size); `tables/diverged.csv` holds
every one, with the whole texts."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from tokenflip.analysis import texts
from tokenflip.report.common import in_words

# Diverged prompts shown as text per pair, and in all: each is about 3 kB of HTML, so the
# page grows by at most about 0.5 MB however large the study.
SHOWN_PER_PAIR = 3
SHOWN_IN_ALL = 150
# Rows of the index table (one line per diverged prompt, about 0.4 kB each).
INDEX_ROWS = 1000
# Characters of the common prefix shown before the differing token, and of each side after it.
PREFIX_CHARS = 200
REST_CHARS = 300


def anchor(index: int) -> str:
    """The element id of a pair's diverged prompts (pair ids hold '/' and '=')."""
    return f"diverged-{index}"


def outcome(correct: Any, verdict: Any, finish: Any, n_tokens: Any) -> str:
    """One side's answer in words: right, wrong, no answer, or not scored; and whether the
    completion was cut at the token limit."""
    if correct is None or (isinstance(correct, float) and math.isnan(correct)):
        words = "no answer" if verdict in ("no_answer", "no_code") else "not scored"
    else:
        words = "right" if bool(correct) else ("no answer" if verdict in ("no_answer", "no_code") else "wrong")
    if finish == "length":
        words += f", cut at {int(n_tokens)} tokens"
    return words


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def answer(row: dict[str, Any], side: str) -> str | None:
    """A side's final answer; None where it gave none (none found, a benchmark that scores
    nothing, or a null, which reads back from Parquet as NaN)."""
    value = row.get(f"extracted_{side}")
    if _missing(value) or row.get(f"verdict_{side}") in (*texts.NO_ANSWER, "not_scored"):
        return None
    return str(value)


def answers_agree(row: dict[str, Any]) -> str | None:
    """Whether the final answers agree, in words: "same final answer" only where both sides
    gave one and they are equal (the pair's `same_answer` also counts two missing answers as
    agreeing); None where the pair file says nothing."""
    if _missing(row.get("same_answer")):
        return None
    if row.get("verdict_a") == row.get("verdict_b") == "not_scored":
        return "answers not scored"
    a, b = _answered(row, "a"), _answered(row, "b")
    if not a and not b:
        return "no answer on either side"
    if not a or not b:
        return "an answer on one side only"
    return "same final answer" if row["same_answer"] else "final answer differs"


def _answered(row: dict[str, Any], side: str) -> bool:
    """Whether a side gave an answer: by its verdict (code is answered by running it), else
    by whether one was extracted."""
    verdict = row.get(f"verdict_{side}")
    if isinstance(verdict, str):
        return verdict not in (*texts.NO_ANSWER, "not_scored")
    return answer(row, side) is not None


def _tied(top: list) -> list[bool]:
    """Which of a side's candidates tie its top logit exactly (with at least one other): at
    such a step the engine's tie-break chose the token, not the model."""
    if not top:
        return []
    best = max(entry[2] for entry in top)
    n_best = sum(entry[2] == best for entry in top)
    return [n_best > 1 and entry[2] == best for entry in top]


def _candidates(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The step's top-k of both sides rank by rank, each side's chosen token and exact ties
    of its top logit marked."""
    a, b = json.loads(row["topk_a"] or "[]"), json.loads(row["topk_b"] or "[]")
    tied_a, tied_b = _tied(a), _tied(b)
    out = []
    for rank in range(max(len(a), len(b))):
        ca, cb = (a[rank] if rank < len(a) else None), (b[rank] if rank < len(b) else None)
        out.append({"rank": rank + 1,
                    "token_a": ca[0] if ca else None, "logit_a": ca[2] if ca else None,
                    "chosen_a": bool(ca) and ca[1] == row["token_id_a"], "tied_a": bool(ca) and tied_a[rank],
                    "token_b": cb[0] if cb else None, "logit_b": cb[2] if cb else None,
                    "chosen_b": bool(cb) and cb[1] == row["token_id_b"], "tied_b": bool(cb) and tied_b[rank]})
    return out


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    split = texts.parts(row)
    prefix, rest_a, rest_b = split["prefix"], split["rest_a"], split["rest_b"]
    unsplit = row["token_a"] is None or row["token_b"] is None
    candidates = _candidates(row)
    return {**row, "unsplit": unsplit, "prefix_cut": len(prefix) > PREFIX_CHARS, "prefix_tail": prefix[-PREFIX_CHARS:],
            "rest_a_head": rest_a[:REST_CHARS], "rest_a_cut": len(rest_a) > REST_CHARS,
            "rest_b_head": rest_b[:REST_CHARS], "rest_b_cut": len(rest_b) > REST_CHARS,
            "answer_a": answer(row, "a"), "answer_b": answer(row, "b"), "answers_agree": answers_agree(row),
            "outcome_a": outcome(row["correct_a"], row["verdict_a"], row["finish_a"], row["n_tokens_a"]),
            "outcome_b": outcome(row["correct_b"], row["verdict_b"], row["finish_b"], row["n_tokens_b"]),
            "candidates": candidates, "tie_a": any(c["tied_a"] for c in candidates),
            "tie_b": any(c["tied_b"] for c in candidates)}


def diverged_view(diverged: pd.DataFrame, pairs: pd.DataFrame) -> dict[str, Any]:
    """For the template: the pairs with diverged prompts, in the pairs table's order, each
    with its first few prompts as text (`diverged_pairs`); each pair's anchor; the index
    table's rows (`diverged_index`, bounded); every row for the CSV (`diverged_rows`, a
    frame: tens of thousands of rows are not turned into dicts)."""
    empty = {"diverged_pairs": [], "diverged_anchor": {}, "diverged_index": [], "diverged_rows": [],
             "diverged_total": 0, "diverged_shown": 0, "diverged_per_pair": SHOWN_PER_PAIR}
    if diverged.empty or pairs.empty:
        return empty
    # Through Parquet a missing rejoin step is NaN (and a summary made before the labels has
    # none of these columns): None, which the template reads as "never" / unlabelled.
    diverged = diverged.reindex(columns=[*diverged.columns, *(c for c in texts.LABEL_COLUMNS if c not in diverged)])
    for column in texts.LABEL_COLUMNS:
        diverged[column] = diverged[column].astype(object).where(diverged[column].notna(), None)
    order = pairs.sort_values(["model", "benchmark", "axis", "a", "b", "context"])
    order = order[order["pair_id"].isin(set(diverged["pair_id"]))].reset_index(drop=True)
    anchors = {pid: anchor(i) for i, pid in enumerate(order["pair_id"])}
    rank = pd.Series(range(len(order)), index=order["pair_id"])
    ranked = diverged.assign(_rank=diverged["pair_id"].map(rank)).dropna(subset=["_rank"])
    ranked = ranked.sort_values(["_rank", "step", "prompt_id"], kind="stable")
    counts = ranked.groupby("pair_id", sort=False).size()
    heads = ranked.groupby("pair_id", sort=False).head(SHOWN_PER_PAIR).head(SHOWN_IN_ALL)
    shown: dict[str, list[dict[str, Any]]] = {}
    for row in heads.drop(columns="_rank").to_dict("records"):
        shown.setdefault(row["pair_id"], []).append(_shown(row))
    groups = [{"anchor": anchors[pair["pair_id"]], "pair": pair, "words": in_words(pair, plain=False),
               "shown": shown.get(pair["pair_id"], []), "n": int(counts[pair["pair_id"]])}
              for pair in order.to_dict("records")]
    index = ranked.head(INDEX_ROWS).drop(columns="_rank")
    index = index.assign(anchor=index["pair_id"].map(anchors)).to_dict("records")
    return {"diverged_pairs": groups, "diverged_anchor": anchors, "diverged_index": index,
            "diverged_rows": ranked.drop(columns="_rank"), "diverged_total": len(ranked),
            "diverged_shown": len(heads), "diverged_per_pair": SHOWN_PER_PAIR}


def visible(token: Any) -> str:
    """A token as text with its whitespace visible (␣ for a space, ⏎ for a newline), for
    the candidate lists, where a bare space would read as nothing."""
    if token is None:
        return "–"
    return str(token).replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥") or "(empty)"
