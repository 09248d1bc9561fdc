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
        CONDA_ENV
    shell:
        "tokenflip compare {input.a:q} {input.b:q} --pair-id {params.pair:q} --out {output:q} > {log:q} 2>&1"


# A study of rounds (`rounds:` in its config): after each round's blocks, every comparison
# still open is judged (an anytime-valid paired test against its noise floors); the cells
# of the undecided ones get the next block. A local job: it reads token ids only.
localrules:
    decide_round,


checkpoint decide_round:
    input:
        unpack(round_inputs),
    output:
        LAYOUT.round_pattern,
    params:
        question=round_question,
    log:
        LAYOUT.log("rounds", "{round}"),
    run:
        from tokenflip.analysis.rounds import decide_round

        decide_round(config, LAYOUT, int(wildcards.round), JUDGED, input.previous[0] if input.previous else None,
                     output[0], pairs=len(PAIRS))
