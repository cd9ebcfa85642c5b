# Model preparation, once per model into resources/models/<name>/, on a CPU node before any
# GPU job: an hf: source downloaded as published at its pinned commit, a local source
# converted to safetensors (coordgap.models.prepare). GPU jobs run with the hub offline.


rule prepare_model:
    output:
        directory("resources/models/{model}"),
    params:
        code=code_of("prepare_model"),
        source=model_source,
        source_key=model_source_key,
    log:
        "logs/prepare_model/{model}.log",
    benchmark:
        "logs/prepare_model/{model}.benchmark.tsv"
    resources:
        **RESOURCES["medium"],
        **site_resources(),
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/prepare_model.py"


rule write_model_manifest:
    input:
        models=model_targets(),
    output:
        "resources/models/manifest.json",
    params:
        code=code_of("write_model_manifest"),
    log:
        "logs/write_model_manifest/write_model_manifest.log",
    benchmark:
        "logs/write_model_manifest/write_model_manifest.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/write_model_manifest.py"
