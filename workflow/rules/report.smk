# Summaries of all cells and pairs, then the self-contained HTML report.


rule summarize:
    input:
        cells=CELL_FILES,
        pairs=PAIR_FILES,
        probes=PROBE_FILES,
    output:
        SUMMARIES,
    params:
        config=CONFIG_JSON,
        out_dir=lambda wildcards, output: os.path.dirname(output[0]),
        results=lambda wildcards, output: os.path.dirname(os.path.dirname(output[0])),
    log:
        f"logs/{RUN}/summarize.log",
    conda:
        "../../envs/tokenflip.yaml"
    shell:
        "tokenflip summarize --config-json {params.config:q} --results {params.results:q} "
        "--out-dir {params.out_dir:q} > {log:q} 2>&1"


rule report:
    input:
        SUMMARIES,
    output:
        report(REPORT, caption="../report/index.rst", category="tokenflip report"),
    params:
        config=CONFIG_JSON,
        summary_dir=lambda wildcards, input: os.path.dirname(input[0]),
    log:
        f"logs/{RUN}/report.log",
    conda:
        "../../envs/tokenflip.yaml"
    shell:
        "tokenflip report --config-json {params.config:q} --summary-dir {params.summary_dir:q} --out {output:q} > {log:q} 2>&1"
