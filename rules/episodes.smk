# Episode generation: one job per model x N cell.


rule generate_episodes:
    input:
        unpack(model_weights),
        prompts="config/prompts",
    output:
        episodes="results/episodes/{model}/n{size}.parquet",
        steps="results/episodes/{model}/n{size}.steps.parquet",
        transcripts="results/episodes/{model}/n{size}.transcripts.parquet",
        provenance="results/episodes/{model}/n{size}.provenance.json",
    params:
        code=code_of("generate_episodes"),
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
        model=alternatives(IN_JOB_MODELS),
    threads: model_threads
    resources:
        **RESOURCES["medium"],
        gpu=gpu_slot_of(wildcard_model),
        **site_resources(gpus=model_gpus),
        # Only served models read it; machine settings come from profiles (set-resources).
        serve_host="loopback",
    conda:
        PROJECT_ENV
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
        **site_resources(gpus=1, gpu_memory_gb=model_gpu_memory_gb),
        serve_host="loopback",
    conda:
        VLLM_ENV


# The cells of hosted-API models: no GPU, one api_<provider> slot each (profiles cap them),
# and, where the site says so (api_jobs: submit_host), run by Snakemake on the submit host
# instead of a compute node without internet access.
use rule generate_episodes as generate_api_episodes with:
    log:
        "logs/generate_api_episodes/{model}/n{size}.log",
    benchmark:
        "logs/generate_api_episodes/{model}/n{size}.benchmark.tsv"
    wildcard_constraints:
        model=alternatives(API_MODELS),
    threads: 1
    resources:
        **RESOURCES["medium"],
        gpu=0,
        **site_resources(),
        **api_slots(),
        serve_host="loopback",
    conda:
        API_ENV
    localrule: SITE.api_jobs_local
