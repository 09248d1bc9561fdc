"""What every engine declares: the axes it honours, why it refuses the others, where its
jobs run, and how it runs a cell. The registry (`engines.ENGINES`) is made of these, and
validation, the plan, the Snakefile and `cell.run_cell` read it instead of naming engines."""

from __future__ import annotations

from typing import Any, Iterator

from ..jobs import COMPARABLE_AXES


def grid_values(grid: dict[str, Any], axis: str, defaults: dict[str, Any]) -> list[Any]:
    return list(grid.get(axis, [defaults.get(axis)]))


class Engine:
    """One inference engine. Subclasses set `name`, `free_axes` (every axis it honours at
    any value; the rest must stay at their defaults) and `why` (per refused axis, the
    reason a user reads), and implement `run`."""

    name: str = ""
    free_axes: tuple[str, ...] = COMPARABLE_AXES
    why: dict[str, str] = {}
    # Provenance fields (dotted prefixes) a value of each axis legitimately changes in this
    # engine's cells, beyond the cell spec: `compare` lets them differ on that axis.
    axis_provenance: dict[str, tuple[str, ...]] = {}

    def unavailable(self) -> str | None:
        """Why this engine cannot run here (None if it can)."""
        return None

    def grid_problems(self, config: dict[str, Any], grid: dict[str, Any], where: str,
                      defaults: dict[str, Any]) -> Iterator[str]:
        """What a grid's cells in this engine ask that it cannot honour, beyond the axes it
        refuses outright (those `config_problems` reports from `why`)."""
        return iter(())

    def refused_axes(self, config: dict[str, Any], grid: dict[str, Any], where: str,
                     defaults: dict[str, Any]) -> Iterator[str]:
        """Every axis this engine does not honour must be at its default; an axis added
        later is refused until the engine lists it in `free_axes`."""
        for axis in COMPARABLE_AXES:
            if axis in self.free_axes:
                continue
            why = self.why.get(axis, f"{self.name} cells do not implement this axis")
            for value in grid_values(grid, axis, defaults):
                if not at_default(config, axis, value, defaults):
                    yield (f"{where}: engine {self.name!r} with {axis} {value!r}: {why} "
                           f"(put the {self.name} cells in a grid of their own)")

    def job_device(self, cell, configured: str) -> str:
        """Where a cell's job runs, given the device the cell or the run asks for."""
        return configured

    def job_threads(self, cell, configured: int, cores: int) -> int:
        """How many of Snakemake's cores a cell's job holds."""
        return configured

    def run(self, job, bench, model_dir, out_path, progress: bool) -> dict[str, Any]:
        raise NotImplementedError


def at_default(config: dict[str, Any], axis: str, value: Any, defaults: dict[str, Any]) -> bool:
    """Whether `value` asks nothing of an engine on `axis` (its default, batch size 1, no
    intervention, the CPU where a device is named)."""
    if axis == "batch_size":
        return int(value) == 1
    if axis == "intervention":
        return config["interventions"].get(value, {}).get("kind") == "none"
    if axis == "device":
        return str(value) in ("default", "cpu")
    return str(value) == str(defaults[axis])
