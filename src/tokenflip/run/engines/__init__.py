"""The engine axis: which inference engine runs a cell, as a registry.

Each engine is one module with one `Engine` (`base`): the axes it honours (an allow list),
why it refuses the others, where its jobs run, what proves each axis it honours, and how it
decodes. Validation, the plan, the Snakefile's resources and `cell.run_cell` go through
`REGISTRY`; adding an engine is one module and one line here. Engines that run in another
interpreter share one worker protocol (`worker`). No module is named like the package it
wraps, so none shadows it.

- `transformers`: tokenflip's own decode loop over a transformers model (the reference,
  the engine probes replay);
- `llama.cpp`: the model's GGUF file through llama-cpp-python;
- `vllm`: the prepared model through vLLM's offline `LLM` API, in vLLM's own environment,
  with its scheduler's knobs as axes;
- an endpoint: a live OpenAI-compatible server the config names under `endpoints`
  (`endpoint/`), an engine made from its entry, under the load the cell's axes set.
"""

from __future__ import annotations

from typing import Any, Iterator

from tokenflip.core.registry import Registry
from tokenflip.run.engines.base import Decoded, Engine, grid_values
from tokenflip.run.engines.endpoint.engine import Endpoint
from tokenflip.run.engines.llama_cpp_gguf import LLAMA_CPP, LLAMA_CPP_PACKAGE, LlamaCppEngine
from tokenflip.run.engines.transformers_loop import TRANSFORMERS, Transformers
from tokenflip.run.engines.vllm_offline.engine import VLLM, Vllm

# The one registry of engines, the same kind as those of benchmarks, interventions and probes.
REGISTRY: Registry[Engine] = Registry("engine", (Transformers(), LlamaCppEngine(), Vllm()))
ENGINES = tuple(REGISTRY)

__all__ = ["ENGINES", "Endpoint", "LLAMA_CPP", "LLAMA_CPP_PACKAGE", "REGISTRY", "TRANSFORMERS", "VLLM", "Decoded", "Engine",
           "engine",
           "unavailable", "config_problems"]


def engine(name: str, config: dict[str, Any] | None = None) -> Engine:
    """The engine a cell's `engine` value names: one of the registry, else the endpoint of
    that name in `config` (its `endpoints` block)."""
    if name in REGISTRY:
        return REGISTRY[name]
    endpoints = (config or {}).get("endpoints") or {}
    if name in endpoints:
        return Endpoint(name, endpoints[name])
    raise ValueError(f"unknown engine {name!r} (engines: {', '.join(ENGINES)}; endpoints: "
                     f"{', '.join(endpoints) or 'none defined'})")


def unavailable(name: str) -> str | None:
    """Why engine `name` cannot run here (None if it can)."""
    return engine(name).unavailable()


def config_problems(config: dict[str, Any], defaults: dict[str, Any]) -> Iterator[str]:
    """What each grid asks of each engine it names that the engine cannot honour, each with
    the reason; an engine that is not installed is refused with the command that installs it."""
    for i, grid in enumerate(config["grids"]):
        where = f"grids.{i}"
        for name in dict.fromkeys(str(v) for v in grid_values(grid, "engine", defaults)):
            eng = engine(name, config)
            reason = eng.unavailable()
            if reason:
                yield f"{where}: {reason}"
            yield from eng.refused_axes(config, grid, where, defaults)
            yield from eng.grid_problems(config, grid, where, defaults)
    from tokenflip.run.engines.endpoint.entries import entry_problems

    for name, spec in config.get("endpoints", {}).items():
        yield from entry_problems(name, spec)


def axis_provenance(axis: str) -> tuple[str, ...]:
    """Provenance fields any engine's value of `axis` legitimately changes: those it declares,
    and the record that proves the axis ran (it holds the axis's own value)."""
    kinds = (*REGISTRY.values(), Endpoint("", {}))
    declared = (field for eng in kinds for field in eng.axis_provenance.get(axis, ()))
    proofs = (eng.proof(axis).field for eng in kinds if axis in eng.honours and eng.proof(axis))
    return tuple(dict.fromkeys((*declared, *proofs)))
