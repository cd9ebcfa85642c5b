# Checkpoint discipline: validation of every (k-th) checkpoint, selection, and the test grid
# of each selected checkpoint, played as model <run>@<policy>.


rule evaluate_checkpoints:
    # One job per run plays every evaluated checkpoint: a served base model's server starts
    # once for all of them (coordgap.evaluation.checkpoints.validate_checkpoints).
    input:
        weights=run_weights,
        checkpoints="results/train/{run}/checkpoints",
        prompts="config/prompts",
    output:
        # step_<kkkk>.parquet and its steps and transcripts tables, per evaluated checkpoint.
        validation=directory("results/eval/{run}/validation"),
        provenance="results/eval/{run}/validation.provenance.json",
    params:
        code=code_of("evaluate_checkpoints"),
        run=run_entry,
        steps=run_steps,
        provenance=provenance_of("eval"),
        base=run_base_entry,
        environment=lookup(dpath="environment", within=config),
        seed=lookup(dpath="seed", within=config),
        first_scenario=lookup(dpath="scenarios/validation", within=config),
        episodes=lookup(dpath="evaluation/episodes", within=config),
    log:
        "logs/evaluate_checkpoints/{run}.log",
    benchmark:
        "logs/evaluate_checkpoints/{run}.benchmark.tsv"
    threads: threads_of(run_base_model)
    resources:
        **RESOURCES["medium"],
        gpu=gpu_slot_of(run_base_model),
        **site_resources(gpus=1, gpu_memory_gb=run_gpu_memory_gb),
        serve_host="loopback",
    conda:
        checkpoint_env
    script:
        "../workflow/scripts/evaluate_checkpoints.py"


rule select_checkpoint:
    input:
        rollouts="results/train/{run}/rollouts",
        validation=rules.evaluate_checkpoints.output.validation,
    output:
        # One job and file per policy, holding its choice: adding a policy runs only its own
        # selection and tests, and a test reruns only when its policy's inputs change.
        "results/eval/{run}/select/{policy}.json",
    params:
        code=code_of("select_checkpoint"),
        run=run_entry,
        analysis=analysis_settings("confidence", "bootstrap_resamples", "seed"),
    log:
        "logs/select_checkpoint/{run}/{policy}.log",
    benchmark:
        "logs/select_checkpoint/{run}/{policy}.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/select_checkpoint.py"


rule summarize_selection:
    input:
        rollouts="results/train/{run}/rollouts",
        validation=rules.evaluate_checkpoints.output.validation,
    output:
        "results/eval/{run}/selection.json",
    params:
        code=code_of("summarize_selection"),
        run=run_entry,
        policies=POLICIES,
        analysis=analysis_settings("confidence", "bootstrap_resamples", "seed"),
    log:
        "logs/summarize_selection/{run}.log",
    benchmark:
        "logs/summarize_selection/{run}.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/summarize_selection.py"


rule test_checkpoint:
    input:
        choice="results/eval/{run}/select/{policy}.json",
        weights=run_weights,
        checkpoints="results/train/{run}/checkpoints",
        prompts="config/prompts",
    output:
        episodes="results/test/{run}@{policy}/n{size}.parquet",
        steps="results/test/{run}@{policy}/n{size}.steps.parquet",
        transcripts="results/test/{run}@{policy}/n{size}.transcripts.parquet",
        provenance="results/test/{run}@{policy}/n{size}.provenance.json",
    params:
        code=code_of("test_checkpoint"),
        base=run_base_entry,
        provenance=provenance_of("test"),
        environment=lookup(dpath="environment", within=config),
        episodes=selected_episodes,
        seed=lookup(dpath="seed", within=config),
        first_scenario=lookup(dpath="scenarios/test", within=config),
    log:
        "logs/test_checkpoint/{run}@{policy}/n{size}.log",
    benchmark:
        "logs/test_checkpoint/{run}@{policy}/n{size}.benchmark.tsv"
    threads: threads_of(run_base_model)
    resources:
        **RESOURCES["medium"],
        gpu=gpu_slot_of(run_base_model),
        **site_resources(gpus=1, gpu_memory_gb=run_gpu_memory_gb),
        serve_host="loopback",
    conda:
        checkpoint_env
    script:
        "../workflow/scripts/test_checkpoint.py"


rule index_selections:
    input:
        outputs=selection_targets(),
    output:
        "results/eval/index.json",
    params:
        code=code_of("write_index"),
    log:
        "logs/index_selections/index_selections.log",
    benchmark:
        "logs/index_selections/index_selections.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/write_index.py"


rule index_tests:
    input:
        outputs=test_targets(),
    output:
        "results/test/index.json",
    params:
        code=code_of("write_index"),
    log:
        "logs/index_tests/index_tests.log",
    benchmark:
        "logs/index_tests/index_tests.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/write_index.py"
