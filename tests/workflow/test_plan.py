"""`coordgap plan`: the cost of a study before it runs, beside what its run then used."""

from __future__ import annotations

import math

import polars as pl
import pytest
import yaml

from tests.conftest import ROOT, copy_workflow, plan_lines, run

pytestmark = pytest.mark.workflow

PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())


def _sum(lines: dict, rule: str, field: str) -> float:
    return sum(figures[field] for (r, _), figures in lines.items() if r == rule)


def test_the_paper_plan_prices_every_rule(tmp_path):
    project = copy_workflow(tmp_path / "project")
    lines = plan_lines(project, "--configfile", "config/paper.yaml")
    plan, prices = PAPER["plan"], PAPER["plan"]["prices"]
    # 30 episodes x (5 + 10 + 15) seats x 5 rounds, every episode assumed to last.
    cell_decisions = 30 * 30 * 5
    tokens = (plan["tokens_in_per_decision"], plan["tokens_out_per_decision"])
    for model, price in prices.items():
        figures = lines["generate_api_episodes", model]
        assert figures["decisions"] == cell_decisions
        expected = cell_decisions * (tokens[0] * price["input"] + tokens[1] * price["output"]) / 1e6
        assert math.isclose(figures["usd"], expected), model
        assert figures["gpu_hours"] == 0
    # Served cells pay GPU time per decision and one server start per job; no dollars.
    served = cell_decisions * plan["gpu_seconds_per_decision"] + 3 * plan["server_start_s"]
    for model in ("mistral-small-24b", "qwen3-14b", "qwen3-8b", "deepseek-r1-distill-qwen-7b"):
        figures = lines["generate_served_episodes", model]
        assert (figures["usd"], figures["jobs"]) == (0, 3)
        assert math.isclose(figures["gpu_hours"], served / 3600), model
    # Training: 16 steps of 2 x 3 episodes at N = 5; ART's server starts once.
    trained = 16 * plan["gpu_seconds_per_training_step"] + plan["server_start_s"]
    for run_name in PAPER["training"]["runs"]:
        figures = lines["train_grpo", run_name]
        assert (figures["episodes"], figures["decisions"]) == (96, 96 * 5 * 5)
        assert math.isclose(figures["gpu_hours"], trained / 3600)
        # Validation: 17 checkpoints x 10 episodes in one job, paying one server start.
        validation = lines["evaluate_checkpoints", run_name]
        assert (validation["jobs"], validation["episodes"]) == (1, 170)
        validated = 170 * 5 * 5 * plan["gpu_seconds_per_decision"] + plan["server_start_s"]
        assert math.isclose(validation["gpu_hours"], validated / 3600)
        assert lines["test_checkpoint", f"{run_name}@last"]["episodes"] == 90
    # The grid's 900 test episodes, and only API models cost dollars.
    grid = ("generate_episodes", "generate_api_episodes", "generate_served_episodes",
            "test_checkpoint")  # fmt: skip
    assert sum(_sum(lines, rule, "episodes") for rule in grid) == 630 + 270
    paid = _sum(lines, "generate_api_episodes", "usd")
    assert math.isclose(sum(figures["usd"] for figures in lines.values()), paid)

    shown = run(project, "coordgap", "plan", "--configfile", "config/paper.yaml").stdout
    assert "Fill in before running: models.claude-opus-4.7.model, models.gpt-5.4.model" in shown
    assert "API keys to export: ANTHROPIC_API_KEY, OPENAI_API_KEY, GOOGLE_API_KEY, XAI_API_KEY" in (
        shown
    )


def test_an_invalid_config_is_not_planned(tmp_path):
    config = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    config["plan"]["prices"]["qwen3-14b"] = {"input": 1.0, "output": 1.0}
    project = copy_workflow(tmp_path / "project")
    (project / "bad.yaml").write_text(yaml.safe_dump(config))
    result = run(project, "coordgap", "plan", "--configfile", "bad.yaml", check=False)
    assert result.returncode == 1
    assert "config key 'plan.prices.qwen3-14b'" in result.stderr


@pytest.mark.slow
def test_the_tiny_plan_is_within_2x_of_what_its_run_used(tiny_workflow, finished_tiny):
    # Planned before any run, then compared with the tiny design's finished run (tiny_study).
    estimate = plan_lines(tiny_workflow)
    # What the run used, read from its episode tables (scripted policies: no tokens, no GPU).
    used = pl.concat(
        pl.read_parquet(path)
        for path in (finished_tiny / "results" / "episodes").glob("*/n*.parquet")
        if path.name.count(".") == 1
    )
    planned = _sum(estimate, "generate_episodes", "decisions")
    assert 0.5 <= planned / used["decisions"].sum() <= 2, (planned, used["decisions"].sum())
    assert _sum(estimate, "generate_episodes", "episodes") == used.height
    assert _sum(estimate, "generate_episodes", "usd") == 0

    # Planned again, the measured rates make the estimate what the run used, shown beside it.
    again = plan_lines(finished_tiny)
    assert _sum(again, "generate_episodes", "decisions") == used["decisions"].sum()
    shown = run(finished_tiny, "coordgap", "plan").stdout
    assert "measured (8 episodes)" in shown
    assert shown.count("  so far ") == 3
