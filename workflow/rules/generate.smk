# One job per cell. A cell on a GPU holds one `gpu` token, so `--resources gpu=N` bounds
# how many run at once; CPU cells hold none and run one thread each, side by side. Cells
# without a cache, the longest by far (every step recomputes the whole sequence), start first.


rule generate:
    input:
        model=LAYOUT.model_pattern,
        prompts=LAYOUT.prompt_check_pattern,
    output:
        LAYOUT.cell_pattern,
    params:
        job=cell_job_json,
    log:
        LAYOUT.log("generate", "{model}/{benchmark}/{cell}"),
    threads: generate_threads
    priority: generate_priority
    resources:
        gpu=gpu_tokens,
        endpoint_traffic=endpoint_tokens,
    conda:
        "../../envs/tokenflip.yaml"
    shell:
        "tokenflip generate --job {params.job:q} --model-dir {input.model:q} --out {output:q} > {log:q} 2>&1"
