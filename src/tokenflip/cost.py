"""What a study costs before it runs: `tokenflip plan --cost`.

Per generation cell, upper bounds from the config alone (every prompt generates
`max_new_tokens`): prompts, generated tokens, the token positions the forward passes
process (with the cache, each prompt is prefilled once and then one position per step;
without it every step reprocesses the whole sequence, so the positions grow with the
square of the generation), the forward passes and the weight bytes they read. An estimate
of device time follows from a roofline per forward pass: the larger of reading the
weights at the device's memory bandwidth and doing 2 × parameters FLOPs per position at
its throughput, or, per model size, from a measured decode rate (`--tokens-per-second`).

Prompt lengths are the tokenizer's (the `check_prompts` records, their longest prompt)
when the run has them, else estimated from the prompt text at 4 characters a token.
Model sizes come from a prepared model's manifest, else from the size in its name
("Llama-2-7b", "SmolLM2-135M"; for "OLMoE-1B-7B", the total), else from a random model's
configuration; a model of unknown size has no bytes or time.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .engines import TRANSFORMERS
from .jobs import Cell

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
CHARS_PER_TOKEN = 4
_SIZE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)([bBmM])(?![a-zA-Z0-9])")


def size_in_name(name: str) -> float | None:
    """Parameters named in a model id ("TinyLlama-1.1B" -> 1.1e9; the largest if several)."""
    sizes = [float(n) * (1e9 if unit in "bB" else 1e6) for n, unit in _SIZE.findall(name)]
    return max(sizes) if sizes else None


def model_parameters(name: str, spec: dict[str, Any], models_dir: Path) -> tuple[float | None, str]:
    """(parameters, where the figure comes from)."""
    manifest = models_dir / name / "model.json"
    if manifest.is_file():
        try:
            return float(json.loads(manifest.read_text())["num_parameters"]), "prepared manifest"
        except (ValueError, KeyError, TypeError):
            pass
    for label in (spec.get("id"), spec.get("file"), name):
        if label and (n := size_in_name(str(label))):
            return n, "size in its name"
    if spec.get("source") == "random":
        from .models import build_model

        model, _ = build_model(spec)
        return float(sum(p.numel() for p in model.parameters())), "random model's configuration"
    return None, "unknown"


def _local_benchmark(name: str, spec: dict[str, Any]):
    """The benchmark if its items can be read here without the hub (None otherwise: the
    hub is reached by the cells, never by planning). Built once per benchmark: its count
    and every model's prompt-length estimate read the same items."""
    from .benchmarks import BenchmarkError, build_benchmark

    key = (name, json.dumps(spec, sort_keys=True))
    if key not in _BENCHMARKS:
        try:
            bench = build_benchmark(name, spec)
            _BENCHMARKS[key] = None if bench.reads_hub else bench
        except (BenchmarkError, OSError, ValueError, KeyError):
            _BENCHMARKS[key] = None
    return _BENCHMARKS[key]


_BENCHMARKS: dict[tuple[str, str], Any] = {}


def prompt_lengths(config: dict[str, Any], model: str, bench_name: str, root: str | None,
                   given: dict[str, float]) -> tuple[float | None, str]:
    """(tokens per prompt, where the figure comes from) for one model and benchmark."""
    from .layout import RunLayout

    if bench_name in given:
        return given[bench_name], "given (--prompt-tokens)"
    check = Path(RunLayout(config["run"], root=root).prompt_check(model, bench_name))
    if check.is_file():
        try:
            return float(json.loads(check.read_text())["max_tokens"]), "tokenizer (longest prompt)"
        except (ValueError, KeyError, TypeError):
            pass
    return _estimated_prompt_tokens(bench_name, config["benchmarks"][bench_name])


UNKNOWN_LENGTH = ("unknown: hub data is not read when planning; `snakemake --until check_prompts` records the "
                  "tokenizer's lengths, or give --prompt-tokens BENCHMARK=N")


def _estimated_prompt_tokens(name: str, spec: dict[str, Any]) -> tuple[float | None, str]:
    from .benchmarks import BenchmarkError

    bench = _local_benchmark(name, spec)
    if bench is None:
        return None, UNKNOWN_LENGTH
    try:
        texts = [bench.bare_text(item) if bench.prompt_style["format"] == "bare"
                 else " ".join(m["content"] for m in bench.chat_messages(item)) for item in bench.items()[:50]]
    except (BenchmarkError, OSError, ValueError, KeyError):
        return None, UNKNOWN_LENGTH
    if not texts:
        return None, "unknown: no prompts"
    return max(len(t) for t in texts) / CHARS_PER_TOKEN, f"estimated at {CHARS_PER_TOKEN} characters a token"


def prompt_count(name: str, spec: dict[str, Any]) -> int | None:
    """The benchmark's prompts: counted where its data is local, else its `n`."""
    from .benchmarks import BenchmarkError

    bench = _local_benchmark(name, spec)
    if bench is not None:
        try:
            return len(bench.items())
        except (BenchmarkError, OSError, ValueError, KeyError):
            pass
    return int(spec["n"]) if isinstance(spec.get("n"), int) else None


@dataclass
class Device:
    """What a forward pass costs on the target device: a roofline, or a measured decode rate."""

    bandwidth_gbs: float = 2000.0   # HBM bandwidth, GB/s (an A100-80GB: 2,039)
    tflops: float = 150.0           # 16-bit dense matrix throughput actually reached, TFLOP/s
    tokens_per_second: dict[float, float] = field(default_factory=dict)  # params -> measured decode tok/s, bs 1

    def pass_seconds(self, params: float, precision: str, positions: float) -> float:
        """One forward pass over `positions` token positions (all rows of the batch)."""
        memory = params * BYTES[precision] / (self.bandwidth_gbs * 1e9)
        if self.tokens_per_second:
            size = min(self.tokens_per_second, key=lambda s: abs(math.log(s / params)))
            memory = (1.0 / self.tokens_per_second[size]) * (params / size) * BYTES[precision] / 2
        # fp32 matrix products (without TF32) run at about an eighth of the 16-bit rate on
        # datacenter GPUs (A100: 19.5 vs 312 TFLOP/s peak).
        flops = self.tflops * 1e12 / (8 if precision == "fp32" else 1)
        return max(memory, 2 * params * positions / flops)


@dataclass
class CellCost:
    prompts: int | None
    generated_tokens: int | None
    positions: float | None
    passes: int | None
    weight_bytes: float | None
    seconds: float | None


def cell_cost(cell: Cell, prompts: int | None, prompt_tokens: float | None, max_new_tokens: int,
              params: float | None, device: Device) -> CellCost:
    """Upper bounds for one cell: every prompt runs `max_new_tokens` steps, in batches of
    the cell's batch size, padded to the batch's longest prompt (taken as `prompt_tokens`)."""
    if prompts is None:
        return CellCost(None, None, None, None, None, None)
    batches, t = math.ceil(prompts / cell.batch_size), max_new_tokens
    generated, passes = prompts * t, batches * t
    weight_bytes = None if params is None else passes * params * BYTES[cell.precision]
    if prompt_tokens is None:
        return CellCost(prompts, generated, None, passes, weight_bytes, None)
    p, b = prompt_tokens, cell.batch_size
    if cell.cache == "on":
        per_batch = [p * b] + [b] * (t - 1)               # prefill, then one position per row
    else:
        per_batch = [(p + step) * b for step in range(t)]  # the whole sequence at every step
    positions = batches * sum(per_batch)
    if params is None:
        return CellCost(prompts, generated, positions, passes, None, None)
    seconds = batches * sum(device.pass_seconds(params, cell.precision, n) for n in per_batch)
    return CellCost(prompts, generated, positions, passes, weight_bytes, seconds)


def study_cost(config: dict[str, Any], device: Device, root: str | None = None,
               prompt_tokens: dict[str, float] | None = None) -> dict[str, Any]:
    """Per rule and in total: jobs, and for the GPU rules prompts, tokens, positions,
    weight bytes and device hours; with where each input figure came from."""
    from .plan import expand_cells, expand_pairs, probe_targets

    models_dir = Path(root or ".") / "resources" / "models"
    cells = expand_cells(config)
    params = {m: model_parameters(m, spec, models_dir) for m, spec in config["models"].items()}
    counts = {b: prompt_count(b, spec) for b, spec in config["benchmarks"].items()}
    lengths: dict[tuple[str, str], tuple[float | None, str]] = {}
    per_model: dict[str, dict[str, float]] = {}
    total = {"cells": 0, "prompts": 0, "generated_tokens": 0, "positions": 0.0, "weight_bytes": 0.0, "seconds": 0.0}
    unknown = set()
    # llama.cpp runs on the CPU: no GPU time, and its weights are the GGUF's. Counted apart.
    cpu_cells = Counter(cell.engine for cell in cells if cell.engine != TRANSFORMERS)
    for cell in cells:
        if cell.engine in cpu_cells:
            continue
        key = (cell.model, cell.benchmark)
        if key not in lengths:
            lengths[key] = prompt_lengths(config, *key, root, prompt_tokens or {})
        spec = config["benchmarks"][cell.benchmark]
        cost = cell_cost(cell, counts[cell.benchmark], lengths[key][0],
                         spec.get("max_new_tokens", config["generation"]["max_new_tokens"]), params[cell.model][0],
                         device)
        row = per_model.setdefault(cell.model, {k: 0 for k in total})
        for acc in (row, total):
            acc["cells"] += 1
            for name in ("prompts", "generated_tokens", "positions", "weight_bytes", "seconds"):
                value = getattr(cost, name)
                if value is None:
                    unknown.add((cell.model, name))
                else:
                    acc[name] += value
    return {"rules": {"prepare_model": len(config["models"]),
                      "check_prompts": len({(c.model, c.benchmark) for c in cells}),
                      "generate": len(cells), "compare": len(expand_pairs(config, cells)),
                      "probe": len(probe_targets(config)), "summarize": 1, "report": 1},
            "generate": total, "per_model": per_model, "unknown": sorted(unknown),
            "cpu_cells": dict(sorted(cpu_cells.items())),
            "sources": {"parameters": {m: {"parameters": v[0], "from": v[1]} for m, v in params.items()},
                        "prompt_tokens": {f"{m}/{b}": {"tokens": v[0], "from": v[1]} for (m, b), v in lengths.items()}},
            "device": {"bandwidth_gbs": device.bandwidth_gbs, "tflops": device.tflops,
                       "tokens_per_second": device.tokens_per_second}}


def _si(x: float, unit: str = "") -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.1f} {prefix}{unit}"
    return f"{x:.0f} {unit}".strip()


def format_cost(cost: dict[str, Any]) -> str:
    lines = ["jobs per rule: " + ", ".join(f"{rule} {n}" for rule, n in cost["rules"].items())]
    d = cost["device"]
    rate = (", decode " + ", ".join(f"{_si(s)} parameters: {t:g} tok/s" for s, t in d["tokens_per_second"].items())
            if d["tokens_per_second"] else "")
    lines.append(f"device model: {d['bandwidth_gbs']:g} GB/s, {d['tflops']:g} TFLOP/s{rate} "
                 f"(roofline per forward pass; upper bounds: every prompt runs max_new_tokens)")
    header = f"{'generate':24s} {'cells':>6s} {'prompts':>9s} {'tokens':>10s} {'positions':>10s} {'weights read':>13s} {'GPU-hours':>10s}"
    lines.append(header)

    unknown = {what for _, what in cost["unknown"]}

    def row(name, r, missing):
        """One line; a figure some cells could not count is marked '+?' (a lower bound)."""
        shown = {"prompts": f"{r['prompts']:,d}", "generated_tokens": f"{r['generated_tokens']:,d}",
                 "positions": _si(r["positions"]), "weight_bytes": _si(r["weight_bytes"], "B"),
                 "seconds": f"{r['seconds'] / 3600:.2f}"}
        shown = {k: v + ("+?" if k in missing else "") for k, v in shown.items()}
        return (f"{name:24s} {r['cells']:6d} {shown['prompts']:>9s} {shown['generated_tokens']:>10s} "
                f"{shown['positions']:>10s} {shown['weight_bytes']:>13s} {shown['seconds']:>10s}")

    for model, r in sorted(cost["per_model"].items()):
        lines.append(row(model, r, {what for m, what in cost["unknown"] if m == model}))
    lines.append(row("total", cost["generate"], unknown))
    for m, s in cost["sources"]["parameters"].items():
        lines.append(f"  {m}: {_si(s['parameters']) if s['parameters'] else '?'} parameters ({s['from']})")
    by_benchmark: dict[tuple[str, Any, str], list[str]] = {}
    for mb, s in cost["sources"]["prompt_tokens"].items():
        model, bench = mb.split("/", 1)
        by_benchmark.setdefault((bench, s["tokens"], s["from"]), []).append(model)
    for (bench, tokens, source), models in sorted(by_benchmark.items(), key=lambda kv: kv[0][0]):
        who = models[0] if len(models) == 1 else f"{len(models)} models"
        lines.append(f"  {bench} ({who}): {tokens:.0f} prompt tokens ({source})" if tokens else
                     f"  {bench} ({who}): prompt length {source}")
    for engine, n in cost.get("cpu_cells", {}).items():
        lines.append(f"  not priced: {n} {engine} cell(s), which run on the CPU")
    if cost["unknown"]:
        lines.append("  not counted (unknown inputs): " + ", ".join(f"{m} {what}" for m, what in cost["unknown"]))
    return "\n".join(lines)
