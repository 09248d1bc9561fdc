# Mechanism probes: one GPU job per probe × model × benchmark, on a subset of prompts.
# Each probe writes several Parquet tables into its own directory.


rule probe_kv_cache:
    input:
        model="resources/models/{model}",
    output:
        probe_outputs("kv_cache"),
    params:
        settings=probe_settings_json("kv_cache"),
        out_dir=lambda wc: f"results/{RUN}/probes/{wc.model}/{wc.benchmark}/kv_cache",
    log:
        f"logs/{RUN}/probe/{{model}}/{{benchmark}}/kv_cache.log",
    threads: generate_threads
    resources:
        gpu=1,
    conda:
        "../../envs/tokenflip.yaml"
    shell:
        "tokenflip probe --settings {params.settings:q} --model-dir {input.model:q} "
        "--out-dir {params.out_dir:q} > {log:q} 2>&1"


rule probe_precision:
    input:
        model="resources/models/{model}",
    output:
        probe_outputs("precision"),
    params:
        settings=probe_settings_json("precision"),
        out_dir=lambda wc: f"results/{RUN}/probes/{wc.model}/{wc.benchmark}/precision",
    log:
        f"logs/{RUN}/probe/{{model}}/{{benchmark}}/precision.log",
    threads: generate_threads
    resources:
        gpu=1,
    conda:
        "../../envs/tokenflip.yaml"
    shell:
        "tokenflip probe --settings {params.settings:q} --model-dir {input.model:q} "
        "--out-dir {params.out_dir:q} > {log:q} 2>&1"
