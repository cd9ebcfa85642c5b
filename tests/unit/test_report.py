"""The markdown report: its sections, flags, undefined numbers, the paper beside us, its bytes."""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import TYPE_CHECKING, Any

import polars as pl
import pytest
import yaml

from coordgap.analysis.catalog import figure_catalog
from coordgap.analysis.control import write_control
from coordgap.analysis.paper import check_published
from coordgap.analysis.report import ReportInputs, write_report
from coordgap.analysis.stats import summarize
from coordgap.analysis.training import selection_section
from coordgap.env.variants import RewardVariant
from coordgap.provenance import Provenance, config_digest, git_commit
from coordgap.training.history import HISTORY_SCHEMA
from tests.conftest import ROOT, TINY_CONFIG
from tests.unit.analysis_tables import (
    COMPARE,
    CONFIG,
    CONTROL,
    CONTROL_RUNS,
    CONTROL_STEPS,
    PAPER_REFERENCE,
    control_history,
    episode,
    frame,
    reaching,
    table,
    write_tables,
)

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.unit

PROVENANCE = Provenance(
    config_digest="0" * 64, commit="abc123", python="3.11.7", packages={"polars": "2.1.0"}
)


def study_config() -> dict[str, Any]:
    """The tiny workflow config, its models renamed to the fixture's."""
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config["models"] = {
        name: {"kind": "scripted", "policy": policy}
        for name, policy in [
            ("hierarchy", "resource_hierarchy"),
            ("left_first", "left_first"),
            ("silent", "silent"),
            ("idle", "think_only"),
        ]
    }
    config["experiment"] = {**config["experiment"], "sizes": [5, 7], "episodes_per_cell": 6}
    config["analysis"]["comparisons"] = [list(pair) for pair in COMPARE.comparisons]
    config["analysis"]["timeline"] = {"model": "left_first", "n": 5, "episode": 0}
    return config


def make_inputs(folder: Path, paper: dict[str, Any]) -> ReportInputs:
    """Every table of the fixture (with a model whose every episode errored), figure paths."""
    crashed = frame([episode("crashed", 5, i, status="error") for i in range(2)])
    written = write_tables(pl.concat([table(sizes=(5, 7)), crashed]), folder / "stats")
    reference = folder / "paper.yaml"
    reference.write_text(yaml.safe_dump(paper, sort_keys=False), encoding="utf-8")
    figures = folder / "figures"
    return ReportInputs(
        summary=written.stats.summary,
        comparisons=written.comparisons,
        power=written.power,
        monitors=written.monitors,
        paper_reference=reference,
        figures=[figures / f"{stem}.png" for stem in figure_catalog(CONFIG.variants)],
        timeline=figures / "timeline.png",
        tables=[written.stats.components, written.stats.seats],
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ReportInputs, Path]:
    folder = tmp_path_factory.mktemp("report")
    paper = yaml.safe_load(PAPER_REFERENCE.read_text(encoding="utf-8"))
    paper["models"]["silent"] = {"mean_reward_n5": 1.0, "meals_n5": 0}
    paper["models"]["hierarchy"] = {"mean_reward_range": [0.0, 0.1], "deadlock_rate_n5": 0.5}
    paper["comparisons"].append({"name": "hierarchy vs left_first at N=5", "p": 0.5})
    inputs = make_inputs(folder / "inputs", paper)
    out_md = folder / "results" / "report.md"
    out_md.parent.mkdir()
    write_report(inputs, study_config(), PROVENANCE, out_md)
    return out_md.read_text(encoding="utf-8"), inputs, out_md


def section(text: str, heading: str) -> str:
    return text.split(f"## {heading}\n")[1].split("\n## ")[0]


def test_report_has_every_section_in_order(report: tuple[str, ReportInputs, Path]) -> None:
    text, _, _ = report
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    # What the run found comes first; how it was made, last.
    assert headings == [
        "Findings",
        "Rewards",
        "Behaviour",
        "Comparisons",
        "Power",
        "Monitors",
        "Figures",
        "An episode, step by step",
        "Paper vs ours",
        "Method",
        "Setup",
    ]
    # Headings name no model, so anchors survive any model name.
    assert not any(model in line for line in headings for model in ("silent", "hierarchy"))


def test_setup_states_digest_commit_and_versions(report: tuple[str, ReportInputs, Path]) -> None:
    setup = section(report[0], "Setup")
    assert f"`{'0' * 64}`" in setup
    assert "`abc123`" in setup
    assert "| `polars` | 2.1.0 |" in setup
    assert "`hierarchy` (scripted, 6 episodes per N)" in setup


def test_tables_show_every_variant_flags_and_no_nan(report: tuple[str, ReportInputs, Path]) -> None:
    text, _, _ = report
    rewards = section(text, "Rewards")
    # Six rewards of 1.0: a binary outcome, with Wilson's interval rather than a point.
    assert "| silent | 5 | 6 | 0 | 1.000 [0.610, 1.000] | 0.000 | degenerate, no_call |" in rewards
    assert (
        "| silent | 5 | 6 | 0 | -0.100 [-0.100, -0.100] | 0.000 | degenerate, no_call |" in rewards
    )
    # A cell with error episodes is marked, beside its Errors count.
    assert "| crashed | 5 | 0 | 2 | n/a | n/a | errors |" in rewards
    assert "nan" not in text.lower()
    assert "r = 1.0 r_nd + 0.5 r_thru - 0.3 r_fair - 0.1 r_idle" in section(text, "Method")
    comparisons = section(text, "Comparisons")
    assert "### Family `configured`, `paper` reward" in comparisons
    assert "### Family `configured`, `shaped` reward" in comparisons
    assert "Welch not read: zero variance in silent and idle" in comparisons
    # Two constants, 1.0 and 0.9: p = 2 / 924 to two significant digits, and no g.
    constant = next(line for line in comparisons.splitlines() if line.startswith("| silent |"))
    assert "| studentized_permutation | 0.0022 |" in constant
    assert "| n/a | n/a |" in constant  # Hedges' g and g_av
    assert "no g, g_av or SD ratio: both samples constant" in constant
    power = section(text, "Power")
    assert "needs 64 episodes per cell to detect g = 0.5 with power 0.8" in power
    assert "| the paper | 30 |  | 0.48 | 0.74 |" in power


def test_monitors_are_flagged_beside_their_model(report: tuple[str, ReportInputs, Path]) -> None:
    monitors = section(report[0], "Monitors")
    assert (
        "| silent | 5 | 6 | 1.00 | 0.00 | 1.00 | 0.00 | 0.00 | **degenerate**, **no_call** |"
        in monitors
    )
    assert "- **no_call**: silent (N=5, 7)" in monitors
    assert "- **all_think**: idle (N=5, 7)" in monitors
    assert "- **starvation**: left_first (N=5, 7)" in monitors
    assert "flagged at 0.5 or more" in monitors


def test_figures_are_linked_with_their_data(report: tuple[str, ReportInputs, Path]) -> None:
    figures = section(report[0], "Figures")
    assert "![Mean paper reward by model and N](../inputs/figures/reward_paper.png)" in figures
    assert "[reward_vs_meals_shaped.csv](../inputs/figures/reward_vs_meals_shaped.csv)" in figures
    assert "[seats.csv](../inputs/stats/seats.csv)" in figures
    timeline = section(report[0], "An episode, step by step")
    assert "(../inputs/figures/timeline.png)" in timeline
    assert "coordgap show" in timeline


def test_paper_beside_ours_says_whether_ours_lies_in_their_range(
    report: tuple[str, ReportInputs, Path],
) -> None:
    paper = section(report[0], "Paper vs ours")
    assert "| Philosophers N | 5, 10, 15 | 5, 7 | **differs** |" in paper
    assert (
        "| Reward weights (nd, thru, fair, idle) | 1, 0.5, 0.3, 0.1 | 1, 0.5, 0.3, 0.1 | same |"
        in (paper)
    )
    assert "| silent | `mean_reward_n5` | 1 | N=5: 1.000 [0.610, 1.000] | yes |" in paper
    assert "| silent | `meals_n5` | 0 | N=5: 0.000 | yes |" in paper
    assert "| hierarchy | `mean_reward_range` | [0, 0.1] | N=5:" in paper
    assert re.search(r"\| hierarchy \| `mean_reward_range` \|.*\| \*\*no\*\* \|", paper)
    assert "| qwen3-14b | `mean_reward_n5` | 0.128 | no model of ours by this name | n/a |" in paper
    assert "| hierarchy vs left_first at N=5 | p: 0.5 | N=5: diff " in paper
    assert "N=7: diff" not in paper
    assert "Comparable on this config: the rows of `hierarchy`, `silent`." in paper


def test_paper_beside_ours_says_when_no_row_is_comparable(tmp_path: Path) -> None:
    paper = yaml.safe_load(PAPER_REFERENCE.read_text(encoding="utf-8"))
    out_md = tmp_path / "report.md"
    write_report(make_inputs(tmp_path / "inputs", paper), study_config(), PROVENANCE, out_md)
    paper_section = section(out_md.read_text(encoding="utf-8"), "Paper vs ours")
    assert "**No row is comparable on this config**" in paper_section
    assert "| qwen3-14b | `mean_reward_n5` | 0.128 | no model of ours by this name | n/a |" in (
        paper_section
    )


def test_published_checks_by_quantity() -> None:
    summary = summarize(table(sizes=(5, 7)), CONFIG)
    paper = {
        "models": {
            "silent": {"mean_reward": 1.0, "names": ["x"], "deadlock_rate_n5": [0.0, 0.2]},
            "idle": {"mean_reward_range": [0.85, 0.95], "mean_reward_n7": 0.5},
        }
    }
    checks = {
        (c.paper_model, c.quantity): c for c in check_published(paper, summary, CONFIG.variants)
    }
    assert set(checks) == {
        ("silent", "mean_reward"),
        ("silent", "deadlock_rate_n5"),
        ("idle", "mean_reward_range"),
        ("idle", "mean_reward_n7"),
    }
    assert [e.n for e in checks["silent", "mean_reward"].ours] == [5, 7]
    assert checks["silent", "mean_reward"].within is True
    assert checks["silent", "deadlock_rate_n5"].within is True
    assert checks["idle", "mean_reward_range"].within is True  # 0.9 at both sizes
    assert checks["idle", "mean_reward_n7"].within is False
    shaped_only = check_published(paper, summary, (RewardVariant.SHAPED,))
    assert next(c for c in shaped_only if c.quantity == "mean_reward").within is False


def test_report_regenerates_byte_identically(
    report: tuple[str, ReportInputs, Path], tmp_path: Path
) -> None:
    text, inputs, out_md = report
    again = out_md.with_name("again.md")
    write_report(inputs, study_config(), PROVENANCE, again)
    assert again.read_bytes() == out_md.read_bytes()
    assert text == again.read_text(encoding="utf-8")


@pytest.mark.parametrize(("seed_3", "verdict"), [(0.30, "moved"), (0.28, "did not move")])
def test_the_control_check_opens_the_findings_and_has_its_own_section(
    report: tuple[str, ReportInputs, Path], tmp_path: Path, seed_3: float, verdict: str
) -> None:
    # The untrained model's exact E[r1] is 0.2; seeds 1 and 2 gain 0.16 and 0.12, seed 3
    # exactly the threshold (0.10) or 0.08. In the test episodes 2 of 5 seats reach right in
    # round 1, against the base model's 1.
    rows = reaching("base", [1, 1, 1])
    histories = []
    for run, last in zip(CONTROL_RUNS, (0.36, 0.32, seed_3), strict=True):
        rows += reaching(f"{run}@last", [2, 2], step=CONTROL_STEPS)
        histories.append(tmp_path / f"{run}.parquet")
        control_history(last).write_parquet(histories[-1])
    episodes = tmp_path / "control.parquet"
    frame(rows).write_parquet(episodes)
    control = tmp_path / "results" / "stats" / "control.csv"
    control.parent.mkdir(parents=True)
    write_control([episodes], histories, CONTROL_RUNS, CONTROL, control)
    _, inputs, _ = report
    out_md = tmp_path / "results" / "report.md"
    write_report(dataclasses.replace(inputs, control=control), study_config(), PROVENANCE, out_md)
    text = out_md.read_text(encoding="utf-8")

    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert headings[:3] == ["Findings", "Positive control", "Rewards"]
    findings = section(text, "Findings")
    first = next(line for line in findings.splitlines() if line.startswith("- "))
    assert first.startswith(f"- **Positive control.** The positive control {verdict}: at N=5")
    check = section(text, "Positive control")
    assert "r = round1_right / N" in check
    assert "Data: [control.csv](stats/control.csv)." in check
    passed = "yes" if seed_3 == 0.30 else "**no**"
    assert "| Test episodes | Test share | Model's test share (3 episodes) |" in check
    seed_1 = "| `control-s1@last` | 5 | 3 | 0.360 | 0.200 | 0.160 | yes | 2 | 0.400 | 0.200 |"
    assert seed_1 in check
    assert f"| `control-s3@last` | 5 | 3 | {seed_3:.3f} | 0.200 |" in check
    mean, gain = (0.36 + 0.32 + seed_3) / 3, seed_3 - 0.2
    assert check.rstrip().endswith(
        f"| `control@last` (all seeds) | 5 | n/a | {mean:.3f} | 0.200 | {gain:.3f} | {passed} "
        "| 6 | 0.400 | 0.200 |"
    )
    # The control reward is no variant of the coordination tables.
    assert "`control` reward" not in section(text, "Rewards")
    assert "control" not in section(text, "Comparisons")


def test_provenance_digest_is_canonical_and_commit_is_read(tmp_path: Path) -> None:
    config = study_config()
    reordered = dict(reversed(list(copy.deepcopy(config).items())))
    assert config_digest(config) == config_digest(reordered)
    changed = copy.deepcopy(config)
    changed["reward"]["weights"]["idle"] = 0.2
    assert config_digest(changed) != config_digest(config)
    assert git_commit(tmp_path) is None
    commit = git_commit(ROOT)
    assert commit is None or re.match(r"^[0-9a-f]{40}( \+ uncommitted changes)?$", commit)
    collected = Provenance.collect(config, tmp_path)
    assert collected.packages["pingouin"] != "not installed"
    assert next(iter(collected.packages)) == "coordgap"


def test_the_selection_section_names_step_0_the_untrained_adapter() -> None:
    def estimate(step: int, mean: float) -> dict[str, Any]:
        return {"step": step, "mean": mean, "ci_low": mean - 0.1, "ci_high": mean + 0.1}

    selection = {
        "run": "tiny-grpo",
        "choices": {
            "last": {"step": 2, "estimate": estimate(2, 0.5), "runner_up": None},
            "best_val": {"step": 0, "estimate": estimate(0, 0.6), "runner_up": estimate(2, 0.5)},
        },
    }
    history = pl.DataFrame(
        [
            {"step": step, "episodes": 6, "meals_mean": 0.0, "both_forks_mean": 0.5}
            | {"groups": 2, "groups_trainable": 0}
            for step in range(2)
        ],
        schema=HISTORY_SCHEMA,
    )
    section = selection_section([selection], ["figures/training_tiny-grpo.png"], [history])
    assert "| last | 2 | 0.500 [0.400, 0.600] (step 2) | — |" in section
    assert (
        "Training signal: 0 of 4 groups trainable; 0 meals and 6 rounds ready to eat in 12 "
        "rollout episodes (no training signal: every group's rewards were equal, nothing was "
        "learnt)." in section
    )
    assert "| best_val | 0 (the untrained adapter) | 0.600 [0.500, 0.700] (step 0) |" in section
