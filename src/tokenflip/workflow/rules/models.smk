# Each model is prepared once (downloaded or dequantised, saved as safetensors).


# Before the first job (not in a dry run): every hub model not yet prepared can be reached,
# from the network or the local cache, with its token and revision; else stop, naming the
# model, the cause and the fix.
onstart:
    from tokenflip.models.hub import hub_problems

    _problems = hub_problems(config, os.path.dirname(LAYOUT.model_dir("_")))
    # Every endpoint with a cell still to make answers, serves the model it names, and
    # tokenizes as the model its cells encode with.
    from tokenflip.run.engines.endpoint.server import endpoint_problems

    _problems += endpoint_problems(config, [c for c in CELLS if not os.path.exists(LAYOUT.cell(c.id))],
                                   LAYOUT.model_dir)
    if _problems:
        from tokenflip.core.excerpt import redacted

        raise SystemExit(redacted("tokenflip: models or endpoints that cannot be reached from here:\n  "
                                  + "\n  ".join(_problems)))


rule prepare_model:
    output:
        directory(LAYOUT.model_pattern),
    params:
        spec=model_spec_json,
    log:
        LAYOUT.log("prepare_model", "{model}"),
    conda:
        CONDA_ENV
    shell:
        # On failure the log's end (its cause) goes to the console, not only into the log.
        "tokenflip prepare-model --spec {params.spec:q} --out {output:q} > {log:q} 2>&1 "
        "|| {{ echo 'prepare_model {wildcards.model} failed; the end of {log}:' >&2; tail -n 12 {log:q} >&2; exit 1; }}"


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
        CONDA_ENV
    shell:
        "tokenflip check-prompts --benchmark {wildcards.benchmark:q} --spec {params.spec:q} "
        "--model-dir {input.model:q} --max-new-tokens {params.max_new_tokens} --out {output:q} > {log:q} 2>&1"
