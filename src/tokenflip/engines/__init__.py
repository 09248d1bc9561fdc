"""The engine axis: which inference engine runs a cell, as a registry.

Each engine is one module with one `Engine` (`base`): the axes it honours, why it refuses
the others, where its jobs run, what it records and how it decodes. Validation, the plan,
the Snakefile's resources and `cell.run_cell` go through `ENGINES`; adding an engine is one
module and one line here.

- `transformers`: tokenflip's own decode loop over a transformers model (the reference,
  the engine probes replay);
- `llama.cpp`: the model's GGUF file through llama-cpp-python;
- `vllm`: the prepared model through vLLM's offline `LLM` API, in vLLM's own environment,
  with its scheduler's knobs as axes.
"""

from __future__ import annotations

from typing import Any, Iterator

from .base import Engine, grid_values
from .llama_cpp import LLAMA_CPP, LLAMA_CPP_PACKAGE, LlamaCppEngine
from .transformers import TRANSFORMERS, Transformers
from .vllm import VLLM, Vllm

REGISTRY: dict[str, Engine] = {engine.name: engine for engine in (Transformers(), LlamaCppEngine(), Vllm())}
ENGINES = tuple(REGISTRY)

__all__ = ["ENGINES", "LLAMA_CPP", "LLAMA_CPP_PACKAGE", "REGISTRY", "TRANSFORMERS", "VLLM", "Engine", "engine",
           "unavailable", "config_problems", "probe_problems"]


def engine(name: str) -> Engine:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})") from None


def unavailable(name: str) -> str | None:
    """Why engine `name` cannot run here (None if it can)."""
    return engine(name).unavailable()


def config_problems(config: dict[str, Any], defaults: dict[str, Any]) -> Iterator[str]:
    """What each grid asks of each engine it names that the engine cannot honour, each with
    the reason; an engine that is not installed is refused with the command that installs it."""
    for i, grid in enumerate(config["grids"]):
        where = f"grids.{i}"
        for name in dict.fromkeys(str(v) for v in grid_values(grid, "engine", defaults)):
            eng = engine(name)
            reason = eng.unavailable()
            if reason:
                yield f"{where}: {reason}"
            yield from eng.refused_axes(config, grid, where, defaults)
            yield from eng.grid_problems(config, grid, where, defaults)


def probe_problems(config: dict[str, Any]) -> Iterator[str]:
    """A probe over a model and benchmark whose cells all run in another engine: probes
    replay the transformers model, so it would trace something the study does not run."""
    from ..plan import expand_cells, probe_targets

    engines_of: dict[tuple[str, str], set[str]] = {}
    for cell in expand_cells(config):
        engines_of.setdefault((cell.model, cell.benchmark), set()).add(cell.engine)
    for probe, model, benchmark in probe_targets(config):
        found = engines_of.get((model, benchmark), set())
        if found and TRANSFORMERS not in found:
            yield (f"probes.{probe}: model {model!r} on benchmark {benchmark!r} has only {' and '.join(sorted(found))} "
                   f"cells; probes replay the transformers model (add transformers cells, or name other benchmarks "
                   f"under probes.{probe}.benchmarks)")


def axis_provenance(axis: str) -> tuple[str, ...]:
    """Provenance fields any engine's value of `axis` legitimately changes."""
    return tuple(field for eng in REGISTRY.values() for field in eng.axis_provenance.get(axis, ()))
