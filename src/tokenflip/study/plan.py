"""Config → cells, pairs and probe jobs: the one place that decides what the pipeline runs.

A cell is one generation job: a model and a benchmark crossed with one value of every axis
of the table of axes (`axes`). A pair is two cells that differ in exactly one axis; no code
below is specific to one axis. A job's settings come from its own model, benchmark and axis
values only, so that adding a model or a benchmark adds jobs without touching old ones.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Iterable

from tokenflip.core.axes import AXES, GRID_DEFAULTS, axis_value
from tokenflip.core.specs import Cell, CellJob, Pair, ProbeJob

__all__ = ["expand_cells", "expand_pairs", "pairs_of_comparison", "cell_job", "probe_targets", "probe_job",
           "Cell", "Pair"]


def _grid_values(grid: dict[str, Any], axis: str) -> list[Any]:
    return [axis_value(axis, v) for v in grid.get(axis, [GRID_DEFAULTS.get(axis)])]


def expand_cells(config: dict[str, Any]) -> list[Cell]:
    """Every cell of every grid, for every model and benchmark, deduplicated and sorted."""
    cells: set[Cell] = set()
    axes = list(AXES)
    for grid in config["grids"]:
        models = grid.get("models", list(config["models"]))
        benches = grid.get("benchmarks", list(config["benchmarks"]))
        for model, bench in itertools.product(models, benches):
            for combo in itertools.product(*[_grid_values(grid, axis) for axis in axes]):
                cells.add(Cell(model, bench, **dict(zip(axes, combo))))
    return sorted(cells)


def pairs_of_comparison(comparison: dict[str, Any], cells: Iterable[Cell]) -> list[Pair]:
    """Every pair of existing cells that differ only in the comparison's axis, a then b (of
    the comparison's `models` and `benchmarks` only, where it names them)."""
    axis = comparison["axis"]
    a_val, b_val = axis_value(axis, comparison["a"]), axis_value(axis, comparison["b"])
    cells = list(cells)
    cell_set = set(cells)
    pairs = []
    for cell in cells:  # in the caller's order (expand_cells: sorted); expand_pairs sorts the pairs
        if any(key in comparison and value not in comparison[key]
               for key, value in (("models", cell.model), ("benchmarks", cell.benchmark))):
            continue
        if cell.value(axis) == a_val:
            other = replace(cell, **{axis: b_val})
            if other in cell_set:
                pairs.append(Pair(axis, cell, other))
    return pairs


def expand_pairs(config: dict[str, Any], cells: Iterable[Cell]) -> list[Pair]:
    """For each declared comparison (axis, a, b), every pair of cells that differ only there."""
    cells = list(cells)
    return sorted({pair for comp in config["comparisons"] for pair in pairs_of_comparison(comp, cells)})


def cell_job(config: dict[str, Any], cell: Cell) -> CellJob:
    """Everything a cell's output depends on, and nothing else: the job's whole input
    besides the prepared model. Changing one benchmark's settings changes only its cells."""
    from tokenflip.run.engines import engine

    bench = config["benchmarks"][cell.benchmark]
    generation = config["generation"]
    return CellJob(
        cell=cell,
        run_seed=config["seed"],
        model=config["models"][cell.model],
        benchmark={k: v for k, v in bench.items() if k != "max_new_tokens"},
        max_new_tokens=bench.get("max_new_tokens", generation["max_new_tokens"]),
        decoding=config["decoding"][cell.decoding],
        intervention=config["interventions"][cell.intervention],
        record_top_k=generation["record_top_k"],
        # The cell's own device and threads where it names them, else the run's: the value
        # the cell's name states is the one its engine computes with (and records); the
        # device as the engine resolves it (llama.cpp's build computes on the CPU).
        device=engine(cell.engine, config).job_device(cell, generation["device"] if cell.device == "default"
                                                      else cell.device),
        threads=generation["threads"] if cell.threads == "default" else int(cell.threads),
        endpoint=config.get("endpoints", {}).get(cell.engine),
        load=config.get("loads", {}).get(cell.load),
    )


def probe_targets(config: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(probe, model, benchmark) for every configured probe, in registry order."""
    from tokenflip.run.probes import PROBES

    configured = config.get("probes", {})
    return [(probe, model, bench) for probe in PROBES if probe in configured
            for model in configured[probe].get("models", config["models"])
            for bench in configured[probe].get("benchmarks", config["benchmarks"])]


def plain_values(greedy: Iterable[str], none: Iterable[str]) -> dict[str, tuple]:
    """The plain setting, per axis (the values a cell has when nothing is varied): each
    axis's plain value (cache on, batch size 1), a greedy decoding, no intervention, every
    further axis at its default. `greedy` / `none`: the config's labels of greedy decoding
    and of no intervention (interventions of kind `none`, whatever their label)."""
    plain: dict[str, tuple] = {}
    for axis in AXES.values():
        if axis.plain is not None:
            plain[axis.name] = (axis.plain,)
        elif not axis.core:
            plain[axis.name] = (axis.grid_default,)
    return {**plain, "decoding": tuple(sorted(greedy)), "intervention": tuple(sorted(none))}


def config_plain_values(config: dict[str, Any]) -> dict[str, tuple]:
    """`plain_values` with the config's own labels."""
    from tokenflip.run.interventions import no_intervention_labels

    return plain_values((d for d, s in config.get("decoding", {}).items() if s.get("strategy") == "greedy"),
                        no_intervention_labels(config))


def at_defaults(config: dict[str, Any], cell: Cell, except_axes: tuple[str, ...] = ()) -> bool:
    """Whether a cell's axes are the plain setting (`plain_values`), but for `except_axes`."""
    return all(cell.value(axis) in values for axis, values in config_plain_values(config).items()
               if axis not in except_axes)


def probe_pairs(config: dict[str, Any], probe: str, model: str, benchmark: str,
                pairs: list[Pair] | None = None) -> list[Pair]:
    """The pairs of this model and benchmark whose results the probe explains (its
    `explains`), every axis but the compared one and the precision at its default: the
    pairs a `select: diverged` probe chooses its prompts from."""
    from tokenflip.run.probes import PROBES

    wanted = PROBES[probe].explains(config["probes"][probe])  # validated: option defaults filled in
    pairs = pairs if pairs is not None else expand_pairs(config, expand_cells(config))
    return [pair for pair in pairs if pair.a.model == model and pair.a.benchmark == benchmark and wanted(pair)
            and at_defaults(config, pair.a, (pair.axis, "precision"))]


def load_settings(cell: Cell) -> tuple[str, ...] | None:
    """What a transformers cell's loaded model depends on (None: another engine's cell, or one
    whose load is not shared; `run.shared_loads` decides at run time, with the machine's part)."""
    if cell.engine != "transformers" or cell.intervention != "none" or cell.compile != "off":
        return None
    return (cell.model, cell.precision, cell.attention, cell.deterministic, cell.device)


def job_priorities(config: dict[str, Any], cells: list[Cell], pairs: list[Pair]) -> dict[str, int]:
    """Scheduling priority by cell or pair id (absent: 0). The longest jobs first: a cell
    without a cache (3), then the probes' inputs, which each probe (the next longest job)
    waits on: the pairs it explains (2) and their cells (1). Within each, the cells of one
    load setting (`load_settings`) together, so that jobs run one at a time (one GPU) follow
    each other on one warm load instead of alternating loads. Outputs do not depend on it."""
    base: dict[str, int] = {}
    for probe, model, benchmark in probe_targets(config):
        if config["probes"][probe]["select"] == "diverged":
            for pair in probe_pairs(config, probe, model, benchmark, pairs):
                base[pair.id] = 2
                for cell in (pair.a, pair.b):
                    base[cell.id] = max(base.get(cell.id, 0), 1)
    for cell in cells:
        if cell.cache == "off":
            base[cell.id] = 3
    loads = sorted({settings for cell in cells if (settings := load_settings(cell)) is not None})
    rank = {settings: len(loads) - i for i, settings in enumerate(loads)}  # 1..len(loads); 0: not shared
    scale = len(loads) + 1
    priorities = {key: value * scale for key, value in base.items()}
    for cell in cells:
        priorities[cell.id] = base.get(cell.id, 0) * scale + rank.get(load_settings(cell), 0)
    return {key: value for key, value in priorities.items() if value}


def probe_job(config: dict[str, Any], probe: str, model: str, benchmark: str,
              pairs: list[Pair] | None = None) -> ProbeJob:
    """Everything one probe job depends on (its own model and benchmark only, and the
    pairs of them it chooses its prompts from)."""
    from tokenflip.run.probes import PROBES

    spec = config["probes"][probe]
    bench = config["benchmarks"][benchmark]
    select = spec["select"]
    explains = sorted(p.id for p in probe_pairs(config, probe, model, benchmark, pairs)) if select == "diverged" else []
    return ProbeJob(
        probe=probe,
        model_name=model,
        benchmark_name=benchmark,
        run_seed=config["seed"],
        model=config["models"][model],
        benchmark={k: v for k, v in bench.items() if k != "max_new_tokens"},
        max_new_tokens=spec.get("max_new_tokens") or bench.get("max_new_tokens",
                                                               config["generation"]["max_new_tokens"]),
        prompts=spec["prompts"],
        options={key: spec[key] for key in PROBES[probe].options if key in spec},
        select=select,
        explains=explains,
        device=config["generation"]["device"],
        threads=config["generation"]["threads"],
        version=PROBES[probe].version,
    )
