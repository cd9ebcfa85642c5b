# Episode generation: one job per model x N cell.


rule generate_episodes:
    input:
        unpack(model_weights),
        prompts="config/prompts",
        code=src_files(
            "env",
            "agents",
            "policies",
            "episodes.py",
            "data.py",
            "config.py",
            "preemption.py",
            "analysis/provenance.py",
        ),
    output:
        episodes="results/episodes/{model}/n{size}.parquet",
        steps="results/episodes/{model}/n{size}.steps.parquet",
        transcripts="results/episodes/{model}/n{size}.transcripts.parquet",
        provenance="results/episodes/{model}/n{size}.provenance.json",
    params:
        model=model_entry,
        provenance=provenance_of("episodes"),
        environment=lookup(dpath="environment", within=config),
        episodes=episodes_per_cell,
        seed=lookup(dpath="seed", within=config),
        first_scenario=lookup(dpath="scenarios/test", within=config),
    log:
        "logs/generate_episodes/{model}/n{size}.log",
    benchmark:
        "logs/generate_episodes/{model}/n{size}.benchmark.tsv"
    wildcard_constraints:
        model=alternatives(UNSERVED_MODELS),
    threads: model_threads
    resources:
        **RESOURCES["medium"],
        gpu=model_gpus,
        # Only served models read it; machine settings come from profiles (set-resources).
        serve_host="loopback",
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/generate_episodes.py"


# The cells of served models (serve:): the job starts the model's server on a GPU, plays, and
# stops it. A rule of their own so that a profile can size these jobs apart from API and
# scripted cells.
use rule generate_episodes as generate_served_episodes with:
    log:
        "logs/generate_served_episodes/{model}/n{size}.log",
    benchmark:
        "logs/generate_served_episodes/{model}/n{size}.benchmark.tsv"
    wildcard_constraints:
        model=alternatives(SERVED_MODELS),
    threads: 4
    resources:
        **RESOURCES["gpu"],
        gpu=1,
        serve_host="loopback",
