# Episode generation: one job per model x N cell.


rule generate_episodes:
    input:
        unpack(model_weights),
        prompts="config/prompts",
        code=src_files(
            "env", "agents", "policies", "episodes.py", "data.py", "config.py", "preemption.py"
        ),
    output:
        episodes="results/episodes/{model}/n{size}.parquet",
        steps="results/episodes/{model}/n{size}.steps.parquet",
        transcripts="results/episodes/{model}/n{size}.transcripts.parquet",
    params:
        model=model_entry,
        environment=lookup(dpath="environment", within=config),
        episodes=episodes_per_cell,
        seed=lookup(dpath="seed", within=config),
        first_scenario=lookup(dpath="scenarios/test", within=config),
    log:
        "logs/generate_episodes/{model}/n{size}.log",
    benchmark:
        "logs/generate_episodes/{model}/n{size}.benchmark.tsv"
    threads: model_threads
    resources:
        **RESOURCES["medium"],
        gpu=model_gpus,
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/generate_episodes.py"
