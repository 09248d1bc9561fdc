# One CPU job per pair of cells that differ in one axis.


rule compare:
    input:
        unpack(pair_inputs),
    output:
        LAYOUT.pair_pattern,
    params:
        pair=pair_id,
        # Not read by the command: a pair file made with other per-prompt columns (an earlier
        # tokenflip) has other params on record, so Snakemake makes it again.
        columns=",".join(PER_PROMPT_COLUMNS),
    log:
        LAYOUT.log("compare", "{model}/{benchmark}/{axis}/{a}_vs_{b}/{context}"),
    priority: compare_priority
    conda:
        "../../envs/tokenflip.yaml"
    shell:
        "tokenflip compare {input.a:q} {input.b:q} --pair-id {params.pair:q} --out {output:q} > {log:q} 2>&1"
