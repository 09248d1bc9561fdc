"""A cell made in blocks (`study.rounds`): its blocks joined into the cell's file, each checked to
be the cell's job for its prompts, made with one model, software and machine, and from one
version of the cell's inputs. Light to import (no torch): a join is a local job of the
scheduler's, and costs a fraction of a second."""

from __future__ import annotations

from typing import Any

from tokenflip.core import storage
from tokenflip.core.specs import CellJob


class BlockError(ValueError):
    """A cell's blocks cannot be joined: one was made with other settings, elsewhere, or holds
    other prompts than its name says."""


# What must be the same in every block of one cell: the model, the software, the machine and
# its determinism. The engine's record may differ by block (an engine sizes its context from the
# prompts it is given; a server's fingerprints change): the cell keeps its first block's.
_BLOCK_SAME = ("model", "environment.software", "environment.device", "environment.determinism")


def _inputs(meta: dict[str, Any]) -> dict[str, Any]:
    """What a block was made from: its benchmark as described (its source's path and digest,
    the order drawn, the prompt format), less which block of it and how far it reaches."""
    return {k: v for k, v in meta.get("benchmark", {}).items() if k not in ("block", "n", "n_requested")}


def inputs_digest(meta: dict[str, Any]) -> str:
    """The digest of a block's inputs (`_inputs`), kept with each block of a joined cell."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(_inputs(meta), sort_keys=True, default=str).encode()).hexdigest()


def _check_same_inputs(path, meta: dict[str, Any], first_path, first_meta: dict[str, Any]) -> None:
    """Refuse a block made from another version of the cell's inputs than its first block (a
    prompts file edited between two rounds), naming the block, the field and the file."""
    from tokenflip.core.provenance import flatten_provenance

    own, theirs = flatten_provenance(_inputs(first_meta)), flatten_provenance(_inputs(meta))
    differ = sorted(k for k in set(own) | set(theirs) if own.get(k) != theirs.get(k))
    if differ:
        source = theirs.get("source.path") or theirs.get("source.file") or theirs.get("source.hub") or "its source"
        raise BlockError(f"{path}: made from other inputs than the cell's first block ({first_path}): benchmark "
                         f"{differ[0]} differs ({source} changed between them?); blocks of one cell come from one "
                         f"version of its prompts (remove the later blocks to make them again)")


def join_blocks(job: CellJob, blocks: list[tuple[str, int, int | None]], out_path) -> dict[str, Any]:
    """The cell's file from its blocks ((path, first, end), in order): each block must be the
    cell's job for its prompts (`CellJob.block`), hold exactly them, and have been made with
    the same model, software and machine as the first (a block made after an upgrade is not
    joined to older ones). Its digests are the joined table's; the blocks' are kept."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from tokenflip.core.provenance import flatten_provenance

    tables, metas, batches = [], [], 0
    for path, first, end in blocks:
        table, meta = storage.read_cell(path)
        want = job.block(first, end).to_json()
        if meta.get("settings") != want:
            raise BlockError(f"{path}: made with other settings than block [{first}, {end}) of cell {job.cell.id} "
                             f"(remove it to make it again)")
        index = table.column("prompt_index").to_pylist()
        if index != list(range(first, first + len(index))) or (end is not None and first + len(index) != end):
            held = f"prompts {index[0]} to {index[-1]}, {len(index)} rows" if index else "no prompts"
            raise BlockError(f"{path}: holds {held}, not [{first}, {end}) "
                             f"(remove it to make it again)")
        if metas:
            own, theirs = (({k: v for k, v in flatten_provenance(m).items()
                             if any(k == key or k.startswith(key + ".") for key in _BLOCK_SAME)})
                           for m in (metas[0], meta))
            differ = sorted(k for k in set(own) | set(theirs) if own.get(k) != theirs.get(k))
            if differ:
                raise BlockError(f"{path}: made with {differ[0]} = {theirs.get(differ[0])!r}, but the cell's first "
                                 f"block ({blocks[0][0]}) with {own.get(differ[0])!r}: blocks of one cell come from "
                                 f"one model, software and machine (remove the later blocks to make them again)")
            _check_same_inputs(path, meta, blocks[0][0], metas[0])
        tables.append(table.set_column(table.schema.get_field_index("batch_index"), "batch_index",
                                       pc.add(table.column("batch_index"), batches)))
        batches += len(set(table.column("batch_index").to_pylist()))
        metas.append(meta)
    table = pa.concat_tables(tables)
    described = {k: v for k, v in metas[-1]["benchmark"].items() if k != "block"}
    metadata = {
        **metas[0],
        "settings": job.to_json(),
        "benchmark": described,
        "observed": {**metas[0].get("observed", {}), "prompts": table.num_rows,
                     "largest_batch": max(m.get("observed", {}).get("largest_batch", 0) for m in metas)},
        "blocks": [{"prompts": [first, end], "file": str(path).rsplit("/", 1)[-1],
                    "token_stream_sha256": m["token_stream_sha256"], "inputs_sha256": inputs_digest(m)}
                   for (path, first, end), m in zip(blocks, metas)],
        "wall_seconds": float(sum(m["wall_seconds"] for m in metas)),
        "cpu_seconds": float(sum(m["cpu_seconds"] for m in metas)),
        "generated_tokens": int(sum(m["generated_tokens"] for m in metas)),
        "job_seconds": float(sum(m.get("job_seconds") or 0.0 for m in metas)),
    }
    return storage.write_cell_file(table, out_path, metadata)
