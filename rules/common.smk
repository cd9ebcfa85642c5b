# Helpers of the workflow: validation, constants, wildcard constraints, target and input
# functions, resource presets. Every other .smk file holds rules only.

import re
from pathlib import Path
from urllib.parse import urlsplit

from snakemake.utils import available_cpu_count

from coordgap.analysis.catalog import STATISTICS_FIGURES, figure_catalog
from coordgap.provenance import output_identity
from coordgap.code import code_digest
from coordgap.site import has_gpu_devices, load_site
from coordgap.config.checks import check_cross_keys
from coordgap.config.keys import check_schema
from coordgap.config.play import ModelSpec, cell_episodes
from coordgap.config.training import (
    PilotConfig,
    arms,
    checkpoint_families,
    compared_arms,
    compared_checkpoints,
    evaluated_steps,
    pilot_recipe,
    pilot_section,
    selected_checkpoints,
)

# ---------------------------------------------------------------- validation

# The schema first (names the offending key), then the cross-key rules; both before any job.
check_schema(config)
check_cross_keys(config)
# This cluster's and this user's settings (coordgap.site): where each kind of job goes.
SITE = load_site()

# ---------------------------------------------------------------- constants

# The study's report: the last output of `all`, and what a run's last line points at.
REPORT = "results/report.md"
# The same report as one self-contained page (figures inline), beside it for its CSV links.
REPORT_PAGE = "results/report.html"
# The folder of the headline numbers for `dvc metrics`: a JSON file per model, a row of
# `dvc metrics show` each (metric_targets).
METRICS = "results/metrics"

MODELS = list(config["models"])
# Each model as the class of its kind (coordgap.config.play): what its jobs need.
MODEL_SPECS = {name: ModelSpec.from_dict(name, entry) for name, entry in config["models"].items()}
# Models with prepared weights (resources/models/<name>), local or served with a source.
PREPARED_MODELS = [name for name, model in MODEL_SPECS.items() if model.weights_source]


def models_of(rule):
    """The models whose cells the generation rule ``rule`` plays."""
    return [name for name, model in MODEL_SPECS.items() if model.generation_rule == rule]


# Models played through a server their own job starts (serve:), on a GPU.
SERVED_MODELS = models_of("generate_served_episodes")
# Models behind a hosted API (kind openai, no serve:), played by jobs that need no GPU.
API_MODELS = models_of("generate_api_episodes")
# Scripted and in-process models: everything the job itself computes.
IN_JOB_MODELS = models_of("generate_episodes")
RUNS = list(config["training"]["runs"])
# The study's arms, each with its runs (one per seed: README "Seeds"), and those of several
# seeds, whose seeds the arm figures overlay.
ARMS = arms(config)
SEEDED_ARMS = [arm for arm, runs in ARMS.items() if len(runs) > 1]
POLICIES = config["evaluation"]["policies"]
# Selected checkpoints, models named <run>@<policy>: each plays the test grid.
SELECTED = selected_checkpoints(config)
# Those the coordination statistics compare, and their arms: all but the positive control's,
# whose only statistic is its check (CONTROL).
COMPARED = compared_checkpoints(config)
COMPARED_ARMS = compared_arms(config)
# The positive control's check (analysis.control; README "What runs"), or None, and its table.
CONTROL = config["analysis"]["control"]
CONTROL_TABLE = "results/stats/control.csv"
SIZES = config["experiment"]["sizes"]
VARIANTS = config["reward"]["variants"]
# The software of the rules, used with --sdm conda; locally, .venv from `make all` runs them
# all. The project on CPU torch: scripted and in-process models, trainer torch, the analysis.
PROJECT_ENV = "../workflow/envs/coordgap.yaml"
# The project and LangChain's provider packages: hosted API models.
API_ENV = "../workflow/envs/api.yaml"
# The project and ART's GPU backend, which pins its own torch: trainer art.
ART_ENV = "../workflow/envs/art.yaml"
# The project and a pinned vLLM: the jobs that start a model's server (serve:).
VLLM_ENV = "../workflow/envs/vllm.yaml"
# Where the rules' code digests are read (coordgap.code): this workflow's own adapters and src/.
SCRIPTS = Path(workflow.basedir) / "workflow" / "scripts"
SRC = Path(workflow.basedir) / "src" / "coordgap"


def alternatives(names):
    """A regex matching exactly these names; one that matches nothing when there are none."""
    return "|".join(re.escape(name) for name in names) or "(?!)"


wildcard_constraints:
    model=alternatives(MODELS),
    run=alternatives(RUNS),
    arm=alternatives(SEEDED_ARMS),
    policy="|".join(POLICIES),
    step=r"\d{4}",
    size=r"\d+",
    variant="|".join(VARIANTS),


# Quick jobs that run where Snakemake runs, never on a cluster node. The plot rules of the
# figure catalog say so themselves (localrule: True in rules/analysis.smk).
localrules:
    all,
    episodes,
    models,
    train,
    evaluate,
    index_training,
    index_selections,
    index_tests,
    select_checkpoint,
    summarize_selection,
    write_model_manifest,
    compute_power,
    plot_timeline,
    plot_training,
    write_report,


# ---------------------------------------------------------------- resource presets

# Named presets, scaled by the attempt so a retried job asks for more. runtime is in minutes.
RESOURCES = {
    "light": {
        "mem_mb": lambda wildcards, attempt: 1000 * attempt,
        "runtime": lambda wildcards, attempt: 15 * attempt,
    },
    "medium": {
        "mem_mb": lambda wildcards, attempt: 4000 * attempt,
        "runtime": lambda wildcards, attempt: 60 * attempt,
    },
    # A job that runs a model server on a GPU: host memory for the server's process, and
    # time for loading the weights; profiles/slurm sizes these for the paper's models.
    "gpu": {
        "mem_mb": lambda wildcards, attempt: 16000 * attempt,
        "runtime": lambda wildcards, attempt: 120 * attempt,
    },
}

# ---------------------------------------------------------------- functions


def api_group(entry):
    """The provider an API model's requests go to, as its concurrency resource names it: the
    LangChain provider for its default endpoint, else the endpoint's host (api.x.ai -> x_ai)."""
    if entry["base_url"] is None:
        return entry["provider"]
    host = urlsplit(entry["base_url"]).hostname.removeprefix("api.")
    return re.sub(r"\W", "_", host)


# One resource per provider, api_<group>=1 for each of its cells: a profile's `resources`
# caps how many run at once (profiles/default, profiles/slurm), so that concurrent cells do
# not exceed the provider's rate limits together.
API_GROUPS = sorted({api_group(config["models"][name]) for name in API_MODELS})


def api_slots():
    """A generation job's api_<group> resources: 1 for its model's provider, 0 for others."""
    return {
        f"api_{group}": lambda wildcards, group=group: int(
            api_group(config["models"][wildcards.model]) == group
        )
        for group in API_GROUPS
    }


def site_resources(gpus=0, gpu_memory_gb=0):
    """The site file's resources of a rule's jobs (coordgap.site): partition, account, QOS and,
    for a GPU job, constraint and the smallest GPU model that holds it.

    Args:
        gpus: GPUs a job uses, or a function of its wildcards giving them.
        gpu_memory_gb: GPU memory a job needs, or a function of its wildcards.

    Returns:
        Only the keys the site sets, each a function of the job's wildcards (None drops the key
        from a job it does not apply to), so that without a site file nothing is added.
    """

    def of_job(key):
        def value(wildcards):
            job_gpus = gpus(wildcards) if callable(gpus) else gpus
            memory = gpu_memory_gb(wildcards) if callable(gpu_memory_gb) else gpu_memory_gb
            return SITE.slurm.resources(gpus=job_gpus, gpu_memory_gb=memory).get(key)

        return value

    return {key: of_job(key) for key in SITE.slurm.resource_keys()}


def code_of(script):
    """A rule's code param: the digest of what its adapter ``script`` runs (coordgap.code).

    A param, not inputs: a job reruns when code it imports changes in meaning, and not for a
    comment, a docstring or a file that merely got newer.
    """
    return code_digest(SCRIPTS / f"{script}.py", SRC)


def model_entry(wildcards):
    """The config entry of the model in the job's wildcards."""
    return config["models"][wildcards.model]


def wildcard_model(wildcards):
    """The ModelSpec of the model in the job's wildcards."""
    return MODEL_SPECS[wildcards.model]


def model_source(wildcards):
    """The weights source of a local or served model."""
    return wildcard_model(wildcards).weights_source


def model_source_key(wildcards):
    """The config key of that source, for the job's error messages."""
    return wildcard_model(wildcards).weights_source_key


def episodes_per_cell(wildcards):
    """Episodes in a cell: a language model's own count if it sets one, else the experiment's."""
    return cell_episodes(config, wildcards.model)


def model_weights(wildcards):
    """The prepared weights folder as a named input, for models that have one."""
    if wildcards.model in PREPARED_MODELS:
        return {"weights": f"resources/models/{wildcards.model}"}
    return {}


def model_gpus(wildcards):
    """GPUs a generation job uses: one for an in-process or served model, none otherwise."""
    return wildcard_model(wildcards).gpus


def model_gpu_memory_gb(wildcards):
    """GPU memory a generation job needs: its served model's (serve.gpu_memory_gb)."""
    return wildcard_model(wildcards).served_gpu_memory_gb


# Threads of a job that runs a model in-process: every core it may use (Snakemake's --cores,
# at most the machine's), or fewer where the model's `threads` says so (in_process_threads).
# Snakemake sets the job's OMP/MKL thread variables to this, and torch uses exactly that many.
# A cluster run has no --cores: such a job asks the scheduler for CLUSTER_MODEL_THREADS CPUs
# (profiles/slurm's set-threads may change it per rule), and on its node Snakemake runs it
# with the CPUs it was given (--cores all).
CLUSTER_MODEL_THREADS = 4
MODEL_THREADS = (
    CLUSTER_MODEL_THREADS
    if workflow.resource_settings.cores is None
    else min(workflow.resource_settings.cores, available_cpu_count())
)


def in_process_threads(model):
    """Threads of a job that runs ``model`` (a ModelSpec) in-process: its own, or MODEL_THREADS."""
    return min(model.threads or MODEL_THREADS, MODEL_THREADS)


# Whether this run's in-process models may run on a GPU: a cluster's nodes have them.
MAY_USE_GPU = workflow.resource_settings.cores is None or has_gpu_devices()


def gpu_slot(model):
    """The profile's `gpu` slots a job that runs ``model`` (a ModelSpec) holds.

    A served model's job: its server's GPUs. An in-process model's: one, so that its jobs run
    one at a time, on a workstation's GPU or on every core of a CPU; none on a machine without
    a GPU where the model's ``threads`` asks for fewer, so that --cores / threads of its jobs
    run side by side (on 2 cores, two one-thread jobs did 1.6x the work of one two-thread job:
    README, "The local model's numerics and threads").
    """
    if not model.in_process:
        return model.gpus
    return int(MAY_USE_GPU or model.threads is None)


def model_threads(wildcards):
    """Threads of a generation job: in_process_threads for an in-process model, else one."""
    model = wildcard_model(wildcards)
    return in_process_threads(model) if model.in_process else 1


def threads_of(model_of):
    """A rule's `threads` for a job that runs the model ``model_of(wildcards)`` in-process."""
    return lambda wildcards: in_process_threads(model_of(wildcards))


def gpu_slot_of(model_of):
    """A rule's `gpu` resource for a job that runs the model ``model_of(wildcards)``."""
    return lambda wildcards: gpu_slot(model_of(wildcards))


def run_entry(wildcards):
    """The config entry of the training run in the job's wildcards."""
    return config["training"]["runs"][wildcards.run]


def run_steps(wildcards):
    """The checkpoints of the job's run that validation plays."""
    return evaluated_steps(config, wildcards.run)


def run_base_entry(wildcards):
    """The models entry of the run's base model."""
    return run_base_model(wildcards).entry


def run_base_model(wildcards):
    """The run's base model, as the class of its kind."""
    return MODEL_SPECS[run_entry(wildcards)["base_model"]]


def run_gpu_memory_gb(wildcards):
    """GPU memory a job that trains or plays the run's checkpoints needs: its base model's."""
    return run_base_model(wildcards).served_gpu_memory_gb


def run_weights(wildcards):
    """The prepared weights folder of the run's base model."""
    return f"resources/models/{run_entry(wildcards)['base_model']}"


def trainer_env(wildcards):
    """The conda env of a training job: ART's GPU backend for trainer art, else the project's."""
    return ART_ENV if run_entry(wildcards)["trainer"] == "art" else PROJECT_ENV


def checkpoint_env(wildcards):
    """The conda env of a job that plays a run's checkpoints: vLLM's when the run's base model
    is served (the server loads the adapter), the project's for an in-process base."""
    return VLLM_ENV if run_base_model(wildcards).is_served else PROJECT_ENV


def pilot_entry(wildcards):
    """The pilot section; a config without one fails the pilot target, naming the key."""
    return pilot_section(config)


def pilot_candidates(wildcards):
    """How many candidate updates the pilot trains."""
    return len(PilotConfig.from_dict(pilot_section(config)).updates())


def pilot_recipe_run(wildcards):
    """The run whose recipe the pilot trains (its arm's first seed's)."""
    return pilot_recipe(config)


def pilot_recipe_entry(wildcards):
    """The config entry of that run."""
    return config["training"]["runs"][pilot_recipe(config)]


def pilot_base_model(wildcards):
    """The pilot's base model, as the class of its kind."""
    return MODEL_SPECS[pilot_recipe_entry(wildcards)["base_model"]]


def pilot_weights(wildcards):
    """The prepared weights folder of the pilot's base model."""
    return f"resources/models/{pilot_recipe_entry(wildcards)['base_model']}"


def training_targets():
    """Every run's checkpoints and history."""
    return expand(
        ["results/train/{run}/checkpoints", "results/train/{run}/history.parquet"], run=RUNS
    )




def selected_episodes(wildcards):
    """Episodes per cell of a selected checkpoint: its base model's."""
    return cell_episodes(config, run_entry(wildcards)["base_model"])


def test_targets(names=SELECTED):
    """Every test table of the selected checkpoints ``names``: <run>@<policy> x sizes."""
    return [f"results/test/{name}/n{size}.parquet" for name in names for size in SIZES]


def arm_histories(wildcards):
    """The training histories of an arm's runs, in the arm's seed order."""
    return [f"results/train/{run}/history.parquet" for run in ARMS[wildcards.arm]]


def selection_targets():
    """Every run's selection."""
    return expand("results/eval/{run}/selection.json", run=RUNS)


def model_targets():
    """Every prepared model's weights."""
    return expand("resources/models/{model}", model=PREPARED_MODELS)


def episode_targets():
    """Every episode table of the grid: models x sizes."""
    return expand("results/episodes/{model}/n{size}.parquet", model=MODELS, size=SIZES)


def analysis_tables():
    """The episode tables the coordination statistics read: every model x N cell of the grid,
    the compared selected checkpoints' (models named <run>@<policy>) included."""
    return episode_targets() + test_targets(COMPARED)


def metric_targets():
    """The headline numbers for `dvc metrics`: a JSON file per model of analysis_tables(),
    the grid's models and the compared selected checkpoints. Files, not the folder as a
    directory output, into which Snakemake would write a .snakemake_timestamp that DVC shows
    as a row."""
    return [f"{METRICS}/{name}.json" for name in [*MODELS, *COMPARED]]


def control_tables(wildcards):
    """The episode tables of the control check: each seed's selected checkpoint at the check's
    N, and the model's cell it is compared with."""
    n, policy = CONTROL["n"], CONTROL["policy"]
    return [
        *(f"results/test/{run}@{policy}/n{n}.parquet" for run in ARMS[CONTROL["run"]]),
        f"results/episodes/{CONTROL['model']}/n{n}.parquet",
    ]


def control_histories(wildcards):
    """The control arm's training histories, in seed order: each checkpoint's exact expected
    control reward, and the untrained model's, that the check judges."""
    return [f"results/train/{run}/history.parquet" for run in ARMS[CONTROL["run"]]]


def control_targets():
    """The control check's table, where the study has a positive control."""
    return [CONTROL_TABLE] if CONTROL else []


def provenance_of(kind):
    """A params function: the provenance identity of the job's output of ``kind``.

    Its digest covers exactly the config sections the output depends on; the job writes it
    into its record, and the report compares it with the current config's.
    """

    def identity(wildcards):
        if kind == "episodes":
            name = wildcards.model
        elif kind == "test":
            name = f"{wildcards.run}@{wildcards.policy}"
        else:
            name = wildcards.run
        return output_identity(config, kind, name)

    return identity


def provenance_records():
    """The records of every output the report is made of."""
    return [
        *expand("results/episodes/{model}/n{size}.provenance.json", model=MODELS, size=SIZES),
        *expand("results/train/{run}/provenance.json", run=RUNS),
        *expand("results/eval/{run}/validation.provenance.json", run=RUNS),
        *(f"results/test/{name}/n{size}.provenance.json" for name in SELECTED for size in SIZES),
    ]


def analysis_settings(*keys):
    """The named keys of the analysis section, so a rule's params hold only what it reads."""
    return {key: config["analysis"][key] for key in keys}


def timeline_tables(wildcards):
    """The episode and steps tables of the episode the report draws."""
    timeline = config["analysis"]["timeline"]
    cell = f"results/episodes/{timeline['model']}/n{timeline['n']}"
    return {"episodes": f"{cell}.parquet", "steps": f"{cell}.steps.parquet"}


def report_figures():
    """The PNG of every statistics figure, in the report's order (the timeline apart)."""
    return [f"results/figures/{stem}.png" for stem in figure_catalog(VARIANTS)]


def final_targets():
    """What `all` builds: statistics, monitors, every figure (PNG, PDF, CSV), the report."""
    figures = [
        *report_figures(),
        "results/figures/timeline.png",
        *expand("results/figures/training_{run}.png", run=RUNS),
        *expand("results/figures/arm_{arm}.png", arm=SEEDED_ARMS),
    ]
    return [
        "resources/models/manifest.json",
        "results/train/index.json",
        "results/eval/index.json",
        "results/test/index.json",
        *expand(
            "results/stats/{table}.csv",
            table=[
                "summary",
                "comparisons",
                "seeds",
                "seed_comparisons",
                "power",
                "components",
                "seats",
                "episode_rewards",
                "monitors",
            ],
        ),
        *control_targets(),
        *metric_targets(),
        *(str(Path(png).with_suffix(ext)) for png in figures for ext in (".png", ".pdf", ".csv")),
        REPORT,
        REPORT_PAGE,
    ]
