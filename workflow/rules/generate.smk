# One GPU job per cell. `gpu=1` lets `--resources gpu=N` bound how many run at once.


rule generate:
    input:
        model="resources/models/{model}",
    output:
        f"results/{RUN}/cells/{{model}}/{{benchmark}}/{{cell}}.parquet",
    params:
        settings=cell_settings_json,
    log:
        f"logs/{RUN}/generate/{{model}}/{{benchmark}}/{{cell}}.log",
    threads: generate_threads
    resources:
        gpu=1,
    conda:
        "../../envs/tokenflip.yaml"
    shell:
        "tokenflip generate --settings {params.settings:q} --model-dir {input.model:q} "
        "--out {output:q} > {log:q} 2>&1"
