# Each model is prepared once (downloaded or dequantised, saved as safetensors).


rule prepare_model:
    output:
        directory(LAYOUT.model_pattern),
    params:
        spec=model_spec_json,
    log:
        LAYOUT.log("prepare_model", "{model}"),
    conda:
        "../../envs/tokenflip.yaml"
    shell:
        "tokenflip prepare-model --spec {params.spec:q} --out {output:q} > {log:q} 2>&1"


# Before any generation job: the model's tokenizer takes every prompt of the benchmark in
# its configured format (a base checkpoint has no chat template; some templates refuse a
# system turn). Seconds on a CPU instead of a failed GPU job.
rule check_prompts:
    input:
        model=LAYOUT.model_pattern,
        data=benchmark_files,
    output:
        LAYOUT.prompt_check_pattern,
    params:
        spec=benchmark_spec_json,
        max_new_tokens=lambda w: longest_generation(config, w.model, w.benchmark),
    log:
        LAYOUT.log("check_prompts", "{model}/{benchmark}"),
    conda:
        "../../envs/tokenflip.yaml"
    shell:
        "tokenflip check-prompts --benchmark {wildcards.benchmark:q} --spec {params.spec:q} "
        "--model-dir {input.model:q} --max-new-tokens {params.max_new_tokens} --out {output:q} > {log:q} 2>&1"
