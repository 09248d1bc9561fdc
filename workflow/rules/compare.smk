# One CPU job per pair of cells that differ in one axis.


rule compare:
    input:
        unpack(pair_inputs),
    output:
        f"results/{RUN}/pairs/{{model}}/{{benchmark}}/{{axis}}/{{a}}_vs_{{b}}/{{context}}.parquet",
    params:
        pair=pair_id,
    log:
        f"logs/{RUN}/compare/{{model}}/{{benchmark}}/{{axis}}/{{a}}_vs_{{b}}/{{context}}.log",
    conda:
        "../../envs/tokenflip.yaml"
    shell:
        "tokenflip compare {input.a:q} {input.b:q} --pair-id {params.pair:q} --out {output:q} > {log:q} 2>&1"
