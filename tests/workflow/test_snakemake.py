"""The Snakemake workflow: dry run, lint, a real tiny run, and config validation."""

from __future__ import annotations

import copy
import re

import polars as pl
import pytest
import yaml

from coordgap.config.training import evaluated_steps
from tests.browser import page_facts
from tests.conftest import (
    ANALYSIS_JOBS,
    ROOT,
    RUN_OUTPUT,
    copy_workflow,
    planned,
    run,
    tiny_training_config,
)

pytestmark = pytest.mark.workflow


def test_default_config_dry_run_plans_every_cell(tmp_path):
    project = copy_workflow(tmp_path / "project")
    result = run(project, "snakemake", "-n", "--cores", "1", "all")
    # 6 models (5 scripted, 1 local) x 3 sizes, the local model's weights and their manifest,
    # then statistics, monitors, per-variant figures (2 variants), the others, and the report.
    assert planned(result.stdout) == {
        "generate_episodes": 18,
        "prepare_model": 1,
        "write_model_manifest": 1,
        **ANALYSIS_JOBS,
        "train_grpo": 1,
        # Checkpoints 0, 2 and 3 validated in one job; last and best_val each tested at 3 sizes.
        "evaluate_checkpoints": 1,
        "select_checkpoint": 2,
        "summarize_selection": 1,
        "test_checkpoint": 6,
        "plot_training": 1,
    }, result.stdout


@pytest.mark.parametrize(
    ("steps", "every", "policies", "sizes", "evaluations", "tests"),
    [
        (2, 1, ["last", "best_val"], [3], 3, 2),
        (4, 2, ["last", "best_val", "lcb_val"], [3, 4], 3, 6),
        (5, 2, ["best_train"], [3], 4, 1),  # 0, 2, 4 and the last, 5
    ],
)
def test_training_dry_run_plans_one_validation_job_of_the_evaluated_checkpoints_and_the_tests(
    tmp_path, steps, every, policies, sizes, evaluations, tests
):
    config = tiny_training_config(tmp_path / "weights")
    config["training"]["runs"]["tiny-grpo"]["steps"] = steps
    config["evaluation"].update(every=every, policies=policies)
    config["experiment"]["sizes"] = sizes
    project = copy_workflow(tmp_path / "project", config)
    result = run(project, "snakemake", "-n", "--cores", "1", "all")
    counts = planned(result.stdout)
    assert counts["train_grpo"] == 1
    assert counts["evaluate_checkpoints"] == 1
    assert counts["select_checkpoint"] == len(policies)
    assert counts["summarize_selection"] == 1
    assert counts["test_checkpoint"] == tests
    # The checkpoints the job plays (its params.steps).
    assert len(evaluated_steps(config, "tiny-grpo")) == evaluations


def test_lint_is_clean():
    result = run(ROOT, "snakemake", "--lint", check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_tiny_config_runs_end_to_end(finished_tiny, tiny_config):
    # The tiny design's `snakemake --cores 2 all`, run once for the session (tiny_study).
    first = (finished_tiny / RUN_OUTPUT[0]).read_text()
    # The run ends by pointing at the report, which opens with what it found.
    assert first.rstrip().endswith("Read results/report.md first: it opens with the findings.")
    results = finished_tiny / "results"
    summary = pl.read_csv(results / "stats" / "summary.csv")
    assert summary.height == len(tiny_config["models"]) * len(tiny_config["experiment"]["sizes"])
    assert set(summary["model"]) == set(tiny_config["models"])
    silent = summary.filter(pl.col("model") == "silent")
    assert silent["reward_paper_mean"].to_list() == [1.0, 1.0]
    left_first = summary.filter(pl.col("model") == "left_first")
    assert left_first["deadlock_rate"].to_list() == [1.0, 1.0]
    monitors = pl.read_csv(results / "stats" / "monitors.csv")
    assert monitors.filter(pl.col("model") == "silent")["degenerate"].all()
    report = (results / "report.md").read_text()
    assert report.index("## Findings") < report.index("## Rewards") < report.index("## Setup")
    # The same report as one page, read by a real browser: every figure inline and decoded,
    # every table, the findings first.
    page = page_facts(results / "report.html")
    assert page["images"] == report.count("![") > 5
    assert page["decoded"] == page["images"]
    assert page["tables"] == len(re.findall(r"^\| --- \|", report, flags=re.MULTILINE)) > 5
    assert page["headings"][0] == "Findings"
    assert page["headings"][-1] == "Setup"
    for section in ("## Monitors", "## An episode, step by step", "## Paper vs ours"):
        assert section in report
    assert "](figures/reward_paper.png)" in report
    for stem in ("reward_paper", "deadlock", "reward_vs_meals_shaped", "components_paper"):
        for ext in ("png", "pdf", "csv"):
            assert (results / "figures" / f"{stem}.{ext}").stat().st_size > 0, (stem, ext)
    # The configured episode (left_first, N=3, episode 0) deadlocks in round 1.
    timeline = pl.read_csv(results / "figures" / "timeline.csv")
    assert timeline.filter(pl.col("deadlock"))["round"].unique().to_list() == [1]
    for rule in ("generate_episodes", "compute_stats", "compute_monitors", "plot_timeline"):
        assert list((finished_tiny / "logs" / rule).rglob("*.benchmark.tsv")), rule
    # A second run finds nothing to do.
    again = run(finished_tiny, "snakemake", "--cores", "2", "all")
    assert "Nothing to be done" in again.stdout + again.stderr

    # The HTML supplement builds, with a caption for every figure and table, and rebuilds to
    # the same bytes.
    run(finished_tiny, "snakemake", "--report", "report.html")
    html = (finished_tiny / "report.html").read_bytes()
    run(finished_tiny, "snakemake", "--report", "again.html")
    assert (finished_tiny / "again.html").read_bytes() == html
    # The statistics figures' captions come from their catalog entries (coordgap.analysis.catalog).
    captions = ("Newcombe", "Wilson", "starvation", "replaying the recorded decisions")
    for caption in (*captions, "the degenerate maximum: the score of not playing"):
        assert caption.encode() in html, caption

    # Incremental: each change reruns what depends on it, and never the episodes.
    config_path = finished_tiny / "config" / "config.yaml"
    figures = {"plot_reward", "plot_deadlock", "plot_reward_vs_meals", "plot_components"}
    figures |= {"plot_meals_by_seat"}
    changes = {
        "analysis.monitors.starvation_share": (0.9, {"compute_monitors", "write_report"}),
        "analysis.timeline.episode": (1, {"plot_timeline", "write_report"}),
        "analysis.comparisons": ([["silent", "left_first"]], {"compare_models", "write_report"}),
        "analysis.power.effect_size": (
            0.3,
            {"compare_models", "compute_power", "write_report"},
        ),
        "reward.weights.idle": (
            0.2,
            {
                "compute_stats",
                "compare_models",
                "compare_seeds",
                "compute_power",
                "compute_monitors",
            }
            | figures
            | {"write_report"},
        ),
    }
    for dotted, (value, rules) in changes.items():
        config_path.write_text(yaml.safe_dump(_set(tiny_config, dotted, value), sort_keys=False))
        dry_run = run(finished_tiny, "snakemake", "-n", "--cores", "1", "all")
        assert set(planned(dry_run.stdout)) - {"all"} == rules, (dotted, dry_run.stdout)
    config_path.write_text(yaml.safe_dump(tiny_config, sort_keys=False))

    # Code: a job reruns when code it imports changes in meaning (coordgap.code), and only then.
    src = finished_tiny / "src" / "coordgap"
    originals = {path: path.read_text() for path in src.rglob("*.py")}
    for path, text in originals.items():
        reworded = f'""" Reworded.{text[3:]}' if text.startswith('"""') else text
        path.write_text(reworded + "\n# A new comment.\n")
    dry_run = run(finished_tiny, "snakemake", "-n", "--cores", "1", "all")
    assert "Nothing to be done" in dry_run.stdout + dry_run.stderr, dry_run.stdout
    code_changes = {
        # A variant's formula: every analysis job, no episode.
        "env/variants.py": (
            ('"thru": pl.col("r_thru"),', '"thru": 0.5 * pl.col("r_thru"),'),
            changes["reward.weights.idle"][1] | {"plot_timeline"},
        ),
        # A figure's caption: its catalog is code every plot job and the report execute.
        "analysis/catalog.py": (
            ("The share of episodes that deadlocked", "The share of all episodes that deadlocked"),
            figures | {"write_report"},
        ),
        # The table's step semantics: every episode, and all that follows from them; not the
        # indexes and the model manifest, whose code holds no table.
        "env/table.py": (
            ("return not any(self.eating) and all(", "return all("),
            set(planned(run(finished_tiny, "snakemake", "-n", "-F", "all").stdout))
            - {"all", "index_training", "index_selections", "index_tests", "write_model_manifest"},
        ),
    }
    for module, ((old, new), rules) in code_changes.items():
        path = src / module
        assert old in originals[path], module
        path.write_text(originals[path].replace(old, new, 1))
        dry_run = run(finished_tiny, "snakemake", "-n", "--cores", "1", "all")
        jobs = planned(dry_run.stdout)
        assert set(jobs) - {"all"} == rules, (module, dry_run.stdout)
        path.write_text(originals[path])
    cells = len(tiny_config["models"]) * len(tiny_config["experiment"]["sizes"])
    assert jobs["generate_episodes"] == cells


def _set(config: dict, dotted: str, value) -> dict:
    changed = copy.deepcopy(config)
    *parents, leaf = dotted.split(".")
    node = changed
    for key in parents:
        node = node[key]
    if leaf.isdigit():
        node[int(leaf)] = value
    else:
        node[leaf] = value
    return changed


@pytest.mark.parametrize(
    ("dotted", "value", "named"),
    [
        ("environment.colour", "blue", "colour"),
        ("experiment.sizes.0", 1, "['sizes'][0]"),
        ("reward.weights.idle", "a lot", "['weights']['idle']"),
        ("analysis.comparisons", [["silent", "nobody"]], "analysis.comparisons[0][1]"),
        ("analysis.monitors.no_call_rate", 2, "['monitors']['no_call_rate']"),
        ("analysis.timeline.model", "nobody", "analysis.timeline.model"),
        ("analysis.timeline.episode", 4, "analysis.timeline.episode"),
    ],
)
def test_invalid_config_fails_before_any_job_naming_the_key(
    tmp_path, tiny_config, dotted, value, named
):
    _assert_refused(tmp_path, _set(tiny_config, dotted, value), named)


@pytest.mark.parametrize(
    ("dotted", "value", "named"),
    [
        # Validation episodes 0-1 would play test scenarios 1-2.
        ("scenarios.validation", 1, "'scenarios.test' and 'scenarios.validation'"),
        ("scenarios.train", 499, "'scenarios.train' and 'scenarios.validation'"),
        ("training.runs.tiny-grpo.base_model", "nobody", "training.runs.tiny-grpo.base_model"),
        ("training.runs.tiny-grpo.base_model", "resource_hierarchy", "only local models"),
        (
            "training.runs.tiny-grpo.curriculum",
            [{"from_step": 1, "n": 5}],
            "training.runs.tiny-grpo.curriculum",
        ),
        ("training.runs.tiny-grpo.learning_rate", -1, "['learning_rate']"),
        ("evaluation.policies", ["best_guess"], "['policies'][0]"),
        ("analysis.comparisons", [["tiny-grpo@lcb_val", "llm"]], "analysis.comparisons[0][0]"),
    ],
)
def test_invalid_training_config_fails_before_any_job_naming_the_key(
    tmp_path, dotted, value, named
):
    _assert_refused(tmp_path, _set(tiny_training_config(tmp_path / "w"), dotted, value), named)


def _assert_refused(tmp_path, config: dict, named: str) -> None:
    project = copy_workflow(tmp_path / "project", config)
    result = run(project, "snakemake", "--cores", "1", "all", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert named in output, output
    assert not (project / "results").exists()
    assert "jobid" not in output


@pytest.mark.parametrize(
    ("config_file", "runs", "evaluations", "tests"),
    [
        # paper, shaped and curriculum, one validation job each; 2 policies x 3 sizes.
        ("config/interventions.yaml", 3, 3, 18),
        # The paper's 16 steps, every checkpoint validated in one job.
        ("config/paper_recipe.yaml", 1, 1, 6),
    ],
)
def test_the_intervention_and_recipe_configs_plan_their_runs(
    tmp_path, config_file, runs, evaluations, tests
):
    project = copy_workflow(tmp_path / "project")
    result = run(project, "snakemake", "-n", "all", "--configfile", config_file)
    planned_jobs = planned(result.stdout)
    assert planned_jobs["train_grpo"] == runs
    assert planned_jobs["evaluate_checkpoints"] == evaluations
    assert planned_jobs["test_checkpoint"] == tests
