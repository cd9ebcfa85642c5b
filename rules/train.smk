# GRPO training: one job per run, writing a checkpoint folder per step; and the learning-rate
# pilot, which runs before a study and is no part of `all`.


rule train_grpo:
    input:
        weights=run_weights,
        prompts="config/prompts",
    output:
        # One folder for all steps: evaluation jobs take it whole and read their step, so a
        # retrain reruns them (per-step folders would miss nothing more, at more rules).
        checkpoints=directory("results/train/{run}/checkpoints"),
        history="results/train/{run}/history.parquet",
        rollouts=directory("results/train/{run}/rollouts"),
        provenance="results/train/{run}/provenance.json",
    params:
        code=code_of("train_grpo"),
        run=run_entry,
        provenance=provenance_of("train"),
        base=run_base_entry,
        environment=lookup(dpath="environment", within=config),
        seed=lookup(dpath="seed", within=config),
        first_scenario=lookup(dpath="scenarios/train", within=config),
    log:
        "logs/train_grpo/{run}.log",
    benchmark:
        "logs/train_grpo/{run}.benchmark.tsv"
    threads: threads_of(run_base_model)
    resources:
        mem_mb=lambda wildcards, attempt: 8000 * attempt,
        runtime=lambda wildcards, attempt: 240 * attempt,
        gpu=gpu_slot_of(run_base_model),
        **site_resources(gpus=1, gpu_memory_gb=run_gpu_memory_gb),
    conda:
        trainer_env
    script:
        "../workflow/scripts/train_grpo.py"


rule index_training:
    input:
        outputs=training_targets(),
    output:
        "results/train/index.json",
    params:
        code=code_of("write_index"),
    log:
        "logs/index_training/index_training.log",
    benchmark:
        "logs/index_training/index_training.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/write_index.py"


# One job: the rates train one after another, each on all the job's threads. Only the table,
# its rendering and the choice are outputs: the rates' runs under results/pilot/ are not, so
# that Snakemake never deletes a finished rate, or a killed one's resume folder, before a rerun.
rule pilot:
    input:
        weights=pilot_weights,
        prompts="config/prompts",
    output:
        table="results/pilot/pilot.csv",
        markdown="results/pilot/pilot.md",
        choice="results/pilot/choice.json",
    params:
        code=code_of("train_pilot"),
        pilot=pilot_entry,
        recipe_run=pilot_recipe_run,
        recipe=pilot_recipe_entry,
        base=lambda wildcards: pilot_base_model(wildcards).entry,
        environment=lookup(dpath="environment", within=config),
        seed=lookup(dpath="seed", within=config),
        first_scenario=lookup(dpath="scenarios/train", within=config),
    log:
        "logs/pilot/pilot.log",
    benchmark:
        "logs/pilot/pilot.benchmark.tsv"
    threads: threads_of(pilot_base_model)
    resources:
        mem_mb=lambda wildcards, attempt: 8000 * attempt,
        runtime=lambda wildcards, attempt: (
            240 * attempt * pilot_candidates(wildcards)
        ),
        gpu=gpu_slot_of(pilot_base_model),
        **site_resources(
            gpus=1, gpu_memory_gb=lambda wildcards: pilot_base_model(wildcards).served_gpu_memory_gb
        ),
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/train_pilot.py"
