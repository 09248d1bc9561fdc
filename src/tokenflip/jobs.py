"""Typed job specs: what crosses from the plan (in Snakemake) to a worker (a job).

A `Cell` names one generation job by its axis values, a `Pair` two cells that differ in
one axis. A `CellJob` / `ProbeJob` is the complete input of a worker besides the prepared
model: Snakemake passes it as JSON in the rule's params (so a changed setting reruns
exactly the jobs it affects), the worker parses it back with `from_json`, which refuses
missing, unknown or mistyped fields by name, and the same JSON is stored as the result's
provenance (`settings`), where the summary compares it with what the config asks for.
"""

from __future__ import annotations

import json
from dataclasses import MISSING as _MISSING
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Axes that are always encoded in the cell file name (model and benchmark are directories).
NAME_AXES = ("precision", "cache", "batch_size", "decoding", "intervention")
# Further axes, encoded as `-axis=value` only when not at their default, so that adding
# one to a config leaves the names (and files) of every existing cell unchanged.
# `default` means: what the library or the run's `generation` settings choose.
# `repeat` changes nothing but the cell's name: comparing `repeat: default` with `2` asks
# whether the same cell run twice is bitwise identical (arXiv 2609.26621 §6.1).
# The cache forms serving engines turn on (see `caches`): how the prompt is prefilled
# (`prefill_chunk`), a shared prefix computed once (`prefix_cache`), the cached keys' and
# values' storage format (`kv_dtype`), a static cache (`cache_impl`), a compiled forward.
# `engine`: the inference engine that runs the cell (`engines`: transformers, llama.cpp, vllm).
# A serving engine's scheduler knobs: requests in flight (`concurrency`), batch-invariant
# kernels (`batch_invariant`), the devices a model is split over (`tensor_parallel`).
EXTRA_AXES = {"attention": "default", "threads": "default", "device": "default", "deterministic": "default",
              "repeat": "default", "prefill_chunk": "default", "prefix_cache": "off", "kv_dtype": "default",
              "cache_impl": "dynamic", "compile": "off", "engine": "transformers", "concurrency": "default",
              "batch_invariant": "off", "tensor_parallel": "1"}
CACHE_FORM_AXES = ("prefill_chunk", "prefix_cache", "kv_dtype", "cache_impl", "compile")
COMPARABLE_AXES = NAME_AXES + tuple(EXTRA_AXES)
AXIS_DEFAULTS = {"decoding": "greedy", "intervention": "none", **EXTRA_AXES}


class JobSpecError(ValueError):
    """A job spec (JSON from the plan) is missing, has unknown or has mistyped fields."""


@dataclass(frozen=True, order=True)
class Cell:
    model: str
    benchmark: str
    precision: str
    cache: str
    batch_size: int
    decoding: str
    intervention: str
    attention: str = "default"
    threads: str = "default"
    device: str = "default"
    deterministic: str = "default"
    repeat: str = "default"
    prefill_chunk: str = "default"
    prefix_cache: str = "off"
    kv_dtype: str = "default"
    cache_impl: str = "dynamic"
    compile: str = "off"
    engine: str = "transformers"
    concurrency: str = "default"
    batch_invariant: str = "off"
    tensor_parallel: str = "1"

    @property
    def name(self) -> str:
        core = f"{self.precision}-{self.cache}-bs{self.batch_size}-{self.decoding}-{self.intervention}"
        extra = "".join(f"-{axis}={self.value(axis)}" for axis, default in EXTRA_AXES.items()
                        if self.value(axis) != default)
        return core + extra

    @property
    def id(self) -> str:
        return f"{self.model}/{self.benchmark}/{self.name}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def value(self, axis: str) -> Any:
        return getattr(self, axis)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Cell":
        if not isinstance(d, dict):
            raise JobSpecError(f"cell: expected a mapping, got {d!r}")
        names = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is _MISSING}
        missing = sorted(required - set(d))
        unknown = sorted(set(d) - names)
        if missing or unknown:
            raise JobSpecError(f"cell: missing fields {missing}, unknown fields {unknown}")
        try:
            return cls(**{k: (int(v) if k == "batch_size" else str(v)) for k, v in d.items()})
        except (TypeError, ValueError) as exc:
            raise JobSpecError(f"cell: {exc}") from None

    @classmethod
    def from_name(cls, model: str, benchmark: str, name: str) -> "Cell":
        parts = name.split("-")
        if len(parts) < 5 or not parts[2].startswith("bs"):
            raise JobSpecError(f"cell name {name!r}: expected precision-cache-bsN-decoding-intervention[-axis=value]")
        precision, cache, bs, decoding, intervention = parts[:5]
        extra = dict(part.split("=", 1) for part in parts[5:] if "=" in part)
        unknown = sorted(set(extra) - set(EXTRA_AXES))
        if unknown or len(extra) != len(parts) - 5:
            raise JobSpecError(f"cell name {name!r}: unknown axes {unknown or parts[5:]}")
        return cls(model, benchmark, precision, cache, int(bs.removeprefix("bs")), decoding, intervention,
                   **extra)


@dataclass(frozen=True, order=True)
class Pair:
    axis: str
    a: Cell
    b: Cell

    @property
    def context(self) -> str:
        """The values the two cells share, in file-name order, with the compared axis as 'x'."""
        parts = []
        for axis in NAME_AXES:
            v = "x" if axis == self.axis else self.a.value(axis)
            parts.append(f"bs{v}" if axis == "batch_size" and v != "x" else str(v))
        for axis, default in EXTRA_AXES.items():
            if axis == self.axis:
                parts.append(f"{axis}=x")
            elif self.a.value(axis) != default:
                parts.append(f"{axis}={self.a.value(axis)}")
        return "-".join(parts)

    @property
    def label(self) -> str:
        return f"{self.axis}: {_fmt(self.axis, self.a)} vs {_fmt(self.axis, self.b)}"

    @property
    def id(self) -> str:
        return (f"{self.a.model}/{self.a.benchmark}/{self.axis}/"
                f"{self.a.value(self.axis)}_vs_{self.b.value(self.axis)}/{self.context}")

    def shared(self) -> dict[str, Any]:
        """Every axis value the two cells share (the compared axis left out)."""
        return {k: v for k, v in self.a.as_dict().items() if k != self.axis}

    @classmethod
    def from_parts(cls, model: str, benchmark: str, axis: str, a: str, b: str, context: str) -> "Pair":
        """Rebuild a pair from the pieces of its path (what Snakemake wildcards hold)."""
        if axis not in COMPARABLE_AXES:
            raise JobSpecError(f"pair: unknown axis {axis!r}; known: {list(COMPARABLE_AXES)}")
        values = context.split("-")
        d: dict[str, Any] = {"model": model, "benchmark": benchmark}
        for name, v in zip(NAME_AXES, values):
            d[name] = v.removeprefix("bs") if name == "batch_size" and v != "x" else v
        d.update(part.split("=", 1) for part in values[len(NAME_AXES):])
        return cls(axis, Cell.from_dict({**d, axis: a}), Cell.from_dict({**d, axis: b}))

    @classmethod
    def from_id(cls, pair_id: str) -> "Pair":
        """Inverse of `Pair.id`."""
        parts = pair_id.split("/")
        if len(parts) != 5 or "_vs_" not in parts[3]:
            raise JobSpecError(f"pair id {pair_id!r}: expected model/benchmark/axis/a_vs_b/context")
        model, benchmark, axis, a_vs_b, context = parts
        a, b = a_vs_b.split("_vs_", 1)
        return cls.from_parts(model, benchmark, axis, a, b, context)


def _fmt(axis: str, cell: Cell) -> str:
    v = cell.value(axis)
    return f"bs{v}" if axis == "batch_size" else str(v)


def _parse(cls, data: Any, what: str):
    """Build dataclass `cls` from a JSON mapping, naming every missing or unknown field."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise JobSpecError(f"{what}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise JobSpecError(f"{what}: expected a JSON object, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    required = {name for name, f in known.items() if f.default is _MISSING and f.default_factory is _MISSING}
    missing, unknown = sorted(required - set(data)), sorted(set(data) - set(known))
    if missing or unknown:
        raise JobSpecError(f"{what}: missing fields {missing}" + (f", unknown fields {unknown}" if unknown else "")
                           + f"; a {what} is made by `tokenflip plan` / the Snakefile from a config")
    return data


def _check_types(what: str, checks: dict[str, tuple[Any, type | tuple[type, ...]]]) -> None:
    for name, (value, types) in checks.items():
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in
                                            (types if isinstance(types, tuple) else (types,))):
            raise JobSpecError(f"{what}: field {name!r} has the wrong type ({value!r})")


@dataclass(frozen=True)
class CellJob:
    """Everything one cell's output depends on besides the prepared model."""

    cell: Cell
    run_seed: int
    model: dict
    benchmark: dict
    max_new_tokens: int
    decoding: dict
    intervention: dict
    record_top_k: int
    device: str
    threads: int | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["cell"] = self.cell.as_dict()
        return d

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def from_json(cls, data: Any) -> "CellJob":
        data = dict(_parse(cls, data, "cell job"))
        data["cell"] = Cell.from_dict(data["cell"])
        _check_types("cell job", {"run_seed": (data["run_seed"], int), "model": (data["model"], dict),
                                  "benchmark": (data["benchmark"], dict),
                                  "max_new_tokens": (data["max_new_tokens"], int),
                                  "decoding": (data["decoding"], dict), "intervention": (data["intervention"], dict),
                                  "record_top_k": (data["record_top_k"], int), "device": (data["device"], str),
                                  "threads": (data.get("threads"), (int, type(None)))})
        return cls(**data)


@dataclass(frozen=True)
class ProbeJob:
    """Everything one probe job (probe × model × benchmark) depends on."""

    probe: str
    model_name: str
    benchmark_name: str
    run_seed: int
    model: dict
    benchmark: dict
    max_new_tokens: int
    prompts: int
    options: dict = field(default_factory=dict)
    # How the prompts are chosen: "diverged" (from the results of the pairs the probe
    # explains, `explains`: their ids) or "first" (the benchmark's first `prompts`).
    select: str = "first"
    explains: list = field(default_factory=list)
    device: str = "auto"
    threads: int | None = None
    # The probe's table version (Probe.version): tables of another version are not read,
    # and Snakemake sees changed params and makes them again.
    version: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def from_json(cls, data: Any) -> "ProbeJob":
        data = _parse(cls, data, "probe job")
        _check_types("probe job", {"probe": (data["probe"], str), "run_seed": (data["run_seed"], int),
                                   "model": (data["model"], dict), "benchmark": (data["benchmark"], dict),
                                   "max_new_tokens": (data["max_new_tokens"], int),
                                   "prompts": (data["prompts"], int), "options": (data.get("options", {}), dict),
                                   "version": (data.get("version", 1), int)})
        return cls(**data)
