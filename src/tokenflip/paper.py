"""The papers' figures beside this run's, each computed over the paper's own population.

Every row is data (`ROWS`): the claim, the paper's figure with its section, which summary
table it reads, which results count (axis values, the paper's models and benchmarks, the
models it left out) and the statistic, given per group (one model's figure, or a range
over models) as the paper gives it. One function (`comparison_rows`) computes them all.

Populations: a result enters a row only with every axis the row does not name at its
default (cache on, batch size 1, greedy, no intervention, default kernel, threads,
determinism, not a repeat): a `repeat` cell (§6.1) or an eager-attention cell is never a
second sample of the BF16-vs-FP16 rows. A row about named models (σz on TinyLlama) uses
those models where the run has them; where it has none of them, every model of the run
gets its own figure, labelled with what it stands in for ("smollm2-135m, in place of
TinyLlama"), never one number pooled over models the paper kept apart. Benchmarks alike.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from .plan import plain_values

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
ANY = object()  # a select value that lifts an axis's default: every value counts


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
            none=frozenset(i for i, s in interventions.items() if s.get("kind") == "none") or frozenset({"none"}),
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


# ---------------------------------------------------------------------------- formatting

def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _pct(x: float) -> str:
    return "–" if _missing(x) else f"{100 * x:.0f}%"


def _num(x: float) -> str:
    return "–" if _missing(x) else f"{x:.3g}"


def _pp(x: float) -> str:
    return "–" if _missing(x) else f"{100 * x:+.0f} pp"


def _power(x: float) -> str:
    if _missing(x):
        return "–"
    return "FP32 KL is 0" if math.isinf(x) else f"10^{math.log10(x):.1f}"


def _both(fmt: Callable[[Any], str], sep: str = " vs ") -> Callable[[tuple], str]:
    return lambda pair: sep.join(fmt(x) for x in pair)


# ---------------------------------------------------------------------------- derived frames

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


# ---------------------------------------------------------------------------- rows

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


def _words(value: Any) -> str:
    if value is ANY:
        return "any"
    if isinstance(value, (tuple, list, set, frozenset)):
        return " / ".join(sorted(map(str, value)))
    return str(value)


def _rate(rows: pd.DataFrame) -> float:
    return rows["n_diverged"].sum() / rows["n_prompts"].sum()


def _pairs_detail(rows: pd.DataFrame) -> str:
    return f"{len(rows)} pair(s), n = {int(rows['n_prompts'].sum())}"


def _on_better(rows: pd.DataFrame) -> str:
    on = rows["accuracy_a"].where(rows["a"] == "on", rows["accuracy_b"])
    off = rows["accuracy_b"].where(rows["a"] == "on", rows["accuracy_a"])
    return f"{int((on > off).sum())} of {len(rows)}"


def _kl_ratio(rows: pd.DataFrame) -> float:
    med = rows.groupby("precision")["kl"].median()
    return math.inf if med["fp32"] == 0 else float(med["fp16"] / med["fp32"])


def _first_layer_share(rows: pd.DataFrame) -> float:
    """KV-cache paper, Fig. 2: how much of the last layer's drift the first layer already
    shows (1: all at once, "sharp at the first layer"; near 1/L: "uniform accumulation"),
    the median over steps of L2(first layer) / L2(last layer)."""
    first = rows[rows["layer"] == rows["layer"].min()].set_index("step")["l2"]
    last = rows[rows["layer"] == rows["layer"].max()].set_index("step")["l2"]
    ratio = (first / last)[last > 0]
    return float(ratio.median()) if len(ratio) else float("nan")


def _patching(rows: pd.DataFrame) -> tuple[float, float]:
    med = rows.groupby("kind")["kl_recovered"].median()
    return float(med["residual stream"]), float(med["kv cache"])


def _share_from(step: Callable[[pd.Series], pd.Series]) -> Callable[[pd.DataFrame], float]:
    """Share of all the pairs' prompts (diverged or not) whose first divergence step passes."""
    def share(rows: pd.DataFrame) -> float:
        n = rows.drop_duplicates("pair_id")["n_prompts"].sum()
        return float(step(rows["first_div_step"]).sum() / n)
    return share


def _rms_sigma(rows: pd.DataFrame) -> float:
    return float((rows["sigma_z"] ** 2).mean() ** 0.5)


def _lens_margin(rows: pd.DataFrame, group: str) -> float:
    return float(rows.loc[rows["group"] == group, "margin_a"].median())


def _final_margins(rows: pd.DataFrame) -> tuple[float, float]:
    last = rows[_last_layer(rows)]
    return _lens_margin(last, "diverged"), _lens_margin(last, "agreed")


def _margin_trend(rows: pd.DataFrame) -> str:
    top, bottom = rows[rows["layer"] == rows["layer"].min()], rows[_last_layer(rows)]
    return (f"{_num(_lens_margin(top, 'diverged'))} → {_num(_lens_margin(bottom, 'diverged'))}; "
            f"{_num(_lens_margin(top, 'agreed'))} → {_num(_lens_margin(bottom, 'agreed'))}")


def _body_agreement(rows: pd.DataFrame) -> str:
    div = rows[(rows["group"] == "diverged") & ~_last_layer(rows)]
    per_layer = div.groupby("layer")["top1_agree"].mean()
    if per_layer.empty:
        raise ValueError("no Diverged prompt")
    return f"{_pct(float(per_layer.min()))}–{_pct(float(per_layer.max()))}"


def _first_token(rows: pd.DataFrame) -> str:
    last = rows[(rows["group"] == "first_token") & _last_layer(rows)]
    if last.empty:
        raise ValueError("no first-token lens")
    return f"{_pct(float(last['top1_agree'].mean()))}, mean margin {_num(float(last['margin_a'].mean()))}"


def _head_share(rows: pd.DataFrame) -> float:
    head, body = (rows["sigma_z_head"] ** 2).sum(), (rows["sigma_z_body"] ** 2).sum()
    return float(head / (head + body))


def _graft(site: str, into: str, source: str, layer: str | None = None) -> Callable[[pd.DataFrame], float]:
    def fixed(rows: pd.DataFrame) -> float:
        target, origin = graft_ends(rows)
        rows = rows[(target == into) & (origin == source) & (rows["site"] == site)]
        if layer == "last":
            rows = rows[_last_layer(rows)]
        elif layer == "body":
            rows = rows[~_last_layer(rows)]
        return float(rows["fixed"].mean()) if len(rows) else float("nan")
    return fixed


def _body_rule(rows: pd.DataFrame) -> float:
    """App. XII's directional decision rule: a flip is predicted where the body's part of
    the perturbation between a's top two tokens exceeds a's margin. (The whole measured
    perturbation, head included, decides the flip exactly by construction, z_b = z_a + Δ:
    not a test of anything.)"""
    predicted = rows["directional_body"] > rows["margin_a"]
    return float((predicted == rows["flip"].astype(bool)).mean())


def _rms_rule(rows: pd.DataFrame) -> float:
    """§7.1's practical RMS-scale trigger, "heuristic rather than an exact bound": a flip is
    predicted where the margin is below the typical size of the difference of two logits'
    perturbations, √2·σz (each logit moves by about σz, independently)."""
    predicted = rows["margin_a"] < math.sqrt(2) * rows["sigma_z"]
    return float((predicted == rows["flip"].astype(bool)).mean())


def _traced_detail(rows: pd.DataFrame) -> str:
    counts = rows["group"].value_counts()
    return (f"{counts.get('diverged', 0)} Diverged + {counts.get('agreed', 0)} Agreed traced step(s), "
            f"{int(rows['flip'].sum())} flip(s)")


def _body_projection(rows: pd.DataFrame) -> str:
    from scipy.stats import mannwhitneyu

    div, agr = rows[rows["group"] == "diverged"], rows[rows["group"] == "agreed"]
    if div.empty or agr.empty:
        raise ValueError("one group is empty")
    body_d, body_a = div["directional_body"].abs(), agr["directional_body"].abs()
    p = float(mannwhitneyu(body_d, body_a, alternative="two-sided").pvalue)
    return (f"{_num(float(body_d.median()))} vs {_num(float(body_a.median()))} (Mann–Whitney p = {p:.2g}); "
            f"margins {_num(float(div['margin_a'].median()))} vs {_num(float(agr['margin_a'].median()))}")


def _lift(rows: pd.DataFrame) -> float:
    return float(np.average(rows["lift"], weights=rows["n"]))


def _overhead(rows: pd.DataFrame) -> float:
    return float(rows["overhead"].max())


def _ear(rows: pd.DataFrame) -> float:
    return 1 - _rate(rows)


def _matched_pairs(rows: pd.DataFrame, study: Study) -> dict[str, Any]:
    """§6.5: per matched scale, the instruction-tuned model's EAR minus the reasoning-tuned
    one's (BF16 vs FP16, pooled over benchmarks) and the ratio of their gated-C trigger
    rates (from the C cells, where the run has them)."""
    by_paper: dict[str, str] = {}
    for model in rows["model"].unique():
        for key in paper_models(model, study.identity.get(model, model)):
            by_paper.setdefault(key, model)
    out = {}
    for scale, reasoning, instruct in MATCHED:
        r, i = by_paper.get(reasoning), by_paper.get(instruct)
        if r is None or i is None:
            continue
        pr, pi = rows[rows["model"] == r], rows[rows["model"] == i]
        out[f"{scale}: {r} vs {i}"] = f"{_pp(_ear(pi) - _ear(pr))[1:]} lower EAR"
    return out


def _cost_per_trigger(rows: pd.DataFrame, study: Study) -> dict[str, Any]:
    """§4.2: the extra compute of an intervention per step it fired on, (seconds per token
    with it − without) / trigger rate, for C (the whole head in FP32) over B with K = 8,
    per model × benchmark × precision that has all three cells."""
    out = {}
    for key, g in rows.groupby(["model", "benchmark", "precision"], sort=True):
        per = g.set_index("intervention")
        base = per.loc[per.index.isin(study.none), "seconds_per_token"]
        costs = {}
        for name, labels in (("B", study.b8_labels), ("C", study.c_labels)):
            hit = per.loc[per.index.isin(labels)]
            if len(base) and len(hit) and float(hit["trigger_rate"].iloc[0]) > 0:
                costs[name] = (float(hit["seconds_per_token"].iloc[0]) - float(base.iloc[0])) / float(
                    hit["trigger_rate"].iloc[0])
        if len(costs) == 2:
            out[" / ".join(map(str, key))] = (f"{costs['C'] / costs['B']:.3g}×" if costs["B"] > 0
                                              else "B's cost within the noise")
    return out


def _prompt_length(rows: pd.DataFrame) -> str:
    return f"up to {int(rows['max_prompt_tokens'].max())} tokens"


_TINY = ("TinyLlama",)
_TINY_QWEN = ("TinyLlama", "Qwen2.5-3B")
_BF16_FP16 = {"axis": "precision", "between": ("bf16", "fp16")}
_CODE_MATH = ("gsm8k", "humaneval", "mbpp")

ROWS: tuple[Row, ...] = (
    # arXiv 2604.15409: LLaMA-2-7B, Mistral-7B-v0.3, Gemma-2-2B on GSM8K (abstract, §4).
    Row(KV, "token divergence, cache ON vs OFF, FP16", "100%",
        "every condition: 3 base models × 3 decoding strategies, GSM8K (abstract, §4)", "pairs", _rate,
        select={"axis": "cache", "between": ("on", "off"), "precision": "fp16", "decoding": ANY},
        models=KV_MODELS, benchmarks=("gsm8k",), by=("model", "decoding"), show="range", detail=_pairs_detail),
    Row(KV, "token divergence, cache ON vs OFF, FP32", "0%", "3 models, GSM8K, the falsification control (§4)",
        "pairs", _rate, select={"axis": "cache", "between": ("on", "off"), "precision": "fp32", "decoding": ANY},
        models=KV_MODELS, benchmarks=("gsm8k",), show="range", detail=_pairs_detail),
    # Not the paper's engine: its FP16 condition and FP32 control run in llama.cpp on the model's
    # GGUF (KV cache F16, llama.cpp's default, or F32), beside the paper's PyTorch figures.
    Row(KV, "token divergence, cache ON vs OFF, FP16, in llama.cpp", "100% (PyTorch)",
        "the paper's FP16 condition (§4); here the model's GGUF in llama.cpp, F16 KV cache", "pairs", _rate,
        select={"axis": "cache", "between": ("on", "off"), "precision": "fp16", "engine": "llama.cpp",
                "decoding": ANY},
        models=KV_MODELS, benchmarks=("gsm8k",), by=("model", "decoding"), show="range", detail=_pairs_detail),
    Row(KV, "token divergence, cache ON vs OFF, FP32, in llama.cpp", "0% (PyTorch)",
        "the falsification control (§4); here in llama.cpp, F32 KV cache", "pairs", _rate,
        select={"axis": "cache", "between": ("on", "off"), "precision": "fp32", "engine": "llama.cpp",
                "decoding": ANY},
        models=KV_MODELS, benchmarks=("gsm8k",), show="range", detail=_pairs_detail),
    Row(KV, "cache ON more accurate", "8 of 9", "FP16 conditions: 3 models × 3 decoding strategies (abstract)",
        "pairs", _on_better, fmt=str,
        select={"axis": "cache", "between": ("on", "off"), "precision": "fp16", "decoding": ANY},
        models=KV_MODELS, benchmarks=("gsm8k",), by=(), detail=_pairs_detail),
    Row(KV, "FP32 shrinks the drift: median per-step KL, FP16 / FP32", "≈ 10^8", "3 models, Fig. 3",
        "kv_steps", _kl_ratio, fmt=_power, models=KV_MODELS, benchmarks=("gsm8k",),
        detail=lambda r: f"KV-cache probe, {r['prompt_id'].nunique()} prompt(s), {len(r)} step(s)"),
    Row(KV, "KL recovered: residual stream vs KV cache patch", "residual stream fails; KV cache recovers",
        "3 models, FP16, Fig. 5", "kv_patching", _patching, fmt=_both(_pct), select={"precision": "fp16"},
        models=KV_MODELS, benchmarks=("gsm8k",),
        detail=lambda r: f"median KL recovered, {int((r['kind'] == 'none').sum())} patched step(s)"),
    Row(KV, "layer drift: the first layer's share of the last layer's", "GQA (LLaMA-2, Mistral): sharp at the "
        "first layer; Gemma-2: uniform", "3 models, FP16, Fig. 2", "kv_layers", _first_layer_share, fmt=_num,
        select={"precision": "fp16"}, models=KV_MODELS, benchmarks=("gsm8k",),
        detail=lambda r: f"median over steps of L2(first layer) / L2(last layer), {r['step'].nunique()} step(s)"),

    # arXiv 2609.26621. §2: pass@1 and divergence under bare prompts.
    Row(PRECISION, "prompts whose greedy output differs, BF16 vs FP16", "49–100%",
        "6 models 1.1–7B × GSM8K, HumanEval, MBPP, A10G (abstract, §9)", "pairs", _rate, select=_BF16_FP16,
        benchmarks=_CODE_MATH, bare=True, by=("model", "benchmark"), show="range", detail=_pairs_detail),
    Row(PRECISION, "TinyLlama's divergence over the three benchmarks", "59–70%", "TinyLlama, §1, Table 2", "pairs",
        _rate, select=_BF16_FP16, models=_TINY, benchmarks=_CODE_MATH, bare=True, by=("model", "benchmark"),
        show="range", detail=_pairs_detail),
    Row(PRECISION, "median first divergence step", "34–50 tokens", "non-Qwen models, §6.2", "first_divergence",
        lambda r: float(r["first_div_step"].median()), fmt=_num, select=_BF16_FP16, exclude=("qwen",),
        benchmarks=_CODE_MATH, bare=True, show="range",
        detail=lambda r: f"median per model, {len(r)} diverged prompt(s)"),
    Row(PRECISION, "prompts diverging at the first token", "all", "Qwen2.5-7B-Instruct, §6.2", "first_divergence",
        _share_from(lambda s: s == 0), select=_BF16_FP16, models=("Qwen2.5-7B",), benchmarks=_CODE_MATH,
        bare=True),
    Row(PRECISION, "prompts diverging within the first 9 tokens", "86% (median step 6)",
        "DS-R1-Distill-Qwen-7B, App. V, Table 14", "first_divergence", _share_from(lambda s: s < 9),
        select=_BF16_FP16, models=("DS-R1-Qwen-7B",), benchmarks=_CODE_MATH, bare=True),
    Row(PRECISION, "within-precision repeat: exact agreement", "100%", "TinyLlama, BF16 and FP16, §6.1", "pairs",
        _ear, select={"axis": "repeat", "precision": ANY}, models=_TINY, by=("model", "precision"), show="range",
        detail=_pairs_detail),
    Row(PRECISION, "BF16 vs FP16 exact agreement, loose and strict determinism", "41%, under both",
        "TinyLlama, GSM8K, §6.1", "pairs", _ear, select={**_BF16_FP16, "deterministic": ANY}, models=_TINY,
        benchmarks=("gsm8k",), bare=True, by=("model", "deterministic"), detail=_pairs_detail),
    Row(PRECISION, "BF16 vs FP16 divergence on MATH-500", "44% (TinyLlama); 30% (Llama-3.2-3B)",
        "n = 50, App. VII", "pairs", _rate, select=_BF16_FP16, models=("TinyLlama", "Llama-3.2-3B"),
        benchmarks=("math500",), bare=True, stand_in=False, detail=_pairs_detail),
    Row(PRECISION, "reasoning- vs instruction-tuned at matched scale", "10–15 pp lower EAR",
        "DS-R1-Distill-Qwen vs Qwen2.5-Instruct, 1.5B and 7B, §6.5", "pairs", _ear, fmt=str, select=_BF16_FP16,
        models=("DS-R1-Qwen-1.5B", "Qwen2.5-1.5B", "DS-R1-Qwen-7B", "Qwen2.5-7B"), benchmarks=_CODE_MATH,
        bare=True, across=_matched_pairs),
    Row(PRECISION, "σz, per-logit RMS of the logit difference", "0.026", "TinyLlama, §I.3", "precision_steps",
        _rms_sigma, fmt=_num, models=_TINY,
        detail=lambda r: f"precision probe, full vocabulary, {len(r)} step(s)"),
    Row(PRECISION, "median top-2 margin, Diverged vs Agreed prompts",
        "0.039 vs 5.733 (TinyLlama); 0.088 vs 7.925 (Qwen2.5-3B)", "final-layer logit lens, §I.3, App. III", "lens",
        _final_margins, fmt=_both(_num), models=_TINY_QWEN,
        detail=lambda r: (lambda c: f"final-layer lens, {c.get('diverged', 0)} Diverged vs {c.get('agreed', 0)} "
                                    f"Agreed prompt(s)")(r[_last_layer(r)]["group"].value_counts())),
    Row(PRECISION, "lens margin from first to last layer, Diverged; Agreed", "0.33 → 0.04; 2.06 → 5.73",
        "TinyLlama, App. II(iv), Table 10", "lens", _margin_trend, fmt=str, models=_TINY),
    Row(PRECISION, "top-1 agreement of the two precisions at body layers", "93–100%", "TinyLlama, App. II(iv)",
        "lens", _body_agreement, fmt=str, models=_TINY,
        detail=lambda r: f"body layers at the first flip, {r.loc[r['group'] == 'diverged', 'prompt_id'].nunique()} "
                         "prompt(s)"),
    Row(PRECISION, "first token: top-1 agreement, mean top-2 margin", "100%, 0.70", "TinyLlama, 100 prompts, "
        "App. II(i)", "lens", _first_token, fmt=str, models=_TINY),
    Row(PRECISION, "LM head's share of the per-logit perturbation", "97.6%", "estimated, TinyLlama, §7.3",
        "precision_steps", _head_share, models=_TINY, detail=lambda r: "measured, σ_head² / (σ_head² + σ_body²)"),
    *(Row(PRECISION, claim, figure, "TinyLlama, App. II(ii)-(iii), Table 8", "grafting", _graft(*args),
          models=_TINY, detail=lambda r: f"{len(r)} graft(s) at flip steps") for claim, figure, args in (
        ("flips fixed by grafting FP16's embedding into BF16", "29.4%", ("embedding", "bf16", "fp16")),
        ("flips fixed by grafting one FP16 body layer into BF16", "≈ 36%", ("layer", "bf16", "fp16", "body")),
        ("flips fixed by grafting FP16's last layer into BF16", "65%", ("layer", "bf16", "fp16", "last")),
        ("flips fixed by grafting FP16's final norm into BF16", "71%", ("final_norm", "bf16", "fp16")),
        ("KV-cache graft, FP16's own cache into BF16", "47.5%", ("kv_cache", "bf16", "fp16")),
        ("KV-cache graft, BF16's own cache into FP16", "35.6%", ("kv_cache", "fp16", "bf16")))),
    Row(PRECISION, "flip predicted from the body's projection vs the margin", "88% (TinyLlama); 89% (Qwen2.5-3B)",
        "traced steps, App. XII", "traced_steps", _body_rule, models=_TINY_QWEN, detail=_traced_detail),
    Row(PRECISION, "flip predicted by the RMS-scale trigger (margin < √2·σz)", "88–89% of steps",
        "TinyLlama, Qwen2.5-3B, §7.1 (a heuristic)", "traced_steps", _rms_rule, models=_TINY_QWEN,
        detail=_traced_detail),
    Row(PRECISION, "body projection, Diverged vs Agreed steps; their margins",
        "equivalent; margins 10²–10³ apart", "TinyLlama, Qwen2.5-3B, App. XII, Table 20", "traced_steps",
        _body_projection, fmt=str, models=_TINY_QWEN, detail=_traced_detail),
    Row(PRECISION, "gated FP32 head (C): EAR lift", "+22–36 pp", "1–3B Llama family: TinyLlama +22, "
        "Llama-3.2-3B +36; A10G, batch size 1 (abstract, App. IV)", "interventions", _lift, fmt=_pp,
        bare=True, select={"intervention": "C"}, models=("TinyLlama", "Llama-3.2-3B"), show="range",
        detail=lambda r: f"n = {int(r['n'].sum())}, lift pooled over each model's benchmarks"),
    Row(PRECISION, "gated FP32 head (C): latency overhead", "< 4%", "A10G, batch size 1, Table 3", "interventions",
        _overhead, bare=True, select={"intervention": "C"}, models=("TinyLlama", "Llama-3.2-3B"), show="range",
        detail=lambda r: "compute time per token of both cells against no intervention (the largest)"),
    Row(PRECISION, "gated FP32 head (C): lift per model", "+36 Llama-3.2-3B, +22 TinyLlama, +3 Qwen2.5-3B, "
        "+8 Mistral-7B, +10 OLMoE, 0 DS-R1-Qwen-7B", "App. IV, Table 12", "interventions", _lift, fmt=_pp,
        bare=True, select={"intervention": "C"},
        models=("Llama-3.2-3B", "TinyLlama", "Qwen2.5-3B", "Mistral-7B", "OLMoE", "DS-R1-Qwen-7B")),
    Row(PRECISION, "gated FP32 head (C) at batch sizes 2 and 4", "+7–8 pp", "App. IV", "interventions", _lift,
        fmt=_pp, bare=True, select={"intervention": "C", "batch_size": (2, 4)}, by=("model", "batch_size"), show="range"),
    Row(PRECISION, "gated FP32 head (C) at batch size 8", "0 pp", "App. IV, §I.6", "interventions", _lift, fmt=_pp,
        bare=True, select={"intervention": "C", "batch_size": 8}, show="range"),
    Row(PRECISION, "gated FP32 head (C) with FlashAttention-2", "remains positive", "§1, §8.1", "interventions",
        _lift, fmt=_pp, bare=True, select={"intervention": "C", "attention": "flash_attention_2"}),
    Row(PRECISION, "cost per trigger, whole head (C) over top-8 (B)", "≈ 4000×", "§4.2", "cells", len, fmt=str,
        select={"intervention": ANY, "precision": ANY}, bare=True, across=_cost_per_trigger,
        detail=lambda r: "extra compute time per token ÷ trigger rate, from the cells"),
    Row(PRECISION, "prompt length where head-only repair stops sufficing", "≈ 850 tokens",
        "TinyLlama, estimated, §I.5", "cells", _prompt_length, fmt=str, models=_TINY, select={"precision": ANY},
        detail=lambda r: "the longest prompt of this run (beyond the boundary, C's lift should fade)"),
    Row(PRECISION, "hidden-state difference, batch size 1 vs 8", "0.0127", "§I.6", "cells", _prompt_length,
        unmeasured="not measured: no probe replays a prompt at two batch sizes"),
)


def _matches(column: pd.Series, value: Any) -> pd.Series:
    if isinstance(value, (tuple, list, set, frozenset)):
        return pd.concat([_matches(column, v) for v in value], axis=1).any(axis=1)
    if isinstance(value, int) and not isinstance(value, bool):  # batch_size: a float column in pair tables
        return pd.to_numeric(column, errors="coerce") == value
    return column.astype(str) == str(value)


def _at_defaults(frame: pd.DataFrame, row: Row, study: Study) -> pd.DataFrame:
    """The rows of an axis-carrying table whose axes are as the row asks: the named
    values, and every other axis at its default (or, for a pair, the compared axis)."""
    select = dict(row.select)
    if select.get("intervention") == "C":
        select["intervention"] = tuple(study.c_labels) or ("<none>",)
    defaults: dict[str, Any] = plain_values(study.greedy, study.none)
    defaults["decoding"] = defaults["decoding"] or ("<none>",)
    keep = pd.Series(True, index=frame.index)
    between = select.pop("between", None)
    if between is not None:
        a, b = between
        keep &= ((frame["a"] == a) & (frame["b"] == b)) | ((frame["a"] == b) & (frame["b"] == a))
    axis = select.get("axis")
    for key, value in {**defaults, **select}.items():
        if value is ANY or key not in frame or key == axis:
            continue
        keep &= _matches(frame[key], value)
    return frame[keep]


def _restrict(frame: pd.DataFrame, row: Row, study: Study) -> tuple[pd.DataFrame, list[str]]:
    """The row's models and benchmarks; where the run has none of the paper's, every one
    of the run's, with a note of what they stand in for."""
    notes = []
    if row.exclude and "model" in frame:
        out = [m for m in frame["model"].unique()
               if any(re.search(p, f"{m} {study.identity.get(m, m)}", re.I) for p in row.exclude)]
        frame = frame[~frame["model"].isin(out)]
    if row.models and "model" in frame:
        ours = [m for m in frame["model"].unique()
                if paper_models(m, study.identity.get(m, m)) & set(row.models)]
        if ours:
            frame = frame[frame["model"].isin(ours)]
        elif len(frame):
            stand_in = ", ".join(sorted(frame["model"].unique()))
            notes.append(f"{stand_in}, in place of {', '.join(row.models)}")
    if "benchmark" in frame and (row.benchmarks or row.bare):
        names = frame["benchmark"].unique()
        ours = [b for b in names if (not row.benchmarks or study.kind.get(b, b) in row.benchmarks)
                and (not row.bare or study.format.get(b, "chat") == "bare")]
        if ours or not row.stand_in:
            frame = frame[frame["benchmark"].isin(ours)]
        elif len(frame):
            wanted = ", ".join(row.benchmarks) or "a benchmark"
            notes.append(f"{', '.join(sorted(names))}, in place of {wanted}{' (bare prompts)' if row.bare else ''}")
    return frame, notes


def _groups(frame: pd.DataFrame, row: Row) -> list[tuple[str, pd.DataFrame]]:
    by = [c for c in row.by if c in frame]
    if not by:
        return [("", frame)]
    return [(" / ".join(map(_label, key if isinstance(key, tuple) else (key,))), g)
            for key, g in frame.groupby(by, sort=True)]


def _label(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _compute(row: Row, tables: Tables, study: Study) -> tuple[str, str]:
    frame = FRAMES[row.source](tables)
    if frame.empty:
        raise KeyError("no data")
    frame = _at_defaults(frame, row, study)
    frame, notes = _restrict(frame, row, study)
    if frame.empty:
        raise KeyError("no data")
    if row.across is not None:
        values = row.across(frame, study)
    else:
        values = {}
        for name, group in _groups(frame, row):
            try:
                value = row.value(group)
            except (KeyError, ValueError, ZeroDivisionError, IndexError):
                continue
            if not _missing(value) and value != "–":
                values[name] = value
    if not values:
        raise KeyError("no data")
    if row.show == "range" and len(values) > 1:
        ordered = sorted(values.values())
        lo, hi = row.fmt(ordered[0]), row.fmt(ordered[-1])
        ours = lo if lo == hi else f"{lo} to {hi}"
    elif len(values) == 1:
        ours = row.fmt(next(iter(values.values())))
    else:
        ours = "; ".join(f"{name}: {row.fmt(v)}" for name, v in values.items())
    models = sorted(frame["model"].unique()) if "model" in frame else []
    what = notes if notes else ([", ".join(models)] if models else [])
    spread = f"over {len(values)} {' × '.join(row.by)} group(s)" if row.show == "range" and len(values) > 1 else ""
    detail = row.detail(frame) if row.detail else ""
    return ours, "; ".join(x for x in [*what, spread, detail] if x)


def comparison_rows(tables: Tables, study: Study, device: str) -> list[dict[str, str]]:
    """Rows of (paper, claim, paper's figure and conditions, ours and our conditions, the
    population). A row whose data this run does not have says so instead of a number."""
    out = []
    for row in ROWS:
        if row.unmeasured:
            ours, conditions = "–", row.unmeasured
        else:
            try:
                ours, conditions = _compute(row, tables, study)
                conditions = f"{conditions}; {device}"
            except (KeyError, ValueError, ZeroDivisionError):
                ours, conditions = "–", "not in this run"
        out.append({"paper": row.paper, "claim": row.claim, "paper_figure": row.figure,
                    "paper_conditions": row.conditions, "ours": ours, "our_conditions": conditions,
                    "population": row.population()})
    return out
