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
from dataclasses import asdict, dataclass, field, fields, make_dataclass, replace
from typing import Any

from tokenflip.core.axes import ALL_AXES, AXES, CORE_AXES, FURTHER_AXES
from tokenflip.core.inputs import loads_json


class JobSpecError(ValueError):
    """A job spec (JSON from the plan) is missing, has unknown or has mistyped fields."""


def _cell_fields() -> list:
    """model, benchmark, then every axis in table order: the core axes required, the
    further ones defaulting to their default (so a cell made before an axis existed reads)."""
    out: list = [("model", str), ("benchmark", str)]
    for axis in AXES.values():
        kind = int if axis.integer else str
        out.append((axis.name, kind) if axis.core else (axis.name, kind, field(default=axis.grid_default)))
    return out


# A cell's fields are the table of axes' (one entry per axis, `core.axes`), so they are made
# from it; the class below adds what a cell is besides its values.
_CellFields = make_dataclass("_CellFields", _cell_fields(), frozen=True, order=True,
                             namespace={"__module__": __name__})


@dataclass(frozen=True, order=True)
class Cell(_CellFields):
    """One generation job, by its model, benchmark and axis values (its fields: model,
    benchmark, then every axis of `core.axes.AXES` in table order)."""

    @property
    def name(self) -> str:
        core = "-".join(f"{AXES[axis].prefix}{self.value(axis)}" for axis in CORE_AXES)
        extra = "".join(f"-{axis}={self.value(axis)}" for axis, default in FURTHER_AXES.items()
                        if self.value(axis) != default)
        return core + extra

    @property
    def id(self) -> str:
        return f"{self.model}/{self.benchmark}/{self.name}"

    def fields(self) -> dict[str, Any]:
        """Every field, every axis included (the summary's columns)."""
        return asdict(self)

    def as_dict(self) -> dict[str, Any]:
        """Every field, but an axis added after cells existed only away from its default
        (`Axis.recorded_only_when_set`); `from_dict` reads it back either way."""
        return {key: value for key, value in asdict(self).items()
                if not (key in AXES and AXES[key].recorded_only_when_set and value == AXES[key].grid_default)}

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
            return cls(**{k: (AXES[k].value(v) if k in AXES else str(v)) for k, v in d.items()})
        except (TypeError, ValueError) as exc:
            raise JobSpecError(f"cell: {exc}") from None

    @classmethod
    def from_name(cls, model: str, benchmark: str, name: str) -> "Cell":
        parts = name.split("-")
        n = len(CORE_AXES)
        if len(parts) < n or any(not parts[i].startswith(AXES[a].prefix) for i, a in enumerate(CORE_AXES)):
            raise JobSpecError(f"cell name {name!r}: expected {'-'.join(AXES[a].prefix + a for a in CORE_AXES)}"
                               f"[-axis=value]")
        core = {axis: parts[i].removeprefix(AXES[axis].prefix) for i, axis in enumerate(CORE_AXES)}
        extra = dict(part.split("=", 1) for part in parts[n:] if "=" in part)
        unknown = sorted(set(extra) - set(FURTHER_AXES))
        if unknown or len(extra) != len(parts) - n:
            raise JobSpecError(f"cell name {name!r}: unknown axes {unknown or parts[n:]}")
        try:
            return cls.from_dict({"model": model, "benchmark": benchmark, **core, **extra})
        except JobSpecError as exc:
            raise JobSpecError(f"cell name {name!r}: {exc}") from None


@dataclass(frozen=True, order=True)
class Pair:
    axis: str
    a: Cell
    b: Cell

    @property
    def context(self) -> str:
        """The values the two cells share, in file-name order, with the compared axis as 'x'."""
        parts = []
        for axis in CORE_AXES:
            parts.append("x" if axis == self.axis else f"{AXES[axis].prefix}{self.a.value(axis)}")
        for axis, default in FURTHER_AXES.items():
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
        return {k: v for k, v in self.a.fields().items() if k != self.axis}

    @classmethod
    def from_parts(cls, model: str, benchmark: str, axis: str, a: str, b: str, context: str) -> "Pair":
        """Rebuild a pair from the pieces of its path (what Snakemake wildcards hold)."""
        if axis not in ALL_AXES:
            raise JobSpecError(f"pair: unknown axis {axis!r}; known: {list(ALL_AXES)}")
        values = context.split("-")
        d: dict[str, Any] = {"model": model, "benchmark": benchmark}
        for name, v in zip(CORE_AXES, values):
            d[name] = v.removeprefix(AXES[name].prefix) if v != "x" else v
        d.update(part.split("=", 1) for part in values[len(CORE_AXES):])
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
    return f"{AXES[axis].prefix}{cell.value(axis)}"


def _parse(cls, data: Any, what: str):
    """Build dataclass `cls` from a JSON mapping, naming every missing or unknown field."""
    if isinstance(data, str):
        try:
            data = loads_json(data, what)
        except ValueError as exc:
            raise JobSpecError(str(exc)) from None
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
    # A live endpoint's entry (`endpoints.<name>`) and the background load the cell runs
    # under (`loads.<label>`); absent from the JSON of every other cell, so that adding
    # them changed no existing cell's job.
    endpoint: dict | None = None
    load: dict | None = None
    # A block of the cell's prompts, [first, end) of the benchmark's order (`study.rounds`;
    # end None: to the benchmark's last); absent from a whole cell's JSON.
    prompts: list | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["cell"] = self.cell.as_dict()
        for key in ("endpoint", "load", "prompts"):
            if d[key] is None:
                del d[key]
        return d

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    def block(self, first: int, end: int | None) -> "CellJob":
        """This cell's job for its prompts [first, end) (`study.rounds`): the benchmark read to
        `end` (its n), so that a block's job is the same whatever the study's n."""
        bench = {k: v for k, v in self.benchmark.items() if k != "n"}
        return replace(self, benchmark=bench if end is None else {**bench, "n": end}, prompts=[first, end])

    @classmethod
    def from_json(cls, data: Any) -> "CellJob":
        data = dict(_parse(cls, data, "cell job"))
        data["cell"] = Cell.from_dict(data["cell"])
        _check_types("cell job", {"run_seed": (data["run_seed"], int), "model": (data["model"], dict),
                                  "benchmark": (data["benchmark"], dict),
                                  "max_new_tokens": (data["max_new_tokens"], int),
                                  "decoding": (data["decoding"], dict), "intervention": (data["intervention"], dict),
                                  "record_top_k": (data["record_top_k"], int), "device": (data["device"], str),
                                  "threads": (data.get("threads"), (int, type(None))),
                                  "endpoint": (data.get("endpoint"), (dict, type(None))),
                                  "load": (data.get("load"), (dict, type(None))),
                                  "prompts": (data.get("prompts"), (list, type(None)))})
        block = data.get("prompts")
        if block is not None and not (len(block) == 2 and isinstance(block[0], int) and block[0] >= 0
                                      and (block[1] is None or isinstance(block[1], int) and block[1] > block[0])):
            raise JobSpecError(f"cell job: field 'prompts' is [first, end) of the benchmark's prompts, not {block!r}")
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
