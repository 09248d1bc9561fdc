# Each model is prepared once (downloaded or dequantised, saved as safetensors).


rule prepare_model:
    output:
        directory("resources/models/{model}"),
    params:
        spec=model_spec_json,
    log:
        "logs/prepare_model/{model}.log",
    conda:
        "../../envs/tokenflip.yaml"
    shell:
        "tokenflip prepare-model --spec {params.spec:q} --out {output:q} > {log:q} 2>&1"
