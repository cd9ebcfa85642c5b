"""A config file means exactly what it says, and config/paper.yaml plans the paper's study."""

from __future__ import annotations

import collections
import copy

import pytest
import yaml

from coordgap.config.checks import check_cross_keys
from coordgap.config.keys import check_schema, unfilled_keys
from coordgap.config.overlays import resolve, with_model_defaults
from coordgap.config.play import cell_episodes
from tests.conftest import ANALYSIS_JOBS, ROOT, copy_workflow, dry_run_jobs, planned, run

pytestmark = pytest.mark.workflow

DEFAULT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
# The paper's supplementary models (arXiv 2606.07845): 270 episodes beside the main 630.
SUPPLEMENTARY = {"qwen3-8b", "qwen3-8b-grpo@last", "deepseek-r1-distill-qwen-7b"}
# Every job of the paper's study from scratch. The test grid: 4 API models
# (generate_api_episodes) and 4 vLLM-served ones (generate_served_episodes) at 3 sizes, and
# the 2 runs' selected checkpoints (policy last) at 3 sizes (test_checkpoint). Each run
# validates checkpoints 0-16 in one job (evaluate_checkpoints); the 4 vLLM-served models have
# prepared weights (prepare_model).
PAPER_JOBS = {
    "prepare_model": 4,
    "write_model_manifest": 1,
    "generate_api_episodes": 12,
    "generate_served_episodes": 12,
    "train_grpo": 2,
    "evaluate_checkpoints": 2,
    "select_checkpoint": 2,
    "summarize_selection": 2,
    "test_checkpoint": 6,
    **ANALYSIS_JOBS,
    "plot_training": 2,
}
GENERATION_RULES = ("generate_episodes", "generate_api_episodes", "generate_served_episodes")
GRID_RULES = (*GENERATION_RULES, "test_checkpoint")
# The GPU smoke run (config/gpu_smoke.yaml): one served model trained 2 steps, and a scripted
# reference, at N = 5; README's "On a Slurm cluster" states its 28 jobs.
GPU_SMOKE_JOBS = {
    "prepare_model": 1,
    "write_model_manifest": 1,
    "generate_episodes": 1,
    "generate_served_episodes": 1,
    "train_grpo": 1,
    "evaluate_checkpoints": 1,
    "select_checkpoint": 1,
    "summarize_selection": 1,
    "test_checkpoint": 1,
    **ANALYSIS_JOBS,
    "plot_training": 1,
}


def _one_model(name: str) -> dict:
    """The default config cut down to one scripted model, as a new user would write it."""
    config = copy.deepcopy(DEFAULT)
    config["models"] = {name: DEFAULT["models"][name]}
    config["training"]["runs"] = {}
    config["analysis"]["comparisons"] = []
    config["analysis"]["timeline"] = {"model": name, "n": 5, "episode": 0}
    return config


def _episode_models(log: str) -> dict[str, int]:
    """Model -> episode cells of a dry run's generation jobs."""
    return collections.Counter(
        wildcards["model"] for rule, wildcards, _ in dry_run_jobs(log) if rule in GENERATION_RULES
    )


def test_a_configfile_replaces_the_default_instead_of_adding_to_it(tmp_path):
    project = copy_workflow(tmp_path / "project")
    (project / "one.yaml").write_text(yaml.safe_dump(_one_model("random")))
    result = run(project, "snakemake", "-n", "-F", "episodes", "--configfile", "one.yaml")
    assert planned(result.stdout) == {"generate_episodes": 3, "episodes": 1}, result.stdout
    assert _episode_models(result.stdout) == {"random": 3}

    # --config still applies on top, of the given file and of the default alike.
    extra = "models={extra: {kind: scripted, policy: silent}}"
    result = run(
        project, "snakemake", "-n", "-F", "episodes", "--configfile", "one.yaml", "--config", extra
    )
    assert _episode_models(result.stdout) == {"random": 3, "extra": 3}, result.stdout
    result = run(project, "snakemake", "-n", "-F", "episodes", "--config", extra)
    assert _episode_models(result.stdout) == dict.fromkeys([*DEFAULT["models"], "extra"], 3)


def test_a_configfile_is_validated_as_a_whole(tmp_path):
    # The default cut to one model, but still comparing the models it dropped: the final
    # config is checked, and the first stale key is named before any job.
    config = _one_model("random")
    config["analysis"]["comparisons"] = [["random", "left_first"]]
    project = copy_workflow(tmp_path / "project")
    (project / "one.yaml").write_text(yaml.safe_dump(config))
    result = run(project, "snakemake", "-n", "--configfile", "one.yaml", check=False)
    assert result.returncode != 0
    assert "analysis.comparisons[0][1]': unknown model 'left_first'" in result.stdout
    assert "jobid" not in result.stdout


def test_the_paper_config_is_schema_valid_and_shares_no_model_with_the_default():
    check_schema(copy.deepcopy(PAPER))
    check_cross_keys(copy.deepcopy(PAPER))
    assert with_model_defaults(PAPER) == PAPER, "the paper config relies on a schema default"
    assert not set(PAPER["models"]) & set(DEFAULT["models"])
    assert not set(PAPER["training"]["runs"]) & set(DEFAULT["training"]["runs"])
    # What a user must fill in is marked, and nothing else: the API models' names and the
    # commits of the served models' weights.
    api = [name for name, entry in PAPER["models"].items() if entry["api_key_env"]]
    served = [name for name, entry in PAPER["models"].items() if entry["serve"]]
    assert unfilled_keys(PAPER, "") == [f".models.{name}.model" for name in api] + [
        f".models.{name}.serve.source" for name in served
    ]
    assert (len(api), len(served)) == (4, 4)


@pytest.mark.parametrize("profile", [(), ("--workflow-profile", "profiles/slurm")])
def test_the_paper_dry_run_plans_630_plus_270_test_episodes(tmp_path, profile):
    project = copy_workflow(tmp_path / "project")
    result = run(project, "snakemake", "-n", *profile, "--configfile", "config/paper.yaml")
    log = result.stdout + result.stderr
    assert planned(result.stdout) == PAPER_JOBS, log
    assert f"{sum(PAPER_JOBS.values())} jobs" in (ROOT / "README.md").read_text()

    # Test episodes per cell, by model: a checkpoint <run>@<policy> plays its base's count.
    episodes: collections.Counter[str] = collections.Counter()
    for rule, wildcards, _ in dry_run_jobs(log):
        if rule == "test_checkpoint":
            model = f"{wildcards['run']}@{wildcards['policy']}"
            base = PAPER["training"]["runs"][wildcards["run"]]["base_model"]
        elif rule in GRID_RULES:
            model = base = wildcards["model"]
        else:
            continue
        episodes[model] += cell_episodes(PAPER, base)
    assert all(count == 3 * 30 for count in episodes.values()), episodes
    main = sum(count for model, count in episodes.items() if model not in SUPPLEMENTARY)
    assert (main, sum(episodes.values()) - main) == (630, 270)
    assert set(episodes) - SUPPLEMENTARY == {
        "claude-opus-4.7",
        "gpt-5.4",
        "gemini-3.1-pro",
        "grok-4.2",
        "mistral-small-24b",
        "qwen3-14b",
        "qwen3-14b-grpo@last",
    }
    assert not set(episodes) & set(DEFAULT["models"])


def test_the_slurm_profile_sizes_the_paper_gpu_jobs(tmp_path):
    project = copy_workflow(tmp_path / "project")
    result = run(
        project,
        "snakemake",
        "-n",
        "--workflow-profile",
        "profiles/slurm",
        "--configfile",
        "config/paper.yaml",
    )
    by_rule: dict[str, list[dict[str, str]]] = collections.defaultdict(list)
    for rule, _, resources in dry_run_jobs(result.stdout + result.stderr):
        by_rule[rule].append(resources)
    expected = {  # rule: (mem_mb, runtime in minutes), each with one GPU
        "train_grpo": ("128000", "480"),
        "evaluate_checkpoints": ("64000", "240"),
        "test_checkpoint": ("64000", "120"),
        "generate_served_episodes": ("64000", "180"),
    }
    for rule, (mem_mb, runtime) in expected.items():
        for resources in by_rule[rule]:
            assert (resources["mem_mb"], resources["runtime"]) == (mem_mb, runtime), rule
            assert resources["gpu"] == "1", (rule, resources)
    # API cells ask for no GPU, keep the rule's modest preset and take one slot of their
    # provider (the profile caps each provider's).
    assert len(by_rule["generate_api_episodes"]) == 12
    for resources in by_rule["generate_api_episodes"]:
        assert (resources["gpu"], resources["mem_mb"]) == ("0", "4000"), resources
        slots = {key: value for key, value in resources.items() if key.startswith("api_")}
        assert sorted(slots.values()) == ["0", "0", "0", "1"], resources
    # A download, not a conversion in memory.
    assert {r["mem_mb"] for r in by_rule["prepare_model"]} == {"8000"}


def test_the_gpu_smoke_config_plans_the_jobs_the_readme_states(tmp_path):
    smoke = resolve([ROOT / "config" / "gpu_smoke.yaml"]).config  # an overlay on paper.yaml
    check_schema(copy.deepcopy(smoke))
    check_cross_keys(smoke)
    # Only the commit to pin is left to fill in.
    assert unfilled_keys(smoke, "") == [".models.qwen3-0.6b.serve.source"]
    project = copy_workflow(tmp_path / "project")
    result = run(project, "snakemake", "-n", *("--workflow-profile", "profiles/slurm"),
                 "--configfile", "config/gpu_smoke.yaml")  # fmt: skip
    jobs = planned(result.stdout)
    assert jobs == GPU_SMOKE_JOBS, result.stdout
    assert f"{sum(jobs.values())} jobs" in (ROOT / "README.md").read_text()
