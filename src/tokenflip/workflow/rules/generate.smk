# One job per cell; in a study made in blocks (`blocks:` or `rounds:`, tokenflip.study.rounds),
# one job per block of its prompts, [0, 16), [16, 32), ... up to the benchmark's n, each a file
# of its own that no later run makes again, and the cell's file joins its blocks (a local
# job, no process of its own). A job on a GPU holds one
# `gpu` token, so `--resources gpu=N` bounds how many run at once; CPU blocks hold none and
# run one thread each, side by side. Cells without a cache, the longest by far (every step
# recomputes the whole sequence), start first.


rule generate:
    input:
        model=LAYOUT.model_pattern,
        # In blocks, the prompt check comes first but a remade one (a raised n) reruns no block:
        # a block depends on its own prompts (its params) and the benchmark's data files.
        prompts=ancient(LAYOUT.prompt_check_pattern) if BLOCKS else LAYOUT.prompt_check_pattern,
        data=benchmark_files if BLOCKS else [],
    output:
        LAYOUT.block_pattern if BLOCKS else LAYOUT.cell_pattern,
    params:
        job=block_job_json if BLOCKS else cell_job_json,
    log:
        LAYOUT.log("generate", "{model}/{benchmark}/{cell}" + ("/{first}-{end}" if BLOCKS else "")),
    threads: generate_threads
    priority: generate_priority
    resources:
        gpu=gpu_tokens,
        endpoint_traffic=endpoint_tokens,
    conda:
        CONDA_ENV
    shell:
        "tokenflip generate --job {params.job:q} --model-dir {input.model:q} --out {output:q} > {log:q} 2>&1"


if BLOCKS:

    localrules:
        join_blocks,
        blocks_plan,

    # Where each benchmark's blocks end (and the rounds' settings): remade when they change, so
    # that every cell is joined again and asks the rounds (their checkpoints) which blocks it takes
    # now; a checkpoint's missing record alone does not make Snakemake remake a finished cell.
    rule blocks_plan:
        output:
            LAYOUT.blocks_plan,
        params:
            plan=BLOCKS_PLAN,
        run:
            from tokenflip.core.storage import write_json

            write_json(output[0], json.loads(params.plan))

    rule join_blocks:
        input:
            plan=LAYOUT.blocks_plan,
            blocks=cell_blocks,
        output:
            LAYOUT.cell_pattern,
        params:
            job=cell_job_json,
        run:
            from tokenflip.run.blocks import join_blocks
            from tokenflip.core.specs import CellJob

            join_blocks(CellJob.from_json(params.job), block_list(cell_of(wildcards)), output[0])
