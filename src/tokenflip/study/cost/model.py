"""What one forward pass, one cell and one probe job cost on a device.

A pass over `n` token positions takes, on a GPU, the larger of its roofline (reading the
active weights at the memory bandwidth; 2 x active parameters FLOPs per position at the
matrix throughput) and the engine's per-step overhead at that batch size (an eager
transformers step is launch-bound at small batch sizes: a fixed time per decoder layer,
whatever the bandwidth). On a CPU it is `a + b x n`, both measured on the machine itself
(`calibrate`). Interventions are priced by what they compute: FP32 weights or compute at
fp32's rate, consensus as one pass per precision, the FP32 head as one more head product
in fp32 per step; probes as the replays, patched steps and grafts they run.

Bounds. Token counts are upper bounds (every prompt runs `max_new_tokens`; a CPU
calibration measures how long generations really are and prices those). The roofline is a
lower bound on a pass; the overhead table is a typical figure, neither bound. A gated FP32
head is priced as if it fired at every step (an upper bound); cache forms (FP8 cache,
chunked prefill) and the attention kernel are priced as the default cache and kernel.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from tokenflip.core.inputs import shown
from tokenflip.models.size import ModelSize

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# fp32 matrix products (without TF32) run at about an eighth of the 16-bit rate on
# datacenter GPUs (A100: 19.5 vs 312 TFLOP/s peak).
FP32_SLOWDOWN = 8

# Per-step overhead of an eager transformers step on a GPU, seconds per decoder layer, by
# batch size. Not measured by this project (the machines it is developed on have no GPU):
# it is the launch-bound rate commonly reported for transformers' eager generate() at
# small batch sizes, about 30 tokens/s for Llama-2-7B (32 layers) on an A100 at batch
# size 1, where the roofline says 150. `--calibration gpu-check.json` replaces it with the
# GPU check's own measurement (perf/gpu.sh) on the user's GPU.
GPU_OVERHEAD_PER_LAYER = {1: 1.0e-3, 2: 1.0e-3, 4: 1.05e-3, 8: 1.1e-3}
GPU_OVERHEAD_SOURCE = "typical eager transformers step (~30 tok/s for a 32-layer 7B at batch size 1), not measured"

# Kinds whose weights or products are fp32 whatever the cell's precision.
_FP32_KINDS = {"global_fp32", "fp32_oracle", "fp32_matmul"}


@dataclass
class CpuCalibration:
    """Measured on this machine, one thread, in process CPU time: per (model, precision) the
    seconds of a pass (`a`) and of each position it processes (`b`); each job's start
    (interpreter, imports) and each model's load; how many tokens generations really run
    per (model, benchmark), as a share of `max_new_tokens` (mean, and the longest seen)."""

    passes: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    job_start_s: float = 0.0
    load_s: dict[str, float] = field(default_factory=dict)
    prepare_s: dict[str, float] = field(default_factory=dict)
    length_share: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    prompt_tokens: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # mean, longest
    cell_job_s: dict[str, float] = field(default_factory=dict)  # a generation job but its decoding

    def describe(self) -> dict[str, Any]:
        return {"passes": {f"{m}/{p}": {"a_ms": round(a * 1e3, 2), "b_ms_per_position": round(b * 1e3, 3)}
                           for (m, p), (a, b) in self.passes.items()},
                "job_start_s": round(self.job_start_s, 2), "cell_job_s": self.cell_job_s, "load_s": self.load_s, "prepare_s": self.prepare_s,
                "length_share": {f"{m}/{b}": {"mean": round(s[0], 3), "max": round(s[1], 3)}
                                 for (m, b), s in self.length_share.items()},
                "prompt_tokens": {f"{m}/{b}": {"mean": round(s[0], 1), "max": s[1]}
                                  for (m, b), s in self.prompt_tokens.items()}}


@dataclass
class Device:
    """A GPU (roofline and overhead table) or, with `cpu`, this machine's calibration."""

    bandwidth_gbs: float = 2000.0   # HBM bandwidth, GB/s (an A100-80GB: 2,039)
    tflops: float = 150.0           # 16-bit dense matrix throughput actually reached, TFLOP/s
    overhead_per_layer: dict[int, float] = field(default_factory=lambda: dict(GPU_OVERHEAD_PER_LAYER))
    overhead_source: str = GPU_OVERHEAD_SOURCE
    load_gbs: float = 2.0           # reading a checkpoint from local disk, GB/s
    job_start_s: float = 15.0       # a GPU job's interpreter, imports and CUDA start
    cpu: CpuCalibration | None = None

    @property
    def kind(self) -> str:
        return "cpu" if self.cpu else "gpu"

    def overhead(self, rows: int) -> float:
        """Per-layer step overhead at `rows` rows: the table's entry at or above it."""
        table = self.overhead_per_layer
        return table[min((b for b in table if b >= rows), default=max(table))]

    def pass_seconds(self, model: str, size: ModelSize, precision: str, positions: float, rows: int = 1) -> float:
        """One forward pass over `positions` token positions (all rows of the batch)."""
        if self.cpu:
            a, b = self.cpu.passes[(model, precision)]
            return a + b * positions
        memory = size.active * BYTES[precision] / (self.bandwidth_gbs * 1e9)
        flops = self.tflops * 1e12 / (FP32_SLOWDOWN if precision == "fp32" else 1)
        return max(memory, 2 * size.active * positions / flops, self.overhead(rows) * (size.layers or 0))

    def head_fp32_seconds(self, model: str, size: ModelSize, rows: int) -> float:
        """The LM head recomputed in fp32 for `rows` positions (intervention C)."""
        if not size.head:
            return 0.0
        if self.cpu:
            a, b = self.cpu.passes[(model, "fp32")]
            return b * rows * size.head / size.active
        return max(size.head * BYTES["fp32"] / (self.bandwidth_gbs * 1e9),
                   2 * size.head * rows * FP32_SLOWDOWN / (self.tflops * 1e12), self.overhead(rows))

    def start_seconds(self) -> float:
        """A job's start alone: what a generation job costs that hands itself to a warm
        process already holding its model's load (`run.shared_loads`)."""
        return self.cpu.job_start_s if self.cpu else self.job_start_s

    def job_seconds(self, model: str, size: ModelSize | None, precision: str) -> float:
        """A generation or probe job's fixed part: its start and the model's load."""
        if self.cpu:
            if model in self.cpu.cell_job_s:
                return self.cpu.cell_job_s[model]
            return self.cpu.job_start_s + self.cpu.load_s.get(model, 0.0)
        return self.job_start_s + (0.0 if size is None else size.total * BYTES[precision] / (self.load_gbs * 1e9))


def _steps(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec["of"] if spec.get("kind") == "compose" else [spec]


def intervention_work(spec: dict[str, Any], precision: str) -> tuple[list[str], bool]:
    """(the precisions each step's forward pass runs in, whether the head is recomputed in fp32)."""
    kinds = {s.get("kind", "none"): s for s in _steps(spec)}
    if "consensus" in kinds:
        passes = list(kinds["consensus"].get("precisions", ["bf16", "fp16"]))
    else:
        passes = ["fp32" if kinds.keys() & _FP32_KINDS else precision]
    return passes, "fp32_head" in kinds


def batch_positions(prompt_tokens: float, rows: int, steps: int, cache: bool) -> list[float]:
    """Positions each pass of one batch processes: with the cache the prefill, then one per
    row a step; without it the whole sequence at every step (quadratic in the steps)."""
    if cache:
        return [prompt_tokens * rows] + [rows] * (steps - 1)
    return [(prompt_tokens + step) * rows for step in range(steps)]


def passes_seconds(device: Device, model: str, size: ModelSize, precision: str, positions: list[float],
                   rows: int = 1) -> float:
    return sum(device.pass_seconds(model, size, precision, n, rows) for n in positions)


def probe_seconds(device: Device, model: str, size: ModelSize, probe: str, options: dict[str, Any],
                  prompt_tokens: float, steps: int) -> float:
    """One probe job: per chosen prompt, the replays, patched steps and grafts it runs (at a
    divergence halfway through the generation)."""
    layers, half = size.layers or 0, max(1, steps // 2)
    cached, uncached = batch_positions(prompt_tokens, 1, steps, True), batch_positions(prompt_tokens, 1, steps, False)
    prefix = batch_positions(prompt_tokens, 1, half, True)
    total = 0.0
    if probe == "kv_cache":
        for p in options.get("precisions", ["fp16"]):
            per = passes_seconds(device, model, size, p, cached + uncached)
            patch = passes_seconds(device, model, size, p, prefix + [prompt_tokens + half] + [1] * (2 * layers + 3))
            forms = len(options.get("forms", [])) * passes_seconds(device, model, size, p, cached)
            total += per + options.get("patch_steps", 0) * patch + forms
    elif probe == "precision":
        for pair in options.get("pairs", []):
            for p in pair:
                graft = passes_seconds(device, model, size, p, prefix + [1] * (layers + 3))
                total += passes_seconds(device, model, size, p, cached) + options.get("flips", 0) * graft
    else:  # a probe this module does not know: one cached and one uncached replay per prompt
        total = passes_seconds(device, model, size, "fp32", cached + uncached)
    return options.get("prompts", 1) * total


def generation_seconds(device: Device, model: str, size: ModelSize, precision: str, cache: bool, rows: int,
                       batches: int, prompt_tokens: float, steps: int, intervention: dict[str, Any]) -> float:
    """A cell's decoding: each batch's passes in each precision its intervention runs, and
    the FP32 head at every step where it is recomputed."""
    passes, head = intervention_work(intervention, precision)
    positions = batch_positions(prompt_tokens, rows, steps, cache)
    seconds = sum(passes_seconds(device, model, size, p, positions, rows) for p in passes)
    if head:
        seconds += steps * device.head_fp32_seconds(model, size, rows)
    return batches * seconds


def expected_steps(device: Device, model: str, benchmark: str, rows: int, max_new_tokens: int) -> float:
    """Steps a batch runs: `max_new_tokens` (an upper bound), or on a calibrated CPU the
    measured share (a batch runs until its longest row ends)."""
    share = device.cpu.length_share.get((model, benchmark)) if device.cpu else None
    if share is None:
        return max_new_tokens
    return max(1, math.ceil(max_new_tokens * (share[0] if rows == 1 else share[1])))


class CostInputError(ValueError):
    """An input of `plan --cost` that cannot be used (the message says which and why)."""


class CalibrationFileError(CostInputError):
    """A calibration file that does not say what a step costs."""


# What a GPU may be described as (`plan --cost --bandwidth-gbs/--tflops`): from slower than
# any GPU's memory and matrix units to far beyond the fastest. Within them every time is a
# finite positive number of seconds (0, NaN or 1e-300 would make it infinite or NaN).
GPU_BANDWIDTH_GBS = (1.0, 1e6)
GPU_TFLOPS = (1e-3, 1e6)
# The longest prompt `--prompt-tokens` may assume, tokens: more than any model's context.
MAX_PROMPT_TOKENS = 10**7
# A calibration's per-layer step overhead, milliseconds: eager steps take about 1 ms a layer;
# a second a layer is no GPU's, and larger figures would be priced as if real.
OVERHEAD_PER_LAYER_MS = (1e-6, 1e3)
# Batch sizes a calibration may give an overhead for.
CALIBRATION_BATCH_SIZES = (1, 2**16)
# The most a calibration file holds: a GPU check's gpu-check.json is tens of kB.
MAX_CALIBRATION_BYTES = 2**20


def check_gpu(bandwidth_gbs: Any, tflops: Any) -> None:
    """`CostInputError` unless both are finite numbers within GPU_BANDWIDTH_GBS and GPU_TFLOPS."""
    for flag, value, (low, high), unit in (("--bandwidth-gbs", bandwidth_gbs, GPU_BANDWIDTH_GBS, "GB/s"),
                                           ("--tflops", tflops, GPU_TFLOPS, "TFLOP/s")):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not low <= value <= high:
            raise CostInputError(f"{flag} {value!r}: expected a finite number from {low:g} to {high:g} {unit}")


def _in_range(value: Any, low: float, high: float) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) \
        and low <= value <= high


def _batch_size(where: str, text: Any) -> int:
    """A calibration's batch size, "8" (a key of the JSON), checked."""
    low, high = CALIBRATION_BATCH_SIZES
    if isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 6 and low <= int(text) <= high:
        return int(text)
    raise CalibrationFileError(f"{where}: batch size {shown(text, 40)} is not a whole number from {low} to {high}")


def _overhead_ms(where: str, ms: Any) -> float:
    """A per-layer overhead in milliseconds, checked against OVERHEAD_PER_LAYER_MS."""
    if not _in_range(ms, *OVERHEAD_PER_LAYER_MS):
        raise CalibrationFileError(f"{where}: {shown(json.dumps(ms), 40)} is not a number of milliseconds from "
                                   f"{OVERHEAD_PER_LAYER_MS[0]:g} to {OVERHEAD_PER_LAYER_MS[1]:g} a layer")
    return float(ms)


FILE_FORMS = 'a GPU check\'s gpu-check.json or {"overhead_per_layer_ms": {"1": 1.0, "8": 1.1}}'


def gpu_overhead_from(path: str) -> tuple[dict[int, float], str]:
    """The per-layer step overhead by batch size from a saved file: the GPU check's
    `gpu-check.json` (perf/gpu.sh: its decode_vs_generate figures at batch sizes 1 and 8 on a
    7B-width model of `layers` layers; the measured step includes reading its weights, so
    the overhead taken from it is an upper bound) or `{"overhead_per_layer_ms": {"1": 1.0}}`.
    The file is checked before it is read (a regular file of at most 1 MiB, JSON of finite
    numbers and bounded nesting: `inputs.read_json_file`) and every figure taken from it is
    within OVERHEAD_PER_LAYER_MS, so that every time priced from it is finite and positive."""
    from tokenflip.core.inputs import InputError, read_json_file

    where = f"--calibration {path}"
    try:
        data = read_json_file(path, "--calibration", MAX_CALIBRATION_BYTES)
    except InputError as exc:
        raise CalibrationFileError(f"{exc}; expected {FILE_FORMS}") from None
    if not isinstance(data, dict):
        raise CalibrationFileError(f"{where}: a JSON {type(data).__name__}, not an object; expected {FILE_FORMS}")
    if "overhead_per_layer_ms" in data:
        table = data["overhead_per_layer_ms"]
        if not isinstance(table, dict) or not table:
            raise CalibrationFileError(f"{where}: overhead_per_layer_ms must map batch sizes to milliseconds, "
                                       f"e.g. {{\"1\": 1.0, \"8\": 1.1}}")
        key = f"{where}: overhead_per_layer_ms"
        source = data.get("source")
        return ({_batch_size(key, b): _overhead_ms(f"{key}.{b}", ms) / 1e3 for b, ms in table.items()},
                source[:200] if isinstance(source, str) else str(path))
    try:
        perf = data["parts"]["perf"]
        figures = next(c["figures"] for c in perf["checks"] if c["name"] == "decode_vs_generate")
        layers = perf["layers"]
        decode = {bs: f["tok_s_wall"]["decode"] for bs, f in figures.items()}
        if not decode:
            raise KeyError("bs1")
    except (KeyError, StopIteration, TypeError, AttributeError):
        raise CalibrationFileError(f"{where}: neither overhead_per_layer_ms nor a GPU check's "
                                   f"parts.perf decode_vs_generate figures with their layers") from None
    if not (isinstance(layers, int) and not isinstance(layers, bool) and 1 <= layers <= 10_000):
        raise CalibrationFileError(f"{where}: parts.perf.layers: {shown(json.dumps(layers), 40)} is not a number of "
                                   f"layers from 1 to 10000")
    table = {}
    for bs, tok_s in decode.items():
        key = f"{where}: decode_vs_generate.figures.{bs}"
        rows = _batch_size(key, bs.removeprefix("bs") if bs.startswith("bs") else bs)
        if not _in_range(tok_s, 1e-9, 1e15):
            raise CalibrationFileError(f"{key}.tok_s_wall.decode: {shown(json.dumps(tok_s), 40)} is not a positive "
                                       f"finite number of tokens a second")
        table[rows] = _overhead_ms(f"{key} (N / tok_s_wall.decode / layers)", rows / tok_s / layers * 1e3) / 1e3
    environment = data.get("environment")
    gpu = environment.get("gpu") if isinstance(environment, dict) else None
    name = gpu.get("name") if isinstance(gpu, dict) else None
    return table, f"measured by the GPU check on {name[:80] if isinstance(name, str) else 'a GPU'} ({path})"


def check_figures(cost: Any, where: str = "") -> None:
    """`CostInputError` at the first figure of a priced study that is negative, NaN or
    infinite (an input beyond what is checked, such as a prepared model's config.json with a
    negative size): such a figure is refused, never printed."""
    stack = [(where, cost)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{key}.{k}" if key else str(k), v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{key}.{i}", v) for i, v in enumerate(value))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and \
                (not math.isfinite(value) or value < 0):
            raise CostInputError(f"the figure {key} came out as {value!r}, which no cost can be: an input "
                                 f"(a model's configuration, a prompt length) is out of range; nothing is printed")
