"""Compare two cells that differ in one axis: per prompt, where the token streams part
and how far the logits had drifted before; per pair, rates with intervals and tests.

Two cells are only compared when their provenance agrees on everything but the axis
being compared; otherwise the comparison would measure something else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tokenflip.analysis import causes, statistics
from tokenflip.core import storage
from tokenflip.core.axes import AXES
from tokenflip.core.provenance import flatten_provenance
from tokenflip.core.specs import Pair
from tokenflip.run.engines import axis_provenance

# Provenance fields that legitimately differ between two cells of one run.
_FREE_FIELDS = {"cell", "cell_id", "token_stream_sha256", "logits_sha256", "table_sha256", "meta_sha256",
                "wall_seconds", "cpu_seconds", "job_seconds", "generated_tokens", "schema_version", "engine_timing", "traffic", "findings"}


# A code sample's verdicts (the other kinds' are correct, wrong and no_answer).
CODE_VERDICTS = {"passed", "failed", "timeout", "no_code", "sandbox_error"}


# The paper's gate threshold τ: a step whose top-2 margin is below it is a near-tie.
NEAR_TIE = 1e-3


def _allowed_fields(axis: str) -> tuple[str, ...]:
    """What a value of `axis` legitimately changes: the fields its entry in the table of
    axes names, those each engine declares for its own settings (llama.cpp's KV cache type
    follows the precision, vLLM's arguments follow its scheduler axes), and the field that
    proves the axis ran (it records the axis's own value)."""
    return (*AXES[axis].provenance, *axis_provenance(axis))


class ComparabilityError(ValueError):
    pass


def check_comparable(meta_a: dict, meta_b: dict, axis: str, path_a: Any, path_b: Any) -> None:
    """Raise naming both files and the first differing field unless the two cells differ
    only in `axis`."""
    cell_a, cell_b = meta_a.get("cell", {}), meta_b.get("cell", {})
    differing_axes = sorted(k for k in set(cell_a) | set(cell_b) if cell_a.get(k) != cell_b.get(k))
    if differing_axes != [axis]:
        raise ComparabilityError(
            f"{path_a} and {path_b} differ in axes {differing_axes}, expected exactly [{axis!r}]")
    flat_a = {k: v for k, v in flatten_provenance(meta_a).items() if k.split(".")[0] not in _FREE_FIELDS}
    flat_b = {k: v for k, v in flatten_provenance(meta_b).items() if k.split(".")[0] not in _FREE_FIELDS}
    allowed = {f"settings.cell.{axis}", *_allowed_fields(axis)}
    for key in sorted(set(flat_a) | set(flat_b)):
        if any(key == p or key.startswith(p + ".") for p in allowed):
            continue
        if flat_a.get(key) != flat_b.get(key):
            raise ComparabilityError(
                f"{path_a} and {path_b} are not comparable on axis {axis!r}: provenance field "
                f"{key!r} differs ({flat_a.get(key)!r} vs {flat_b.get(key)!r})")


def _shared_topk_max_delta(ids_a: np.ndarray, logits_a: np.ndarray, ids_b: np.ndarray,
                           logits_b: np.ndarray) -> np.ndarray:
    """Per step, max |Δlogit| over token ids present in both top-k lists (nan if none)."""
    same = ids_a[:, :, None] == ids_b[:, None, :]
    delta = np.abs(logits_a[:, :, None].astype(np.float64) - logits_b[:, None, :].astype(np.float64))
    delta = np.where(same, delta, -np.inf).max(axis=(1, 2))
    return np.where(np.isinf(delta), np.nan, delta)


def _steps(col: pa.ChunkedArray, i: int, k: int) -> np.ndarray:
    values = col[i].values.flatten().to_numpy(zero_copy_only=False)
    return values.reshape(-1, k)


def scores_of(meta: dict) -> str:
    """What a cell's top-k scores are: raw logits (every local engine), or what a live
    endpoint's cell recorded (logprobs, raw_logits, none)."""
    return str((meta.get("engine") or {}).get("scores", "raw_logits"))


# The per-prompt table of a pair file: a file without one of these was made by an earlier
# tokenflip and is made again (the compare rule's params name them, so Snakemake reruns it).
PER_PROMPT_COLUMNS = (
    "prompt_id", "identical", "first_div_step", "steps_compared", "steps_logit_diff", "n_tokens_a", "n_tokens_b",
    "logit_diff_before_div", "max_abs_dlogit_before_div", "dlogit_at_div", "margin_a_at_div",
    "margin_b_at_div", "rms_dlogit_before_div", "mean_margin_a", "mean_margin_b", "near_ties_a",
    "top_logit_a_at_div", "top_logit_b_at_div", "cause", "rejoin_step",
    "correct_a", "correct_b", "verdict_a", "verdict_b", "extracted_a", "extracted_b", "same_answer")


def compare_tables(a: pa.Table, b: pa.Table, k: int, logits: bool = True, precisions: tuple[str, str] | None = None,
                   greedy: bool = True) -> pa.Table:
    """Per-prompt comparison of two cell tables (rows matched by prompt id); `logits`: the
    two cells' scores are of one kind (else their differences are not computed);
    `precisions`: what each side's raw logits were computed in (None: not raw logits), and
    `greedy`: both decoded greedily, for the label of each divergence (`causes`)."""
    index_b = {pid: i for i, pid in enumerate(b.column("prompt_id").to_pylist())}
    rows: dict[str, list] = {name: [] for name in PER_PROMPT_COLUMNS}
    ids_a_col, logit_a_col = a.column("top_ids"), a.column("top_logits")
    ids_b_col, logit_b_col = b.column("top_ids"), b.column("top_logits")
    for i, pid in enumerate(a.column("prompt_id").to_pylist()):
        if pid not in index_b:
            raise ComparabilityError(f"prompt {pid!r} is in one cell but not the other")
        j = index_b[pid]
        tok_a = np.asarray(a.column("token_ids")[i].as_py(), dtype=np.int64)
        tok_b = np.asarray(b.column("token_ids")[j].as_py(), dtype=np.int64)
        n = min(len(tok_a), len(tok_b))
        mismatch = np.nonzero(tok_a[:n] != tok_b[:n])[0]
        identical = len(tok_a) == len(tok_b) and mismatch.size == 0
        first_div = None if identical else int(mismatch[0]) if mismatch.size else n
        # Steps up to and including the divergence step share their context, so their
        # logits are comparable; after it the two runs condition on different tokens.
        shared = n if first_div is None else min(first_div + 1, n)
        top_ids_a, top_logits_a = _steps(ids_a_col, i, k), _steps(logit_a_col, i, k)
        top_ids_b, top_logits_b = _steps(ids_b_col, j, k), _steps(logit_b_col, j, k)
        delta = _shared_topk_max_delta(top_ids_a[:shared], top_logits_a[:shared], top_ids_b[:shared],
                                       top_logits_b[:shared]) if logits else np.full(shared, np.nan)
        before = delta if first_div is None else delta[:first_div]
        max_before = float(np.nanmax(before)) if before.size and not np.all(np.isnan(before)) else 0.0
        at_div = first_div is not None and first_div < n
        margin_a = a.column("margin")[i].as_py()
        margin_b = b.column("margin")[j].as_py()
        ex_a, ex_b = a.column("extracted")[i].as_py(), b.column("extracted")[j].as_py()
        rows["prompt_id"].append(pid)
        rows["identical"].append(identical)
        rows["first_div_step"].append(first_div)
        rows["steps_compared"].append(shared)
        rows["steps_logit_diff"].append(int(np.sum(np.nan_to_num(before) > 0)) if logits else None)
        rows["n_tokens_a"].append(len(tok_a))
        rows["n_tokens_b"].append(len(tok_b))
        rows["logit_diff_before_div"].append(max_before > 0 if logits else None)
        rows["max_abs_dlogit_before_div"].append(max_before if logits else None)
        rows["dlogit_at_div"].append(float(delta[first_div]) if at_div else None)
        rows["margin_a_at_div"].append(float(margin_a[first_div]) if at_div else None)
        rows["margin_b_at_div"].append(float(margin_b[first_div]) if at_div else None)
        finite = before[~np.isnan(before)]
        rows["rms_dlogit_before_div"].append(float(np.sqrt(np.mean(finite ** 2))) if finite.size else None)
        rows["mean_margin_a"].append(float(np.mean(margin_a)) if margin_a else None)
        rows["mean_margin_b"].append(float(np.mean(margin_b)) if margin_b else None)
        rows["near_ties_a"].append(int(np.sum(np.asarray(margin_a) < NEAR_TIE)))
        tops = ((float(top_logits_a[first_div, 0]), float(top_logits_b[first_div, 0]))
                if at_div and precisions else (None, None))
        rows["top_logit_a_at_div"].append(tops[0])
        rows["top_logit_b_at_div"].append(tops[1])
        chose_top = ((int(tok_a[first_div]) == int(top_ids_a[first_div, 0]),
                      int(tok_b[first_div]) == int(top_ids_b[first_div, 0])) if at_div else (True, True))
        rows["cause"].append(None if identical else causes.cause(
            (rows["margin_a_at_div"][-1], rows["margin_b_at_div"][-1]), tops, precisions or ("fp32", "fp32"),
            chose_top, ended=not at_div, greedy=greedy, logits=bool(precisions)))
        rows["rejoin_step"].append(None if identical or not at_div else
                                   causes.rejoin_step(tok_a.tolist(), tok_b.tolist(), first_div))
        rows["correct_a"].append(a.column("correct")[i].as_py())
        rows["correct_b"].append(b.column("correct")[j].as_py())
        rows["verdict_a"].append(a.column("verdict")[i].as_py())
        rows["verdict_b"].append(b.column("verdict")[j].as_py())
        rows["extracted_a"].append(ex_a)
        rows["extracted_b"].append(ex_b)
        # Identical completions agree by definition; otherwise the extracted answers decide
        # (two completions that both give no answer agree on having none). For code the
        # execution outcome is the answer (arXiv 2609.26621 §8.2: "execution outcomes agree
        # on 97.6% of problems while token sequences agree on 26.2%"), not the code's text.
        verdicts = rows["verdict_a"][-1], rows["verdict_b"][-1]
        if set(verdicts) <= CODE_VERDICTS:
            same = rows["correct_a"][-1] == rows["correct_b"][-1] and None not in (rows["correct_a"][-1],
                                                                                  rows["correct_b"][-1])
        else:
            same = ex_a == ex_b
        rows["same_answer"].append(identical or same)
    return pa.table(rows)


def summarize(per_prompt: pa.Table, tests: bool = True) -> dict[str, Any]:
    """Pair-level numbers: divergence rate with a Wilson 95% interval, first-divergence
    steps, logit drift, accuracy of both sides and an exact McNemar test. `tests=False`
    (a comparison job's own file): without the interval and the test, which the run's
    summary derives from the per-prompt table in one process (statsmodels takes two seconds
    of CPU to import, more than the rest of a comparison)."""
    df = per_prompt.to_pandas()
    n = len(df)
    diverged = int((~df["identical"]).sum())
    lo, hi = statistics.wilson(diverged, n) if tests else (None, None)
    first = df["first_div_step"].dropna()
    # A prompt that either side could not score (a sandbox failure: `correct` is null) is
    # counted apart, and left out of the accuracies and the paired test.
    scored = df["correct_a"].notna() & df["correct_b"].notna()
    acc_a = df.loc[scored, "correct_a"].astype(bool)
    acc_b = df.loc[scored, "correct_b"].astype(bool)
    n_scored = int(scored.sum())
    # Logit figures only where the two cells' scores were of one kind (else the column is null).
    logits = bool(df["logit_diff_before_div"].notna().any())
    nonequiv = int(df["logit_diff_before_div"].fillna(False).astype(bool).sum())
    return {
        "n_prompts": n,
        "n_diverged": diverged,
        "divergence_rate": diverged / n if n else float("nan"),
        "divergence_ci_low": lo,
        "divergence_ci_high": hi,
        "n_logit_diff_before_div": nonequiv if logits else float("nan"),
        "logit_diff_rate": nonequiv / n if n and logits else float("nan"),
        "step_logit_diff_rate": _ratio(df["steps_logit_diff"].sum(),
                                       (df["first_div_step"].fillna(df["steps_compared"])).sum())
        if logits else float("nan"),
        "max_abs_dlogit": float(df["max_abs_dlogit_before_div"].max()) if n and logits else float("nan"),
        "mean_first_div_step": float(first.mean()) if len(first) else float("nan"),
        "median_first_div_step": float(first.median()) if len(first) else float("nan"),
        "n_scored": n_scored,
        "n_unscored": n - n_scored,
        "accuracy_a": float(acc_a.mean()) if n_scored else float("nan"),
        "accuracy_b": float(acc_b.mean()) if n_scored else float("nan"),
        "mcnemar_p": statistics.mcnemar_exact(acc_a.to_numpy(), acc_b.to_numpy()) if tests else None,
        "semantic_agreement": float(df["same_answer"].mean()) if n else float("nan"),
        "exact_agreement": (n - diverged) / n if n else float("nan"),
        "mean_margin_at_div": float(df["margin_a_at_div"].mean()) if diverged else float("nan"),
        "mean_margin_agreed": float(df.loc[df["identical"], "mean_margin_a"].mean())
        if (n - diverged) else float("nan"),
        # arXiv 2609.26621 §I.3 gives medians (0.039 at divergence vs 5.733 on agreeing prompts).
        "median_margin_at_div": float(df["margin_a_at_div"].median()) if diverged else float("nan"),
        "median_margin_agreed": float(df.loc[df["identical"], "mean_margin_a"].median())
        if (n - diverged) else float("nan"),
        # Not the paper's σz (a per-logit RMS over the whole vocabulary, which needs full
        # logits: the precision probe records it): the RMS, over the steps before the
        # divergence, of each step's largest |Δlogit| among the tokens in both top-k lists.
        "rms_max_shared_dlogit": float(np.sqrt(np.nanmean(df["rms_dlogit_before_div"].astype(float) ** 2)))
        if df["rms_dlogit_before_div"].notna().any() else float("nan"),
        "near_tie_rate_a": _ratio(df["near_ties_a"].sum(), df["n_tokens_a"].sum()),
        "mean_margin_a": float(df["mean_margin_a"].mean()) if n else float("nan"),
        "mean_cascade_length": float((df["n_tokens_a"] - df["first_div_step"]).dropna().mean())
        if diverged else float("nan"),
        "n_length_differs": int((df["n_tokens_a"] != df["n_tokens_b"]).sum()),
        "mean_abs_length_diff": float((df["n_tokens_a"] - df["n_tokens_b"]).abs()[~df["identical"]].mean())
        if diverged else float("nan"),
        # Figure 1 of arXiv 2609.26621 gives the maximum beside the mean (236 vs 34 tokens).
        "max_abs_length_diff": int((df["n_tokens_a"] - df["n_tokens_b"]).abs()[~df["identical"]].max())
        if diverged else 0,
        "n_correctness_flips": int((acc_a != acc_b).sum()),
        # Each divergence's label (`causes`), whether the texts came together again, and
        # whether the final answers differ (for code, the execution outcome).
        **{cause_column(c): int((df["cause"] == c).sum()) for c in causes.CAUSES},
        "n_rejoined": int(df["rejoin_step"].notna().sum()),
        "n_answer_differs": int((~df["identical"] & ~df["same_answer"].astype(bool)).sum()),
    }


def cause_column(cause: str) -> str:
    """The summary column counting one label: "near-tie" -> n_near_tie."""
    return "n_" + cause.replace("-", "_").replace(" ", "_")


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den else float("nan")


def _prompt_counts_aside(meta: dict) -> dict:
    """A cell made in blocks without what its rounds decided: how many prompts and blocks it
    holds (two cells of one study may hold different numbers; `prompts_both_have`)."""
    if not meta.get("blocks"):
        return meta
    bench = {k: v for k, v in meta.get("benchmark", {}).items() if k not in ("n", "n_requested")}
    observed = {k: v for k, v in meta.get("observed", {}).items() if k != "prompts"}
    return {**{k: v for k, v in meta.items() if k != "blocks"}, "benchmark": bench, "observed": observed}


def prompts_both_have(a: pa.Table, b: pa.Table, meta_a: dict, meta_b: dict) -> tuple[pa.Table, pa.Table]:
    """Two cells made in rounds hold the blocks their comparisons needed: a comparison reads
    the first prompts both have (the one with more holds the other's as its first)."""
    n = min(a.num_rows, b.num_rows)
    if a.num_rows == b.num_rows or not (meta_a.get("blocks") and meta_b.get("blocks")):
        return a, b
    a, b = a.slice(0, n), b.slice(0, n)
    if a.column("prompt_id").to_pylist() != b.column("prompt_id").to_pylist():
        raise ComparabilityError("the two cells' first prompts differ: their blocks are not of one benchmark order")
    return a, b


def compare_files(pair: Pair, path_a: str | Path, path_b: str | Path, out_path: str | Path) -> dict[str, Any]:
    """Compare two cell files and write the per-prompt table with the pair summary."""
    table_a, meta_a = storage.read_cell(path_a)
    table_b, meta_b = storage.read_cell(path_b)
    for path, meta, cell in ((path_a, meta_a, pair.a), (path_b, meta_b, pair.b)):
        if meta.get("cell_id") != cell.id:
            raise ComparabilityError(f"{path}: holds cell {meta.get('cell_id')!r}, but pair {pair.id!r} "
                                     f"expects {cell.id!r} there")
    check_comparable(*map(_prompt_counts_aside, (meta_a, meta_b)), pair.axis, path_a, path_b)
    table_a, table_b = prompts_both_have(table_a, table_b, meta_a, meta_b)
    k = int(meta_a["settings"]["record_top_k"])
    kinds = scores_of(meta_a), scores_of(meta_b)
    # A logprob is never compared with a logit: logit differences only between two cells
    # whose scores are of one kind; margins (the same in both where nothing acts on them
    # between the model and the report) and tokens always.
    same_kind = kinds[0] == kinds[1] != "none"
    greedy = all(m["settings"]["decoding"].get("strategy") == "greedy" for m in (meta_a, meta_b))
    precisions = (causes.logits_precision(meta_a), causes.logits_precision(meta_b)) \
        if kinds == ("raw_logits", "raw_logits") else None
    per_prompt = compare_tables(table_a, table_b, k, logits=same_kind, precisions=precisions, greedy=greedy)
    summary = {k: v for k, v in summarize(per_prompt, tests=False).items() if v is not None}
    metadata = {
        "kind": "pair",
        "pair": {"id": pair.id, "label": pair.label, "axis": pair.axis,
                 "a": pair.a.as_dict(), "b": pair.b.as_dict(), "context": pair.context},
        "cells": {"a": meta_a["cell_id"], "b": meta_b["cell_id"]},
        "digests": {"a": meta_a["token_stream_sha256"], "b": meta_b["token_stream_sha256"]},
        "machines": {side: m["environment"]["device"]["name"] for side, m in (("a", meta_a), ("b", meta_b))},
        "scores": {"a": kinds[0], "b": kinds[1]},
        "summary": summary,
    }
    storage.write_table(per_prompt, out_path, metadata)
    return metadata
