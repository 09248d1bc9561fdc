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
        results=f"results/{RUN}",
    log:
        f"logs/{RUN}/summarize.log",
    shell:
        "{TOKENFLIP} summarize --config-json {params.config:q} --results {params.results:q} "
        "--out-dir {SUMMARY_DIR:q} > {log:q} 2>&1"


rule report:
    input:
        SUMMARIES,
    output:
        REPORT,
    params:
        config=CONFIG_JSON,
    log:
        f"logs/{RUN}/report.log",
    shell:
        "{TOKENFLIP} report --config-json {params.config:q} --summary-dir {SUMMARY_DIR:q} --out {output:q} > {log:q} 2>&1"
