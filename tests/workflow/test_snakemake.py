"""The Snakemake workflow: dry run, lint, a real tiny run, and config validation."""

from __future__ import annotations

import copy

import polars as pl
import pytest

from tests.conftest import ROOT, copy_workflow, run

pytestmark = pytest.mark.workflow


def test_default_config_dry_run_plans_every_cell(tmp_path):
    project = copy_workflow(tmp_path / "project")
    result = run(project, "snakemake", "-n", "--cores", "1", "all")
    # 6 models (5 scripted, 1 local) x 3 sizes, the local model's weights and their manifest,
    # then statistics, one figure per variant and the report.
    for rule, count in [
        ("generate_episodes", 18),
        ("prepare_model", 1),
        ("write_model_manifest", 1),
        ("compute_stats", 1),
        ("plot_reward", 2),
        ("write_report", 1),
    ]:
        assert any(line.split() == [rule, str(count)] for line in result.stdout.splitlines()), (
            rule,
            result.stdout,
        )


def test_lint_is_clean():
    result = run(ROOT, "snakemake", "--lint", check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_tiny_config_runs_end_to_end(tiny_workflow, tiny_config):
    run(tiny_workflow, "snakemake", "--cores", "2", "all")
    results = tiny_workflow / "results"
    summary = pl.read_csv(results / "stats" / "summary.csv")
    assert summary.height == len(tiny_config["models"]) * len(tiny_config["experiment"]["sizes"])
    assert set(summary["model"]) == set(tiny_config["models"])
    silent = summary.filter(pl.col("model") == "silent")
    assert silent["reward_paper_mean"].to_list() == [1.0, 1.0]
    left_first = summary.filter(pl.col("model") == "left_first")
    assert left_first["deadlock_rate"].to_list() == [1.0, 1.0]
    report = (results / "report.md").read_text()
    assert "resource_hierarchy" in report
    assert "reward_paper.png" in report
    for variant in ("paper", "shaped"):
        assert (results / "figures" / f"reward_{variant}.pdf").stat().st_size > 0
    for rule in ("generate_episodes", "compute_stats", "plot_reward", "write_report"):
        assert list((tiny_workflow / "logs" / rule).rglob("*.benchmark.tsv")), rule
    # A second run finds nothing to do.
    again = run(tiny_workflow, "snakemake", "--cores", "2", "all")
    assert "Nothing to be done" in again.stdout + again.stderr


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
    ],
)
def test_invalid_config_fails_before_any_job_naming_the_key(
    tmp_path, tiny_config, dotted, value, named
):
    project = copy_workflow(tmp_path / "project", _set(tiny_config, dotted, value))
    result = run(project, "snakemake", "--cores", "1", "all", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert named in output, output
    assert not (project / "results").exists()
    assert "jobid" not in output
