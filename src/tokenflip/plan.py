"""Config → cells and pairs: the one place that decides what the pipeline runs.

A cell is one generation job (model x precision x cache x benchmark x batch size x
decoding x intervention, and optionally attention kernel, threads, device and
deterministic mode). A pair is two cells that differ in exactly one axis; no code below
is specific to one axis. Paths
are derived from the spec alone so that adding a model only adds new paths.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Iterable

# Axes that are always encoded in the cell file name (model and benchmark are directories).
NAME_AXES = ("precision", "cache", "batch_size", "decoding", "intervention")
# Further axes, encoded as `-axis=value` only when not at their default, so that adding
# one to a config leaves the names (and files) of every existing cell unchanged.
# `default` means: what the library or the run's `generation` settings choose.
EXTRA_AXES = {"attention": "default", "threads": "default", "device": "default", "deterministic": "default"}
COMPARABLE_AXES = NAME_AXES + tuple(EXTRA_AXES)


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

    @property
    def name(self) -> str:
        core = f"{self.precision}-{self.cache}-bs{self.batch_size}-{self.decoding}-{self.intervention}"
        extra = "".join(f"-{axis}={self.value(axis)}" for axis, default in EXTRA_AXES.items()
                        if self.value(axis) != default)
        return core + extra

    @property
    def id(self) -> str:
        return f"{self.model}/{self.benchmark}/{self.name}"

    def path(self, run: str) -> str:
        return f"results/{run}/cells/{self.id}.parquet"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def value(self, axis: str) -> Any:
        return getattr(self, axis)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Cell":
        names = {f.name for f in fields(cls)}
        return cls(**{k: (int(v) if k == "batch_size" else str(v)) for k, v in d.items() if k in names})

    @classmethod
    def from_name(cls, model: str, benchmark: str, name: str) -> "Cell":
        parts = name.split("-")
        precision, cache, bs, decoding, intervention = parts[:5]
        extra = dict(part.split("=", 1) for part in parts[5:])
        unknown = sorted(set(extra) - set(EXTRA_AXES))
        if unknown:
            raise ValueError(f"cell name {name!r}: unknown axes {unknown}")
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

    def path(self, run: str) -> str:
        return f"results/{run}/pairs/{self.id}.parquet"


def _fmt(axis: str, cell: Cell) -> str:
    v = cell.value(axis)
    return f"bs{v}" if axis == "batch_size" else str(v)


def expand_cells(config: dict[str, Any]) -> list[Cell]:
    """Every cell of every grid, for every model and benchmark, deduplicated and sorted."""
    cells: set[Cell] = set()
    for grid in config["grids"]:
        models = grid.get("models", list(config["models"]))
        benches = grid.get("benchmarks", list(config["benchmarks"]))
        extra_axes = list(EXTRA_AXES)
        for model, bench in itertools.product(models, benches):
            for combo in itertools.product(
                grid["precision"], grid["cache"], grid["batch_size"],
                grid.get("decoding", ["greedy"]), grid.get("intervention", ["none"]),
                *[[str(v) for v in grid.get(axis, [EXTRA_AXES[axis]])] for axis in extra_axes],
            ):
                precision, cache, bs, decoding, intervention, *extra = combo
                cells.add(Cell(model, bench, precision, cache, int(bs), decoding, intervention,
                               **dict(zip(extra_axes, extra))))
    return sorted(cells)


def expand_pairs(config: dict[str, Any], cells: Iterable[Cell]) -> list[Pair]:
    """For each declared comparison (axis, a, b), every pair of existing cells that
    differ only in that axis."""
    cell_set = set(cells)
    pairs: list[Pair] = []
    for comp in config["comparisons"]:
        axis, a_val, b_val = comp["axis"], comp["a"], comp["b"]
        if axis == "batch_size":
            a_val, b_val = int(a_val), int(b_val)
        else:
            a_val, b_val = str(a_val), str(b_val)
        for cell in sorted(cell_set):
            if cell.value(axis) != a_val:
                continue
            other = replace(cell, **{axis: b_val})
            if other in cell_set:
                pairs.append(Pair(axis, cell, other))
    return sorted(set(pairs))


def pair_from_wildcards(model: str, benchmark: str, axis: str, a: str, b: str, context: str) -> Pair:
    """Rebuild a pair from the pieces of its path (what Snakemake wildcards hold)."""
    values = context.split("-")
    d: dict[str, Any] = {"model": model, "benchmark": benchmark}
    for name, v in zip(NAME_AXES, values):
        d[name] = v.removeprefix("bs") if name == "batch_size" and v != "x" else v
    d.update(part.split("=", 1) for part in values[len(NAME_AXES):])
    cell_a = Cell.from_dict({**d, axis: a})
    cell_b = Cell.from_dict({**d, axis: b})
    return Pair(axis, cell_a, cell_b)


def cell_settings(config: dict[str, Any], cell: Cell) -> dict[str, Any]:
    """Everything a cell's output depends on, and nothing else: the job's whole input
    besides the prepared model. Changing one benchmark's settings changes only its cells."""
    bench = config["benchmarks"][cell.benchmark]
    return {
        "cell": cell.as_dict(),
        "run_seed": config.get("seed", 0),
        "model": config["models"][cell.model],
        "benchmark": {k: v for k, v in bench.items() if k != "max_new_tokens"},
        "max_new_tokens": bench.get("max_new_tokens", config["generation"]["max_new_tokens"]),
        "decoding": config["decoding"][cell.decoding],
        "intervention": config["interventions"][cell.intervention],
        "record_top_k": config["generation"]["record_top_k"],
        "device": config["generation"].get("device", "auto"),
        "threads": config["generation"].get("threads"),
    }


def pair_from_id(pair_id: str) -> Pair:
    """Inverse of `Pair.id`."""
    model, benchmark, axis, a_vs_b, context = pair_id.split("/")
    a, b = a_vs_b.split("_vs_")
    return pair_from_wildcards(model, benchmark, axis, a, b, context)


PROBES = ("kv_cache", "precision")
PROBE_TABLES = {"kv_cache": ("steps", "layers", "patching"),
                "precision": ("steps", "layers", "grafting", "lens")}


def probe_targets(config: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(probe, model, benchmark) for every configured probe."""
    return [(probe, model, bench) for probe in PROBES if probe in config.get("probes", {})
            for model in config["models"] for bench in config["benchmarks"]]


def probe_settings(config: dict[str, Any], probe: str, model: str, benchmark: str) -> dict[str, Any]:
    """Everything one probe job depends on (its own model and benchmark only)."""
    spec = config["probes"][probe]
    bench = config["benchmarks"][benchmark]
    specific = ({"precisions": spec.get("precisions", ["fp32", "fp16"]), "patch_steps": spec.get("patch_steps", 3)}
                if probe == "kv_cache" else
                {"pairs": spec.get("pairs", [["bf16", "fp16"]]), "flips": spec.get("flips", 3)})
    return {
        "probe": probe,
        "run_seed": config.get("seed", 0),
        "model": config["models"][model],
        "benchmark_name": benchmark,
        "benchmark": {k: v for k, v in bench.items() if k != "max_new_tokens"},
        "max_new_tokens": spec.get("max_new_tokens") or bench.get("max_new_tokens",
                                                                  config["generation"]["max_new_tokens"]),
        "prompts": spec.get("prompts", 4),
        **specific,
        "device": config["generation"].get("device", "auto"),
        "threads": config["generation"].get("threads"),
    }
