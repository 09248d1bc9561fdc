"""What the report's figures and tables share: number formatting, the SVG export, the
labels of conditions and models, and the frames several of them read."""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from tokenflip.analysis import statistics
from tokenflip.core import storage
from tokenflip.core.axes import AXES
from tokenflip.report import paper


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.2e}"
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{100 * value:.1f}%"


# Inline SVGs are shown at this multiple of their size in points, so that every figure's
# text reads at the same size (about 14 px for seaborn's "paper" context) whatever its
# figsize; CSS shrinks them to the column on narrow screens.
FIGURE_SCALE = 1.3


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    # Links within the page (a heatmap's row label to its drill-down) open in place.
    svg = re.sub(r'(<a xlink:href="#[^"]*") target="_blank"', r"\1", svg)
    head, rest = svg.split(">", 1)
    head = re.sub(r'\b(width|height)="([0-9.]+)pt"',
                  lambda m: f'{m.group(1)}="{float(m.group(2)) * FIGURE_SCALE:.1f}pt"', head)
    return f"{head}>{rest}"


# Figures drawn per pair, per model or per point stay as they are up to these sizes; above
# them they aggregate (per condition, over models) or rasterise their points, so that a
# study of thousands of pairs keeps figures of the same height and a file of a few MB.
MAX_PAIR_ROWS = 24


MAX_MODEL_STYLES = 4


MAX_VECTOR_POINTS = 2000


# One colour per condition across the page: a precision (or any other value a figure's hue
# takes) is drawn in the same colour in every figure; values without a fixed colour take the
# next free one of the cycle in sorted order.
CONDITION_COLOURS = {"fp32": "#1f77b4", "bf16": "#2ca02c", "fp16": "#d62728", "fp64": "#7f7f7f"}
_CYCLE = ("#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31")


def palette(values: Any) -> dict[str, str]:
    """{value: colour} for the values a figure's hue takes (see CONDITION_COLOURS)."""
    out, free = {}, iter(c for c in _CYCLE * 8)
    for value in sorted({str(v) for v in values}):
        out[value] = CONDITION_COLOURS.get(value) or next(free)
    return out


def legend_outside(ax) -> None:
    """The legend right of the axes, never over the data."""
    import seaborn as sns

    if ax.get_legend() is not None:
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), frameon=False)


def _model_style(data: pd.DataFrame) -> str | None:
    """One line style per model for a few models; above that the lines pool the models
    (the overview's heatmaps show them one by one)."""
    return "model" if data["model"].nunique() <= MAX_MODEL_STYLES else None


def _read_optional(path: Path) -> pd.DataFrame:
    return storage.read_table(path)[0].to_pandas() if path.exists() else pd.DataFrame()


# Whole-state patches of the KV-cache probe, in reading order (the per-layer ones are drawn
# against the layer).
WHOLE_PATCHES = ("residual stream", "kv cache")


# What each patching table gives per group of patched steps.
PATCH_FIGURES = dict(experiments=("kl", "size"), median_kl=("kl", "median"), recovered=("kl_recovered", "median"),
                     flips=("flip", "sum"))


# Grafting sites in the order of the forward pass, and the label of each as a column.
GRAFT_ORDER = {"embedding": -2, "final_norm": 10_000, "kv_cache": 10_001}


GRAFT_COLUMNS = {-2: "emb", 10_000: "norm", 10_001: "KV"}


def graft_frame(grafting: pd.DataFrame) -> pd.DataFrame:
    """Grafting rows with `into` (the run grafted into, ← the precision grafted from) and a
    `position` that orders the sites as the forward pass meets them."""
    into, source = paper.graft_ends(grafting)
    position = grafting["site"].map(GRAFT_ORDER).fillna(grafting["layer"]).astype(int)
    return grafting.assign(into=into + " ← " + source, position=position)


def first_runs(pairs: pd.DataFrame) -> pd.DataFrame:
    """The pairs between first runs, and the repeat pairs themselves: a setting run again
    pairs its second runs on the same prompts, which pooled figures would count twice."""
    if pairs.empty or "repeat" not in pairs:
        return pairs
    from tokenflip.core.axes import FURTHER_AXES

    return pairs[(pairs["axis"] == "repeat") | (pairs["repeat"].astype(str) == str(FURTHER_AXES["repeat"]))]


def condition_labels(rows: pd.DataFrame) -> pd.Series:
    """What a pair compares, without model and benchmark: 'axis: a vs b', plus every shared
    setting that differs between the pairs of that axis: the precision (cache ON vs OFF in
    fp32 is another finding than in fp16), the engine, and the further axes away from their
    defaults, such as vLLM's requests in flight (`concurrency 1`), so that no figure pools
    what differs. A repeat is never named: the pooled figures take first runs only
    (`first_runs`), since a second run holds the same prompts again."""
    from tokenflip.core.axes import FURTHER_AXES

    labels = rows["axis"].astype(str) + ": " + rows["a"].astype(str) + " vs " + rows["b"].astype(str)
    for setting in ("precision", *(a for a in FURTHER_AXES if a != "repeat")):
        if setting not in rows:
            continue
        values = rows[setting]
        varied = values.groupby(rows["axis"]).transform(lambda v: v.nunique() > 1).astype(bool)
        kept = varied & values.notna() & (rows["axis"] != setting)
        if setting in ("precision", "engine"):
            shown = values.astype(str)
        else:  # a further axis is named where it is not at its default ("concurrency 1")
            kept &= values.astype(str) != str(FURTHER_AXES[setting])
            shown = f"{setting} " + values.astype(str)
        labels = labels.where(~kept, labels + " · " + shown)
    return labels


def in_words(values: dict[str, Any], plain: bool = True) -> str:
    """A pair's shared settings as a reader says them ("bf16, cache on, batch size 1, greedy,
    inference engine llama.cpp, KV cache stored in FP8 E5M2"): the compared axis (None) left
    out, the further axes only where they are not at their default (and with `plain=False`
    greedy decoding and no intervention too). The file-name form stays in the tables'
    shared-settings column."""
    from tokenflip.core.axes import CORE_AXES, FURTHER_AXES

    def given(v: Any) -> bool:
        return v is not None and not (isinstance(v, float) and math.isnan(v))

    parts = []
    for axis in CORE_AXES:
        v = values.get(axis)
        if not given(v):
            continue
        if axis == "cache":
            parts.append(f"cache {v}")
        elif axis == "batch_size":
            parts.append(f"batch size {_batch(v)}")
        elif axis == "intervention":
            none = values.get("no_intervention") is True  # by kind (the summary's column), not by label
            if not none or plain:
                parts.append("no intervention" if none else f"intervention {v}")
        elif axis == "decoding" and v == "greedy" and not plain:
            continue
        else:
            parts.append(str(v))
    parts += [value_words(axis, values[axis]) for axis, default in FURTHER_AXES.items()
              if given(values.get(axis)) and str(values[axis]) != str(default)]
    return ", ".join(parts)


# What an axis means, for readers who do not know the config's names (the table of axes).
AXIS_WORDS = {axis.name: axis.words for axis in AXES.values()}
KV_DTYPE_WORDS = {"default": "KV cache kept in the compute precision", "fp8_e4m3": "KV cache stored in FP8 E4M3",
                  "fp8_e5m2": "KV cache stored in FP8 E5M2", "int4": "KV cache stored in 4-bit integers",
                  "int8": "KV cache stored in 8-bit integers"}


def value_words(axis: str, value: Any, interventions: dict[str, Any] | None = None) -> str:
    """One setting as a reader says it: "KV cache stored in FP8 E5M2", "prompt prefilled 16
    tokens at a time", "inference engine llama.cpp", "C_gated (the LM head recomputed in
    fp32, gated by margin < τ)" (with the config's `interventions` block)."""
    value = _batch(value) if axis == "batch_size" else str(value)
    if axis == "kv_dtype":
        return KV_DTYPE_WORDS.get(value, f"KV cache stored as {value}")
    if axis == "prefill_chunk":
        return "prompt prefilled at once" if value == "default" else f"prompt prefilled {value} tokens at a time"
    if axis == "cache":
        return f"KV cache {value}"
    if axis == "intervention":
        from tokenflip.run.interventions import is_no_intervention

        spec = (interventions or {}).get(value)
        if not spec:
            return f"intervention {value}"
        if is_no_intervention(spec):
            return "no intervention"
        kind = spec.get("kind")
        if kind == "fp32_head":
            gate = f"gated by margin < {spec.get('tau', 1e-3)}" if spec.get("gated", True) else "on every step"
            return f"{value} (the LM head recomputed in fp32, {gate})"
        return f"{value} ({kind})"
    if axis == "concurrency":  # each engine has its own default (vLLM's max_num_seqs, an endpoint's one at a time)
        return "the engine's default requests in flight" if value == "default" else (
            "one request at a time" if value == "1" else f"{value} requests in flight")
    if axis == "prefix_cache":
        return {"off": "no prefix cache", "on": "a warm prefix cache", "cold": "a prefix cache filled as requests "
                "arrive"}.get(value, f"prefix cache {value}")
    if axis == "repeat":
        return "the first run" if value == "default" else f"repeat {value} ({AXIS_WORDS['repeat']})"
    if axis == "load":
        return "no background load" if value == "none" else f"background load {value}"
    if axis == "logprobs":
        return {"on": "logprobs requested", "off": "no logprobs requested"}.get(value, f"logprobs {value}")
    if axis == "server_cache":
        return {"as_is": "the server's prefix cache as its traffic left it", "cold": "a cold server prefix cache",
                "warm": "a warm server prefix cache"}.get(value, f"server prefix cache {value}")
    if axis == "tensor_parallel":
        return "the model on one device" if value == "1" else f"the model split over {value} devices"
    if axis in ("precision", "decoding"):
        return value
    return f"{AXIS_WORDS.get(axis, axis.replace('_', ' '))} {value}"


# Axes whose values read as phrases of their own ("2 requests in flight", "the first run"): a
# comparison of one reads "<a> vs <b> (axis)", not "<what the axis is> <a> vs <b>".
PHRASED_AXES = ("kv_dtype", "prefill_chunk", "intervention", "concurrency", "prefix_cache", "repeat", "load",
                "logprobs", "server_cache", "tensor_parallel")


def _batch(size: Any) -> str:
    """A batch size as written in the config (the summary stores it as float beside None)."""
    return str(int(size)) if isinstance(size, (int, float)) and not math.isnan(size) else str(size)


def _pooled(group: pd.DataFrame) -> pd.Series:
    n, d = int(group["n_prompts"].sum()), int(group["n_diverged"].sum())
    low, high = statistics.wilson(d, n)
    return pd.Series({"n": n, "diverged": d, "rate": d / n if n else float("nan"), "low": low, "high": high})
