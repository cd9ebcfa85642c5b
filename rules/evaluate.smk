# Checkpoint discipline: validation of every (k-th) checkpoint, selection, and the test grid
# of each selected checkpoint, played as model <run>@<policy>.


rule evaluate_checkpoint:
    input:
        weights=run_weights,
        checkpoints="results/train/{run}/checkpoints",
        prompts="config/prompts",
        code=src_files(
            "evaluation",
            "agents",
            "policies",
            "env",
            "episodes.py",
            "data.py",
            "config.py",
            "preemption.py",
        ),
    output:
        episodes="results/eval/{run}/step_{step}.parquet",
        steps="results/eval/{run}/step_{step}.steps.parquet",
        transcripts="results/eval/{run}/step_{step}.transcripts.parquet",
    params:
        run=run_entry,
        base=run_base_entry,
        environment=lookup(dpath="environment", within=config),
        seed=lookup(dpath="seed", within=config),
        first_scenario=lookup(dpath="scenarios/validation", within=config),
        episodes=lookup(dpath="evaluation/episodes", within=config),
    log:
        "logs/evaluate_checkpoint/{run}/step_{step}.log",
    benchmark:
        "logs/evaluate_checkpoint/{run}/step_{step}.benchmark.tsv"
    threads: MODEL_THREADS
    resources:
        **RESOURCES["medium"],
        gpu=1,
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/evaluate_checkpoint.py"


rule select_checkpoints:
    input:
        rollouts="results/train/{run}/rollouts",
        validation=validation_tables,
        code=src_files("evaluation", "analysis/intervals.py", "env/reward.py", "config.py"),
    output:
        selection="results/eval/{run}/selection.json",
        # One file per policy, holding only its step: a test job reruns exactly when its
        # own choice changes (reference/checkpoint-dag.md, design C+).
        choices=expand("results/eval/{{run}}/select/{policy}.json", policy=POLICIES),
    params:
        run=run_entry,
        policies=POLICIES,
        reward=lookup(dpath="reward", within=config),
        analysis=analysis_settings("confidence", "bootstrap_resamples", "seed"),
    log:
        "logs/select_checkpoints/{run}.log",
    benchmark:
        "logs/select_checkpoints/{run}.benchmark.tsv"
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/select_checkpoints.py"


rule test_checkpoint:
    input:
        choice="results/eval/{run}/select/{policy}.json",
        weights=run_weights,
        checkpoints="results/train/{run}/checkpoints",
        prompts="config/prompts",
        code=src_files(
            "evaluation",
            "agents",
            "policies",
            "env",
            "episodes.py",
            "data.py",
            "config.py",
            "preemption.py",
        ),
    output:
        episodes="results/test/{run}@{policy}/n{size}.parquet",
        steps="results/test/{run}@{policy}/n{size}.steps.parquet",
        transcripts="results/test/{run}@{policy}/n{size}.transcripts.parquet",
    params:
        base=selected_base_entry,
        environment=lookup(dpath="environment", within=config),
        episodes=selected_episodes,
        seed=lookup(dpath="seed", within=config),
        first_scenario=lookup(dpath="scenarios/test", within=config),
    log:
        "logs/test_checkpoint/{run}@{policy}/n{size}.log",
    benchmark:
        "logs/test_checkpoint/{run}@{policy}/n{size}.benchmark.tsv"
    threads: MODEL_THREADS
    resources:
        **RESOURCES["medium"],
        gpu=1,
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/test_checkpoint.py"
