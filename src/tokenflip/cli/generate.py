"""`tokenflip generate`, the pipeline's generation job: handed to a warm process that holds
its model load where one can run it (`tokenflip.run.shared_loads`, the process
`cli.warm_load`), else run here."""

from __future__ import annotations

import json

WORKER = "tokenflip.cli.warm_load"  # the module a warm process runs


def hand_over_job(args) -> int | None:
    """A `generate` job's exit status where a warm process ran it; None to run the command
    here: sharing off, a load not shared, or a job this process refuses or that would be
    refused before its model loads (one line, as before). A probe loads its own models: idle
    warm loads are sent away first. Nothing heavy is imported on the way."""
    from tokenflip.run import shared_loads

    if args.command != "generate":
        shared_loads.make_room()
        return None
    from tokenflip.cli.args import check_paths
    from tokenflip.core.specs import CellJob
    from tokenflip.models.size import context_length
    from tokenflip.run.runtime import context_problem

    try:
        check_paths(args)
        job = CellJob.from_json(args.job)
        if context_problem(f"cell {job.cell.id}", None, job.max_new_tokens, context_length(args.model_dir)):
            return None
    except Exception:  # noqa: BLE001 - the command refuses it, in one line
        return None
    return shared_loads.hand_over(job, json.dumps(args.job), args.model_dir, args.out, args.quiet, WORKER)


def cmd_generate(args) -> None:
    from tokenflip.core.specs import CellJob
    from tokenflip.run.cell import run_cell

    meta = run_cell(CellJob.from_json(args.job), args.model_dir, args.out, progress=not args.quiet)
    print(f"{meta['cell_id']}: token-stream sha256 {meta['token_stream_sha256']}")
