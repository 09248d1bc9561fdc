"""`tokenflip run-cell --config C --cell ID`: one cell of a config outside Snakemake, with the
checks the pipeline makes before it (the config validated, the model prepared, its prompts
and the tokens asked within the model's context), so that a cell run by hand is refused
where the pipeline would refuse it, not after it has grown past the machine's memory."""

from __future__ import annotations

from pathlib import Path

from tokenflip.core.inputs import shown


def cmd_run_cell(args) -> None:
    """One cell of a config, outside Snakemake: prepares the model if needed."""
    from tokenflip.core.layout import RunLayout
    from tokenflip.models.prepare import load_tokenizer, prepare
    from tokenflip.run.benchmarks import build_benchmark
    from tokenflip.run.cell import run_cell
    from tokenflip.run.runtime import check_prompts
    from tokenflip.study import config as cfg
    from tokenflip.study.limits import context_length
    from tokenflip.study.plan import cell_job, expand_cells

    config = cfg.load(args.config)
    cells = {cell.id: cell for cell in expand_cells(config)}
    if args.cell not in cells:
        raise cfg.ConfigError(f"{args.config}: no cell {shown(args.cell)}; `tokenflip plan --config "
                              f"{args.config}` lists them")
    cell = cells[args.cell]
    layout = RunLayout(config["run"])
    model_dir = Path(args.models_dir) / cell.model if args.models_dir else Path(layout.model_dir(cell.model))
    if not (model_dir / "model.json").exists():
        prepare(config["models"][cell.model], model_dir)
    out, job = args.out or layout.cell(cell.id), cell_job(config, cell)
    # the check the pipeline runs before any cell (check_prompts): the prompts and the tokens asked fit the model
    check_prompts(load_tokenizer(model_dir), build_benchmark(cell.benchmark, job.benchmark), job.max_new_tokens,
                  context_length(model_dir))
    meta = run_cell(job, model_dir, out, progress=not args.quiet)
    print(f"{out}: token-stream sha256 {meta['token_stream_sha256']}")
