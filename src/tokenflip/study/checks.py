"""Checks of a study as a whole that the schema cannot express: its size (counted before a
cell is listed), comparisons whose two values would run one setting, and probes over cells
that run in no engine a probe can replay. `config.validate` reports what they find."""

from __future__ import annotations

from typing import Any, Iterator

from tokenflip.core.axes import AXES
from tokenflip.run import engines


def size_problems(config: dict[str, Any]) -> Iterator[str]:
    """A study larger than `limits` allows, counted without listing a cell: per grid, its
    models x benchmarks x the values of every axis (an upper bound where grids overlap); a
    benchmark's prompts are its n, or the rounds' maximum where that is less or n is unset."""
    from tokenflip.study.rounds import max_prompts

    limits = config["limits"]
    cells = prompts = 0
    for grid in config["grids"]:
        per_benchmark = 1
        for axis in AXES:
            per_benchmark *= len(grid.get(axis, [None]))
        models = len(grid.get("models", config["models"]))
        for bench in grid.get("benchmarks", list(config["benchmarks"])):
            cells += models * per_benchmark
            spec = config["benchmarks"].get(bench)
            prompts += models * per_benchmark * ((max_prompts(config, bench) or 0) if isinstance(spec, dict) else 0)
    if cells > limits["max_cells"]:
        yield (f"grids: {cells:,} cells, more than limits.max_cells {limits['max_cells']:,} (raise limits.max_cells "
               f"in the config for a study this large, or split it into several runs)")
    if prompts > limits["max_prompts"]:
        yield (f"benchmarks: {prompts:,} prompts to generate over the cells, more than limits.max_prompts "
               f"{limits['max_prompts']:,} (lower the benchmarks' n or rounds.max_prompts, or raise limits.max_prompts)")


def same_setting_problems(config: dict[str, Any], cells) -> Iterator[str]:
    """A comparison whose `default` resolves to the same setting as its other value in the
    engine that runs them (vLLM's own number of requests in flight is 256, so `default` vs
    256 compares a configuration with itself; threads `default` vs 1 where the run's threads
    are 1): the engine's proof of the axis says what each side would run, and a pair whose
    sides would run the same is refused, naming both values and that setting."""
    from tokenflip.study.plan import cell_job, pairs_of_comparison

    for i, comp in enumerate(config["comparisons"]):
        axis = comp["axis"]
        if AXES[axis].unprovable or "default" not in (str(comp["a"]), str(comp["b"])):
            # A repeat runs one setting on purpose; two named values that another axis makes
            # the same (bf16 vs fp16 under the fp32 oracle) are a control, not a mistake.
            continue
        seen = set()
        for pair in pairs_of_comparison(comp, cells):
            engine = engines.engine(pair.a.engine, config)
            proof = engine.proof(axis) if axis in engine.honours else None
            if proof is None or engine.name in seen:
                continue
            jobs = [cell_job(config, cell) for cell in (pair.a, pair.b)]
            if {**jobs[0].to_json(), "cell": None} != {**jobs[1].to_json(), "cell": None}:
                continue  # the jobs differ beyond the cell's name (two decoding entries, say)
            try:
                sides = [proof.expect(job, {}) for job in jobs]
            except (KeyError, TypeError):
                continue  # a proof that needs what only the run shows (the prompts a batch held)
            if sides[0] is not None and sides[0] == sides[1]:
                seen.add(engine.name)
                yield (f"comparisons.{i}: {axis} {comp['a']!r} vs {comp['b']!r} compares one setting with itself in "
                       f"engine {engine.name!r}: both run with {proof.field.rsplit('.', 1)[-1]}={sides[0]!r} "
                       f"(compare values that differ, put the {engine.name} cells in a grid of their own, or use "
                       f"`repeat` to rerun one setting)")


def probe_engine_problems(config: dict[str, Any]) -> Iterator[str]:
    """A probe over a model and benchmark whose cells all run in another engine: probes
    replay the transformers model, so it would trace something the study does not run."""
    from tokenflip.study.plan import expand_cells, probe_targets

    engines_of: dict[tuple[str, str], set[str]] = {}
    for cell in expand_cells(config):
        engines_of.setdefault((cell.model, cell.benchmark), set()).add(cell.engine)
    for probe, model, benchmark in probe_targets(config):
        found = engines_of.get((model, benchmark), set())
        if found and engines.TRANSFORMERS not in found:
            yield (f"probes.{probe}: model {model!r} on benchmark {benchmark!r} has only {' and '.join(sorted(found))} "
                   f"cells; probes replay the transformers model (add transformers cells, or name other benchmarks "
                   f"under probes.{probe}.benchmarks)")


def tokenizer_only_problems(config: dict[str, Any]) -> Iterator[str]:
    """A model prepared tokenizer-only (or whose tokenizer is a server's) has no weights: only
    an endpoint (whose server holds them) can run its cells, and no probe can replay them."""
    only = {name for name, spec in config["models"].items() if spec.get("tokenizer_only") or spec["source"] == "server"}
    endpoints = set(config.get("endpoints", {}))
    for i, grid in enumerate(config["grids"]):
        models = only & set(grid.get("models", config["models"]))
        local = sorted({str(e) for e in grid.get("engine", ["transformers"])} - endpoints)
        if models and local:
            yield (f"grids.{i}: model(s) {sorted(models)} are tokenizer_only (no weights), so engine(s) {local} "
                   f"cannot run them; only endpoints can (give the model's weights, or drop tokenizer_only)")
    for probe, spec in config.get("probes", {}).items():
        models = only & set(spec.get("models", config["models"]))
        if models:
            yield (f"probes.{probe}: model(s) {sorted(models)} are tokenizer_only: a probe replays the model's "
                   f"weights (restrict the probe's models)")
