# Mechanism probes: one job per probe × model × benchmark, on a subset of prompts (chosen
# from the results of the pairs it explains), each writing its tables into its own folder. One rule per registered probe (tokenflip.run.probes).

for _probe in PROBES:

    rule:
        name:
            f"probe_{_probe}"
        input:
            model=LAYOUT.model_pattern,
            prompts=LAYOUT.prompt_check_pattern,
            pairs=probe_pair_files(_probe),
        output:
            [LAYOUT.probe_pattern(_probe, table) for table in PROBES[_probe].tables],
        params:
            job=probe_job_json(_probe),
            out_dir=probe_out_dir(_probe),
        log:
            LAYOUT.log("probe", f"{{model}}/{{benchmark}}/{_probe}"),
        threads: generate_threads
        priority: 4  # the longest jobs after the cache-off cells: start each as soon as its pairs are in
        resources:
            gpu=gpu_tokens,
        conda:
            CONDA_ENV
        shell:
            "tokenflip probe --job {params.job:q} --model-dir {input.model:q} --out-dir {params.out_dir:q} "
            "--pairs {input.pairs:q} > {log:q} 2>&1"
