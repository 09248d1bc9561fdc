# The results checked against the config and summarised, then the self-contained report.


rule summarize:
    input:
        cells=CELL_FILES,
        pairs=PAIR_FILES,
        probes=PROBE_FILES,
    output:
        SUMMARIES,
    params:
        config=CONFIG_JSON,
    log:
        LAYOUT.log("summarize", "summarize"),
    conda:
        CONDA_ENV
    shell:
        "tokenflip summarize --config-json {params.config:q} > {log:q} 2>&1"


rule report:
    input:
        SUMMARIES,
    output:
        report(REPORT, caption="../report/index.rst", category="tokenflip report"),
    params:
        config=CONFIG_JSON,
    log:
        LAYOUT.log("report", "report"),
    conda:
        CONDA_ENV
    shell:
        "tokenflip report --config-json {params.config:q} > {log:q} 2>&1"
