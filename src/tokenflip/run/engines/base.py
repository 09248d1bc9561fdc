"""What every engine declares: the axes it honours (an allow list), why it refuses the
others, where its jobs run, what proves each honoured axis ran, and how it decodes. The
registry (`engines.REGISTRY`) is made of these; validation, the plan, the Snakefile and
`cell.run_cell` read it instead of naming engines. An engine only decodes: scoring,
provenance, the check that the cell ran as its name says, and writing happen once, in
`cell.run_cell`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from tokenflip.core.axes import AXES, Proof
from tokenflip.run.interventions import is_no_intervention

if TYPE_CHECKING:
    from tokenflip.run.benchmarks.base import Item
    from tokenflip.run.decode import BatchResult


def grid_values(grid: dict[str, Any], axis: str, defaults: dict[str, Any]) -> list[Any]:
    return list(grid.get(axis, [defaults.get(axis)]))


@dataclass
class DecodedBatch:
    """One batch as an engine decoded it: its items, their prompt ids, the generations, and
    the CPU seconds the engine spent on it."""

    items: list[Item]
    prompts: list[list[int]]
    result: BatchResult
    cpu_seconds: float


@dataclass
class Decoded:
    """What an engine hands the cell runner: its decoded batches (`DecodedBatch`,
    scored by the runner) and the tokenizer that reads them, the ids that end and pad a
    sequence, where tokenflip's own process computed (its environment is recorded), and the
    engine's own record: `model`, `cache_form`, `engine` (what it ran, as it resolved it), and
    anything else it measured."""

    batches: list[Any]
    tokenizer: Any
    eos: list[int]
    pad: int
    device: Any
    record: dict[str, Any]
    # Per-step statistics the engine does not return (stored as NaN).
    unrecorded: tuple[str, ...] = ()
    # What the runner observes besides the engine's record (e.g. the token selector used).
    observed: dict[str, Any] = field(default_factory=dict)


class Engine:
    """One inference engine. Subclasses set `name`, `honours` (every axis it honours at
    any value: an allow list, so an axis added later is refused until an engine lists it),
    `why` (per refused axis, the reason a user reads), `proofs` (per honoured axis whose
    proof is not the table's, the field this engine records it in), and implement `decode`."""

    name: str = ""
    honours: tuple[str, ...] = ()
    why: dict[str, str] = {}
    proofs: dict[str, Proof] = {}
    # Provenance fields (dotted prefixes) a value of each axis legitimately changes in this
    # engine's cells, beyond the table's: `compare` lets them differ on that axis.
    axis_provenance: dict[str, tuple[str, ...]] = {}

    def unavailable(self) -> str | None:
        """Why this engine cannot run here (None if it can)."""
        return None

    def proof(self, axis: str) -> Proof | None:
        """What proves a cell of this engine ran with its value of `axis`."""
        return self.proofs.get(axis) or AXES[axis].proof

    def grid_problems(self, config: dict[str, Any], grid: dict[str, Any], where: str,
                      defaults: dict[str, Any]) -> Iterator[str]:
        """What a grid's cells in this engine ask that it cannot honour, beyond the axes it
        refuses outright (those `config_problems` reports from `why`)."""
        return iter(())

    def refused_axes(self, config: dict[str, Any], grid: dict[str, Any], where: str,
                     defaults: dict[str, Any]) -> Iterator[str]:
        """Every axis this engine does not honour must be at its default."""
        for axis in AXES:
            if axis in self.honours:
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

    def decode(self, job, bench, model_dir, progress: bool) -> Decoded:
        raise NotImplementedError


def at_default(config: dict[str, Any], axis: str, value: Any, defaults: dict[str, Any]) -> bool:
    """Whether `value` asks nothing of an engine on `axis`: its default, batch size 1, no
    intervention (by kind)."""
    if axis == "batch_size":
        return int(value) == 1
    if axis == "intervention":
        return is_no_intervention(config["interventions"].get(value))
    return str(value) == str(defaults.get(axis))
