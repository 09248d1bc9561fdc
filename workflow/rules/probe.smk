# Mechanism probes: one GPU job per probe × model × benchmark, on a subset of prompts.


rule probe:
    input:
        model="resources/models/{model}",
    output:
        expand(f"results/{RUN}/probes/{{{{model}}}}/{{{{benchmark}}}}/{{{{probe}}}}/{{table}}.parquet",
               table=PROBE_TABLES),
    params:
        settings=probe_settings_json,
        out_dir=lambda wc: f"results/{RUN}/probes/{wc.model}/{wc.benchmark}/{wc.probe}",
    log:
        f"logs/{RUN}/probe/{{model}}/{{benchmark}}/{{probe}}.log",
    threads: generate_threads
    resources:
        gpu=1,
    shell:
        "{TOKENFLIP} probe --settings {params.settings:q} --model-dir {input.model:q} "
        "--out-dir {params.out_dir:q} > {log:q} 2>&1"
