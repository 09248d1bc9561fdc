"""What the papers rows need to know: the papers' models, a study's labels (`Study`), the
summary tables (`Tables`), the frames derived from them, and what a row is (`Row`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

from tokenflip.report.paper.formats import _pct, _words
from tokenflip.run.interventions import is_no_intervention

KV = "arXiv 2604.15409 (KV cache, FP16)"


PRECISION = "arXiv 2609.26621 (BF16 vs FP16)"


# The papers' models, by what their hub ids (or config names) contain, case-insensitive.
PAPER_MODELS = {
    "TinyLlama": r"tinyllama.*1\.1b",
    "Llama-3.2-3B": r"llama-?3\.2-3b",
    "Qwen2.5-1.5B": r"qwen-?2\.5-1\.5b",
    "Qwen2.5-3B": r"qwen-?2\.5-3b",
    "Qwen2.5-7B": r"qwen-?2\.5-7b",
    "Mistral-7B": r"mistral-7b",
    "OLMoE": r"olmoe",
    "DS-R1-Qwen-1.5B": r"r1-distill-qwen-1\.5b",
    "DS-R1-Qwen-7B": r"r1-distill-qwen-7b",
    "LLaMA-2-7B": r"llama-?2-7b",
    "Mistral-7B-v0.3": r"mistral-7b-v0\.3",
    "Gemma-2-2B": r"gemma-?2-2b",
}


KV_MODELS = ("LLaMA-2-7B", "Mistral-7B-v0.3", "Gemma-2-2B")


# §6.5: reasoning-tuned against instruction-tuned at matched scale.
MATCHED = (("1.5B", "DS-R1-Qwen-1.5B", "Qwen2.5-1.5B"), ("7B", "DS-R1-Qwen-7B", "Qwen2.5-7B"))


def paper_models(name: str, identity: str) -> set[str]:
    """The paper models a run's model is (by its config name and its hub id or file)."""
    text = f"{name} {identity}".lower()
    return {key for key, pattern in PAPER_MODELS.items() if re.search(pattern, text)}


@dataclass(frozen=True)
class Study:
    """What the rows need from the config: each model's identity (hub id, local path or
    file), each benchmark's kind and prompt format, and which labels are greedy decoding,
    no intervention, the paper's C (gated FP32 head) and its B with K = 8."""

    identity: dict[str, str] = field(default_factory=dict)
    kind: dict[str, str] = field(default_factory=dict)
    format: dict[str, str] = field(default_factory=dict)
    greedy: frozenset = frozenset({"greedy"})
    none: frozenset = frozenset({"none"})
    c_labels: frozenset = frozenset()
    b8_labels: frozenset = frozenset()

    @classmethod
    def of(cls, config: dict[str, Any]) -> "Study":
        models, benches = config.get("models", {}), config.get("benchmarks", {})
        interventions = config.get("interventions", {})
        return cls(
            identity={m: str(s.get("id") or s.get("path") or s.get("file") or m) for m, s in models.items()},
            kind={b: str(s.get("kind", b)) for b, s in benches.items()},
            format={b: str(s.get("format", "chat")) for b, s in benches.items()},
            greedy=frozenset(d for d, s in config.get("decoding", {"greedy": {"strategy": "greedy"}}).items()
                             if s.get("strategy") == "greedy"),
            none=frozenset(i for i, s in interventions.items() if is_no_intervention(s)) or frozenset({"none"}),
            c_labels=frozenset(gated_c_labels(config)),
            b8_labels=frozenset(i for i, s in interventions.items()
                                if s.get("kind") == "topk_fp32" and s.get("top_k", 8) == 8))


def gated_c_labels(config: dict[str, Any]) -> set[str]:
    """The config's names for the paper's intervention C (whole LM head in FP32, gated, the
    head alone: a broader scope is §7.6's other experiment)."""
    return {name for name, spec in config.get("interventions", {}).items()
            if spec.get("kind") == "fp32_head" and spec.get("gated", True) and spec.get("scope", "head") == "head"}


@dataclass
class Tables:
    """The summary tables the rows read (empty where a stage or probe did not run)."""

    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)
    interventions: pd.DataFrame = field(default_factory=pd.DataFrame)
    first_divergence: pd.DataFrame = field(default_factory=pd.DataFrame)
    cells: pd.DataFrame = field(default_factory=pd.DataFrame)
    kv_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    kv_layers: pd.DataFrame = field(default_factory=pd.DataFrame)
    kv_patching: pd.DataFrame = field(default_factory=pd.DataFrame)
    precision_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    grafting: pd.DataFrame = field(default_factory=pd.DataFrame)
    lens: pd.DataFrame = field(default_factory=pd.DataFrame)


def _bf16_vs_fp16(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of a precision-probe table whose pair is BF16 and FP16, either way round."""
    if frame.empty or "a" not in frame:
        return frame
    return frame[((frame["a"] == "bf16") & (frame["b"] == "fp16")) | ((frame["a"] == "fp16") & (frame["b"] == "bf16"))]


def graft_ends(grafting: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per grafting row, the precision grafted into and the one grafted from ("b→a": b's
    state into a's run)."""
    forward = grafting["direction"] == "b→a"
    return grafting["a"].where(forward, grafting["b"]), grafting["b"].where(forward, grafting["a"])


def _last_layer(frame: pd.DataFrame) -> pd.Series:
    """Rows at their model's last layer (models differ in depth)."""
    return frame["layer"] == frame.groupby("model")["layer"].transform("max")


def traced_steps(steps: pd.DataFrame, lens: pd.DataFrame) -> pd.DataFrame:
    """The steps the precision probe traced, one per prompt (App. III, App. XII: a Diverged
    prompt at its first flip, an Agreed one at the step its lens was read), with the
    group: the population of App. XII's decision rule and body projection."""
    if steps.empty or lens.empty:
        return pd.DataFrame()
    keys = [k for k in ("model", "benchmark", "a", "b", "prompt_id", "step") if k in steps and k in lens]
    traced = lens.loc[lens["group"].isin(["diverged", "agreed"]), keys + ["group"]].drop_duplicates()
    return steps.merge(traced, on=keys)


def first_divergences(tables: Tables) -> pd.DataFrame:
    """Per-prompt first divergence steps with their pair's settings (to select by) and the
    pair's prompt count (for shares over all its prompts, diverged or not)."""
    pairs, first = tables.pairs, tables.first_divergence
    if pairs.empty or first.empty:
        return pd.DataFrame()
    settings = pairs[pairs["status"] == "done"].drop(columns=["label", "axis", "context", "model", "benchmark"],
                                                      errors="ignore")
    return first.merge(settings, on="pair_id")


SOURCES = {"pairs": "pairs", "interventions": "intervention vs none", "first_divergence": "diverged prompts",
           "cells": "cells", "kv_steps": "KV-cache probe", "kv_layers": "KV-cache probe", "kv_patching": "KV-cache probe",
           "precision_steps": "precision probe BF16 vs FP16", "traced_steps": "precision probe's traced steps",
           "lens": "precision probe's logit lens", "grafting": "precision probe's grafts"}


FRAMES: dict[str, Callable[[Tables], pd.DataFrame]] = {
    "pairs": lambda t: t.pairs[t.pairs["status"] == "done"] if not t.pairs.empty else t.pairs,
    "interventions": lambda t: (t.interventions[t.interventions["status"] == "done"]
                                if not t.interventions.empty else t.interventions),
    "first_divergence": first_divergences,
    "cells": lambda t: t.cells[t.cells["status"] == "done"] if not t.cells.empty else t.cells,
    "kv_steps": lambda t: t.kv_steps,
    "kv_layers": lambda t: t.kv_layers,
    "kv_patching": lambda t: t.kv_patching,
    "precision_steps": lambda t: _bf16_vs_fp16(t.precision_steps),
    "traced_steps": lambda t: traced_steps(_bf16_vs_fp16(t.precision_steps), _bf16_vs_fp16(t.lens)),
    "lens": lambda t: _bf16_vs_fp16(t.lens),
    "grafting": lambda t: _bf16_vs_fp16(t.grafting),
}


@dataclass(frozen=True)
class Row:
    """One claim of a paper and how this run's figure for it is computed.

    `source`: a frame of FRAMES. `select`: column → value (a tuple: any of these; ANY: lift
    the axis's default; "between": the two values of a pair's axis, either order).
    `models` / `benchmarks`: the paper's models (PAPER_MODELS keys) and benchmark kinds,
    () for any; `exclude`: model patterns the paper left out; `bare`: only bare-prompt
    benchmarks (arXiv 2609.26621 §2 scores "under bare prompts"). `value(rows)` is the
    statistic over one group's rows; `by`: the columns the paper gives its figure per
    (() pooled); `show`: "each" (one figure per group) or "range" (min–max over groups)."""

    paper: str
    claim: str
    figure: str
    conditions: str
    source: str
    value: Callable[[pd.DataFrame], Any]
    fmt: Callable[[Any], str] = _pct
    select: dict = field(default_factory=dict)
    models: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    benchmarks: tuple[str, ...] = ()
    bare: bool = False
    by: tuple[str, ...] = ("model",)
    show: str = "each"
    detail: Callable[[pd.DataFrame], str] | None = None
    # A figure no probe of this tool measures: why, in place of a number.
    unmeasured: str = ""
    # Whether another benchmark may stand in for the row's (not where the benchmark is the
    # claim: MATH-500's longer chains, App. VII).
    stand_in: bool = True
    # A statistic over several models at once (§6.5's matched pairs): rows → {group: value}.
    across: Callable[[pd.DataFrame, "Study"], dict[str, Any]] | None = None

    def population(self) -> str:
        """The row's population in words (for the README and the report)."""
        parts = [SOURCES[self.source], ", ".join(self.models) if self.models else "every model"]
        if self.exclude:
            parts.append("without " + ", ".join(self.exclude))
        parts.append(", ".join(self.benchmarks) if self.benchmarks else "every benchmark")
        if self.bare:
            parts.append("bare prompts")
        select = dict(self.select)
        between, axis = select.pop("between", None), select.pop("axis", None)
        fixed = [f"{axis} {between[0]} vs {between[1]}" if between else (f"{axis} pairs" if axis else "")]
        fixed += [f"{k} {_words(v)}" for k, v in select.items()]
        parts.append(", ".join(x for x in fixed if x))
        by = {"each": "per " + (" × ".join(self.by) or "run"), "range": "range over " + " × ".join(self.by)}
        return ", ".join(p for p in parts if p) + f"; {by[self.show]}"
