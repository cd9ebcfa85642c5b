# Model preparation: weights from their source, converted once into resources/models/<name>/.


rule prepare_model:
    input:
        code=src_files("models"),
    output:
        directory("resources/models/{model}"),
    params:
        source=model_source,
    log:
        "logs/prepare_model/{model}.log",
    benchmark:
        "logs/prepare_model/{model}.benchmark.tsv"
    resources:
        **RESOURCES["medium"],
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/prepare_model.py"


rule write_model_manifest:
    input:
        models=model_targets(),
        code=src_files("models"),
    output:
        "resources/models/manifest.json",
    log:
        "logs/write_model_manifest/write_model_manifest.log",
    benchmark:
        "logs/write_model_manifest/write_model_manifest.benchmark.tsv"
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/write_model_manifest.py"
