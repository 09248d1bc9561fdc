"""One cell, end to end: the cell's engine (`engines`) decodes the benchmark's prompts; this
runner then does, once for every engine, what no engine does itself: it scores the
completions, records the environment, checks that the cell ran as its name says (every
honoured axis against the record that proves it) and writes the cell's Parquet file
(`cell_output`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from tokenflip.core.provenance import flatten_provenance
from tokenflip.core.specs import CellJob
from tokenflip.models.size import context_length
from tokenflip.run import engines, runtime
from tokenflip.run.benchmarks import job_benchmark


class CellMismatch(RuntimeError):
    """A cell's engine ran with another value of an axis than the cell's name states."""


def run_cell(job: CellJob, model_dir: str | Path, out_path: str | Path, progress: bool = True) -> dict[str, Any]:
    """Generate the cell `job` describes (see `plan.cell_job`) into `out_path`."""
    from tokenflip.core import provenance
    from tokenflip.run.cell_output import score_batches, write_cell

    if not isinstance(job, CellJob):
        job = CellJob.from_json(job)
    cell = job.cell
    # The bound the pipeline's prompt check enforces first, here too for a job run by hand: an
    # engine sizes its cache (llama.cpp's n_ctx, a static cache) by max_new_tokens, so a
    # generation beyond the model's context would grow the job to the machine's memory.
    if problem := runtime.context_problem(f"cell {cell.id}", None, job.max_new_tokens, context_length(model_dir)):
        raise runtime.PromptFormatError(problem)
    runtime.prepare_process(job.run_seed, job.threads, cell.deterministic)
    bench = job_benchmark(job)
    engine = engines.engine(cell.engine, {"endpoints": {cell.engine: job.endpoint}} if job.endpoint else None)
    decoded = engine.decode(job, bench, model_dir, progress)
    check_decoded_prompts(job, bench, decoded.batches, engine.name)
    rows = score_batches(job, bench, decoded.batches, decoded.tokenizer)
    record = {**decoded.record, "environment": provenance.environment(decoded.device),
              "observed": {**decoded.observed, **observed(rows)}}
    check_ran_as_named(job, record, engine)
    return write_cell(job, bench, rows, decoded.eos, decoded.pad, record, out_path, decoded.unrecorded)


def check_decoded_prompts(job: CellJob, bench, batches, engine: str) -> None:
    """The engine decoded exactly the job's prompts, in order (a block's, when the job is
    one): an engine that rebuilt the benchmark on its own, or dropped or reordered a prompt,
    fails the cell here, before its rows are numbered and written."""
    asked = [item.id for item in bench.items()]
    decoded = [item.id for batch in batches for item in batch.items]
    if decoded != asked:
        where = next((i for i, (a, b) in enumerate(zip(asked, decoded)) if a != b), min(len(asked), len(decoded)))
        span = "all its prompts" if job.prompts is None else f"prompts [{job.prompts[0]}, {job.prompts[1]})"
        raise CellMismatch(f"cell {job.cell.id}: the job asks {span}, {len(asked)} in all, but engine {engine!r} "
                           f"decoded {len(decoded)}; they first differ at position {where} "
                           f"({asked[where] if where < len(asked) else 'none'} asked, "
                           f"{decoded[where] if where < len(decoded) else 'none'} decoded)")


def observed(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the rows themselves show of how the cell ran: its prompts, and the largest
    batch it decoded them in."""
    sizes = Counter(row["batch_index"] for row in rows)
    return {"prompts": len(rows), "largest_batch": max(sizes.values(), default=0)}


def check_ran_as_named(job: CellJob, record: dict[str, Any], engine) -> None:
    """Every axis the engine honours, against the field of the cell's record that proves
    it (the engine's `proof`, else the table's): a cell whose record says otherwise than its
    name fails here, naming the axis, what it asks and what ran, before anything is written."""
    from tokenflip.core.axes import AXES

    flat = flatten_provenance(record)
    for name in engine.honours:
        proof = engine.proof(name)
        if proof is None:
            if AXES[name].unprovable:
                continue
            raise CellMismatch(f"cell {job.cell.id}: engine {engine.name!r} honours axis {name!r} but names no "
                               f"record that proves it")
        expected = proof.expect(job, record)
        if expected is None:
            continue
        found = flat.get(proof.field, _missing)
        if found is _missing or not _same(found, expected):
            shown = "nothing" if found is _missing else repr(found)
            value = job.cell.value(name)
            source = f"{name}={value!r}" + (", as the run's settings resolve it" if value == "default" else "")
            raise CellMismatch(f"cell {job.cell.id}: axis {name!r} asks for {expected!r} "
                               f"({source}), but engine {engine.name!r} recorded {shown} "
                               f"at {proof.field}; the cell would not be what its name says")


_missing = object()


def _same(found: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or isinstance(found, bool):
        return found is expected or found == expected and type(found) is type(expected)
    return found == expected
