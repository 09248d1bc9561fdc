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
