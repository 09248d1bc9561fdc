"""What a study costs before it runs: `tokenflip plan --cost`.

Per generation cell and in total: prompts, generated tokens, the token positions the
forward passes process (with the cache, each prompt is prefilled once and then one
position per step; without it every step reprocesses the whole sequence, so the positions
grow with the square of the generation), the weight bytes read, and the time, from
`cost.model` on a GPU (`--device gpu`, the default: GPU-hours of the generation and probe
jobs) or from a short calibration of the study's own models on this machine (`--device
cpu`: CPU-hours of every job, the scheduler's included). Probe jobs are priced by the
replays they run. Which figures are bounds, and in which direction: `cost.model`.

Prompt lengths are the tokenizer's (the `check_prompts` records, their longest prompt; on
a calibrated CPU every prompt through the tokenizer) when the run has them, else estimated
from the prompt text at 4 characters a token. Model sizes come from the checkpoint's
configuration (`models.size`).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from tokenflip.core.inputs import shown
from tokenflip.core.layout import MODELS_DIR
from tokenflip.models.size import ModelSize, model_size
from tokenflip.run.engines import TRANSFORMERS
from tokenflip.study.cost.model import (
    BYTES,
    MAX_PROMPT_TOKENS,
    CostInputError,
    Device,
    check_figures,
    check_gpu,
    expected_steps,
    generation_seconds,
    gpu_overhead_from,
    probe_seconds,
)

CHARS_PER_TOKEN = 4


def _local_benchmark(name: str, spec: dict[str, Any]):
    """The benchmark if its items can be read here without the hub (None otherwise: the
    hub is reached by the cells, never by planning). Built once per benchmark: its count
    and every model's prompt-length estimate read the same items."""
    from tokenflip.run.benchmarks import BenchmarkError, build_benchmark

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
    from tokenflip.core.layout import RunLayout

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
    from tokenflip.run.benchmarks import BenchmarkError

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
    from tokenflip.run.benchmarks import BenchmarkError

    bench = _local_benchmark(name, spec)
    if bench is not None:
        try:
            return len(bench.items())
        except (BenchmarkError, OSError, ValueError, KeyError):
            pass
    return int(spec["n"]) if isinstance(spec.get("n"), int) else None


def _sum(acc: dict[str, float], **values: float | None) -> set[str]:
    """Add each known value into `acc`; the names of those that are unknown."""
    unknown = set()
    for name, value in values.items():
        if value is None:
            unknown.add(name)
        else:
            acc[name] = acc.get(name, 0) + value
    return unknown


def _lengths(config, device: Device, model: str, bench: str, rows: int, root, given, sources) -> float | None:
    """Tokens per prompt for a cell: on a calibrated CPU the tokenizer's mean (batch size 1)
    or longest prompt (a batch pads to its longest); else the longest, as `prompt_lengths` finds it."""
    if device.cpu and (model, bench) in device.cpu.prompt_tokens and bench not in given:
        mean, longest = device.cpu.prompt_tokens[(model, bench)]
        sources[(model, bench)] = (longest, "tokenizer (every prompt, on this machine)")
        return mean if rows == 1 else longest
    if (model, bench) not in sources:
        sources[(model, bench)] = prompt_lengths(config, model, bench, root, given)
    return sources[(model, bench)][0]


def study_cost(config: dict[str, Any], device: Device, root: str | None = None,
               prompt_tokens: dict[str, float] | None = None, shared_loads: bool | None = None) -> dict[str, Any]:
    """Per rule, per cell and in total: jobs, prompts, tokens, positions, weight bytes and
    device seconds; with where each input figure came from. `shared_loads` (default: as a
    run here would, `run.shared_loads.enabled`): the generation jobs of one load setting
    pay its load once, each other one only its start."""
    from tokenflip.run import shared_loads as sharing
    from tokenflip.study.plan import expand_cells, expand_pairs, load_settings, probe_targets

    shared = sharing.enabled() if shared_loads is None else shared_loads
    loaded: set[tuple[str, ...]] = set()

    given = prompt_tokens or {}
    models_dir = Path(root or ".") / MODELS_DIR
    cells = expand_cells(config)
    pairs = expand_pairs(config, cells)
    probes = probe_targets(config)
    used = sorted({c.model for c in cells} | {m for _, m, _ in probes})
    sizes: dict[str, ModelSize | None] = {m: model_size(m, config["models"][m], models_dir) for m in used}
    counts = {b: prompt_count(b, spec) for b, spec in config["benchmarks"].items()}
    sources: dict[tuple[str, str], tuple[float | None, str]] = {}
    per_model: dict[str, dict[str, float]] = {}
    per_cell: dict[str, float | None] = {}
    total: dict[str, float] = {k: 0 for k in ("cells", "prompts", "generated_tokens", "positions", "weight_bytes",
                                              "seconds")}
    unknown: set[tuple[str, str]] = set()
    start = device.cpu.job_start_s if device.cpu else 0.0
    # Other engines (llama.cpp, vLLM) run their own kernels: counted apart, not priced.
    cpu_cells = Counter(cell.engine for cell in cells if cell.engine != TRANSFORMERS)
    for cell in cells:
        if cell.engine in cpu_cells:
            continue
        spec = config["benchmarks"][cell.benchmark]
        limit = spec.get("max_new_tokens", config["generation"]["max_new_tokens"])
        size, prompts = sizes[cell.model], counts[cell.benchmark]
        length = _lengths(config, device, cell.model, cell.benchmark, cell.batch_size, root, given, sources)
        figures: dict[str, float | None] = dict.fromkeys(("prompts", "generated_tokens", "positions", "weight_bytes",
                                                          "seconds"))
        if prompts is not None:
            batches = math.ceil(prompts / cell.batch_size)
            figures.update(prompts=prompts, generated_tokens=prompts * limit)
            if size is not None:
                figures["weight_bytes"] = batches * limit * size.active * BYTES[cell.precision]
            if length is not None:
                figures["positions"] = batches * (length * cell.batch_size + (limit - 1) * cell.batch_size
                                                  if cell.cache == "on" else
                                                  cell.batch_size * (limit * length + limit * (limit - 1) / 2))
                if size is not None:
                    steps = int(expected_steps(device, cell.model, cell.benchmark, cell.batch_size, limit))
                    load = load_settings(cell) if shared else None
                    fixed = device.start_seconds() if load in loaded else device.job_seconds(
                        cell.model, size, cell.precision)
                    loaded |= {load} - {None}
                    figures["seconds"] = fixed + \
                        generation_seconds(device, cell.model, size, cell.precision, cell.cache == "on",
                                           cell.batch_size, batches, length, steps,
                                           config["interventions"][cell.intervention])
        per_cell[cell.id] = figures["seconds"]
        row = per_model.setdefault(cell.model, {k: 0 for k in total})
        for acc in (row, total):
            acc["cells"] += 1
            unknown |= {(cell.model, name) for name in _sum(acc, **figures)}
    probe_total, probe_rows = 0.0, {}
    for probe, model, bench in probes:
        size = sizes[model]
        length = _lengths(config, device, model, bench, 1, root, given, sources)
        limit = config["benchmarks"][bench].get("max_new_tokens", config["generation"]["max_new_tokens"])
        if size is None or length is None:
            unknown.add((model, f"probe {probe}"))
            continue
        options = config["probes"][probe]
        steps = int(expected_steps(device, model, bench, 1, limit))
        seconds = device.job_seconds(model, size, "fp32") + probe_seconds(
            device, model, size, probe, options, length, steps)
        probe_rows[f"{model}/{bench}/{probe}"] = seconds
        probe_total += seconds
    rules = {"prepare_model": len(used), "check_prompts": len({(c.model, c.benchmark) for c in cells}),
             "generate": len(cells), "compare": len(pairs), "probe": len(probes), "summarize": 1, "report": 1}
    other = 0.0
    if device.cpu:  # every job runs here: the CPU jobs' starts, the preparations and the scheduler itself
        other = start * (rules["prepare_model"] + rules["check_prompts"] + rules["compare"] + 3) + sum(
            device.cpu.prepare_s.values())
    loads = {"shared": shared, "loads": len(loaded) + sum(1 for c in cells if c.engine not in cpu_cells
                                                           and (not shared or load_settings(c) is None))}
    return {"rules": rules, "generate": total, "per_model": per_model, "per_cell": per_cell, "loads": loads,
            "probes": {"jobs": len(probes), "seconds": probe_total, "per_job": probe_rows},
            "other_jobs_seconds": other, "total_seconds": total["seconds"] + probe_total + other,
            "unknown": sorted(unknown), "cpu_cells": dict(sorted(cpu_cells.items())),
            "sources": {"parameters": {m: s.as_dict() if s else {"parameters": None, "from": "unknown"}
                                       for m, s in sizes.items()},
                        "prompt_tokens": {f"{m}/{b}": {"tokens": v[0], "from": v[1]} for (m, b), v in sources.items()}},
            "device": _describe(device)}


def check_prompt_tokens(config: dict[str, Any], prompt_tokens: dict[str, float]) -> None:
    """`CostInputError` unless every `--prompt-tokens` names a benchmark of the config and a
    finite number of tokens from 1 to MAX_PROMPT_TOKENS."""
    unknown = sorted(set(prompt_tokens) - set(config["benchmarks"]))
    if unknown:
        raise CostInputError(f"--prompt-tokens names benchmarks the config does not define: "
                             f"[{', '.join(shown(name, 40) for name in unknown[:10])}]")
    for name, tokens in prompt_tokens.items():
        if isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or not math.isfinite(tokens) \
                or not 1 <= tokens <= MAX_PROMPT_TOKENS:
            raise CostInputError(f"--prompt-tokens {name}={tokens!r}: expected a finite number of tokens from 1 to "
                                 f"{MAX_PROMPT_TOKENS:g}")


def price(config: dict[str, Any], device_kind: str = "gpu", bandwidth_gbs: float = 2000.0, tflops: float = 150.0,
          calibration: str | None = None, root: str | None = None,
          prompt_tokens: dict[str, float] | None = None) -> dict[str, Any]:
    """`plan --cost`: the device (a GPU, its overhead from `calibration`, or this CPU
    calibrated now), then `study_cost`. Every input is checked first and every figure last
    (`check_figures`): none comes out negative, NaN or infinite."""
    check_prompt_tokens(config, prompt_tokens or {})
    check_gpu(bandwidth_gbs, tflops)
    device = Device(bandwidth_gbs, tflops)
    if calibration:
        device.overhead_per_layer, device.overhead_source = gpu_overhead_from(calibration)
    if device_kind == "cpu":
        from tokenflip.study.cost.calibrate import calibrate
        from tokenflip.study.plan import expand_cells, probe_targets

        cells = [cell for cell in expand_cells(config) if cell.engine == TRANSFORMERS]  # other engines: not priced
        device.cpu = calibrate(config, cells, probe_targets(config), root=root)
    cost = study_cost(config, device, root=root, prompt_tokens=prompt_tokens)
    check_figures(cost)
    return cost


def _describe(device: Device) -> dict[str, Any]:
    if device.cpu:
        return {"kind": "cpu", "calibration": device.cpu.describe()}
    return {"kind": "gpu", "bandwidth_gbs": device.bandwidth_gbs, "tflops": device.tflops,
            "overhead_per_layer_ms": {b: s * 1e3 for b, s in device.overhead_per_layer.items()},
            "overhead_from": device.overhead_source, "load_gbs": device.load_gbs, "job_start_s": device.job_start_s}


def _si(x: float, unit: str = "") -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.1f} {prefix}{unit}"
    return f"{x:.0f} {unit}".strip()


BOUNDS = ("bounds: prompts and token positions are upper bounds (every prompt runs max_new_tokens{share}); "
          "{time}")
TIME_BOUND = {"gpu": "the roofline is a lower bound on each pass, the per-layer overhead a typical figure "
                     "(--calibration gpu-check.json: your GPU's); a gated FP32 head is priced as firing every step "
                     "(an upper bound)",
              "cpu": "the time per pass and per position is this machine's, measured; a gated FP32 head is priced "
                     "as firing every step (an upper bound)"}


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}" if seconds >= 360 else f"{seconds / 3600:.4f}"


def _device_line(d: dict[str, Any]) -> str:
    if d["kind"] == "cpu":
        c = d["calibration"]
        passes = ", ".join(f"{k} {v['a_ms']:g} ms + {v['b_ms_per_position']:g} ms/position"
                           for k, v in c["passes"].items())
        return f"device: this CPU, calibrated (one thread, process CPU time): {passes}; a job's start {c['job_start_s']} s"
    per_layer = ", ".join(f"bs{b} {ms:g}" for b, ms in d["overhead_per_layer_ms"].items())
    return (f"device: GPU, per pass max(roofline at {d['bandwidth_gbs']:g} GB/s and {d['tflops']:g} TFLOP/s, "
            f"per-layer step overhead {per_layer} ms ({d['overhead_from']})); "
            f"model load at {d['load_gbs']:g} GB/s, {d['job_start_s']:g} s a job's start")


def format_cost(cost: dict[str, Any]) -> str:
    d = cost["device"]
    hours = "CPU-hours" if d["kind"] == "cpu" else "GPU-hours"
    lines = ["jobs per rule: " + ", ".join(f"{rule} {n}" for rule, n in cost["rules"].items()), _device_line(d),
             BOUNDS.format(share="; on a calibrated CPU the time uses the measured lengths" if d["kind"] == "cpu"
                           else "", time=TIME_BOUND[d["kind"]])]
    lines.append(f"{'generate':24s} {'cells':>6s} {'prompts':>9s} {'tokens':>10s} {'positions':>10s} "
                 f"{'weights read':>13s} {hours:>10s}")

    def row(name, r, missing):
        """One line; a figure some cells could not count is marked '+?' (a lower bound)."""
        shown = {"prompts": f"{r['prompts']:,d}", "generated_tokens": f"{r['generated_tokens']:,d}",
                 "positions": _si(r["positions"]), "weight_bytes": _si(r["weight_bytes"], "B"),
                 "seconds": _hours(r["seconds"])}
        shown = {k: v + ("+?" if k in missing else "") for k, v in shown.items()}
        return (f"{name:24s} {r['cells']:6d} {shown['prompts']:>9s} {shown['generated_tokens']:>10s} "
                f"{shown['positions']:>10s} {shown['weight_bytes']:>13s} {shown['seconds']:>10s}")

    for model, r in sorted(cost["per_model"].items()):
        lines.append(row(model, r, {what for m, what in cost["unknown"] if m == model}))
    lines.append(row("all cells", cost["generate"], {what for _, what in cost["unknown"]}))
    priced = sorted(((s, c) for c, s in cost["per_cell"].items() if s is not None), reverse=True)
    shown = priced if len(priced) <= 20 else priced[:10]
    lines.append(f"per cell ({'all' if shown is priced else f'the {len(shown)} longest of {len(priced)}'}), "
                 f"{hours}:")
    lines += [f"  {cell}: {_hours(s)}" for s, cell in shown]
    loads = cost.get("loads") or {}
    if loads:
        lines.append(f"model loads for the {cost['rules']['generate'] - sum(cost.get('cpu_cells', {}).values())} "
                     f"transformers cells: {loads['loads']}" + (
                         " (the cells of one load setting share a warm process, each paying its start alone; more "
                         "loads where they run side by side)" if loads["shared"] else
                         " (one a job: sharing is off, TOKENFLIP_SHARE_LOADS=0 or a cluster job)"))
    lines.append(f"probe jobs ({cost['probes']['jobs']}): {_hours(cost['probes']['seconds'])} {hours}")
    if d["kind"] == "cpu":
        lines.append(f"other jobs and the scheduler: {_hours(cost['other_jobs_seconds'])} {hours}")
    lines.append(f"total: {_hours(cost['total_seconds'])} {hours} ({cost['total_seconds']:,.0f} s)")
    for m, s in cost["sources"]["parameters"].items():
        active = (f", {_si(s['active_parameters'])} active" if s.get("active_parameters") not in
                  (None, s["parameters"]) else "")
        layers = f", {s['layers']} layers" if s.get("layers") else ""
        lines.append(f"  {m}: {_si(s['parameters']) if s['parameters'] else '?'} parameters{active}{layers} "
                     f"({s['from']})")
    by_benchmark: dict[tuple[str, Any, str], list[str]] = {}
    for mb, s in cost["sources"]["prompt_tokens"].items():
        model, bench = mb.split("/", 1)
        by_benchmark.setdefault((bench, s["tokens"], s["from"]), []).append(model)
    for (bench, tokens, source), models in sorted(by_benchmark.items(), key=lambda kv: kv[0][0]):
        who = models[0] if len(models) == 1 else f"{len(models)} models"
        lines.append(f"  {bench} ({who}): {tokens:.0f} prompt tokens ({source})" if tokens else
                     f"  {bench} ({who}): prompt length {source}")
    for engine, n in cost.get("cpu_cells", {}).items():
        where = "run on the CPU" if engine == "llama.cpp" else "run in the engine's own kernels and scheduler"
        lines.append(f"  not priced: {n} {engine} cell(s), which {where} (perf/engines.py, perf/vllm.py time them)")
    if cost["unknown"]:
        lines.append("  not counted (unknown inputs): " + ", ".join(f"{m} {what}" for m, what in cost["unknown"]))
    return "\n".join(lines)
