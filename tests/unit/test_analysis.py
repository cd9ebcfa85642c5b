"""Unit tests of coordgap.analysis: intervals, tests, summaries, figures and the report."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import yaml
from scipy import stats as scipy_stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from coordgap.analysis.figures import plot_reward_by_model, write_reward_figure
from coordgap.analysis.report import write_report
from coordgap.analysis.stats import (
    bootstrap_mean_ci,
    compare,
    load_episodes,
    summarize,
    wilson_interval,
    write_stats,
)
from coordgap.config import AnalysisConfig
from coordgap.data import CALL_COLUMNS, EPISODE_SCHEMA
from coordgap.env.reward import RewardVariant, RewardWeights, components, reward_expr

pytestmark = pytest.mark.unit

PAPER_REFERENCE = Path(__file__).resolve().parents[2] / "config" / "paper_reference.yaml"
ROUNDS = 5

CONFIG = AnalysisConfig(
    weights=RewardWeights(),
    variants=(RewardVariant.PAPER, RewardVariant.SHAPED),
    confidence=0.95,
    bootstrap_resamples=2000,
    seed=11,
    comparisons=(("hierarchy", "left_first"), ("hierarchy", "silent"), ("silent", "idle")),
)


def episode(
    model: str,
    n: int,
    index: int,
    *,
    meals: list[int] | None = None,
    deadlock: bool = False,
    think: int = 0,
    failed: int = 0,
    no_call: int = 0,
    status: str = "ok",
) -> dict[str, Any]:
    """Make one episode row whose reward components follow from its counts."""
    meals = meals if meals is not None else [0] * n
    eaten = sum(meals)
    actions = think + eaten + failed  # every meal is one successful eat call
    parts = components(
        n=n, rounds=ROUNDS, meals=meals, deadlock=deadlock, actions=actions, think=think
    )
    calls = dict.fromkeys(CALL_COLUMNS, 0)
    calls |= {"calls_eat": eaten, "calls_think": think, "calls_pick_up_left": failed}
    return {
        "model": model,
        "checkpoint": "base",
        "n": n,
        "episode": index,
        "seed": 1000 + index,
        "protocol": "tools6",
        "turn_order": "simultaneous",
        "tie_break": "random",
        "rounds": ROUNDS,
        "rounds_run": 2 if deadlock else ROUNDS,
        "status": status,
        "deadlock": deadlock,
        "deadlock_round": 2 if deadlock else None,
        "deadlocks": int(deadlock),
        "meals_total": eaten,
        "meals_per_philosopher": meals,
        **calls,
        "decisions": actions + no_call,
        "actions": actions,
        "think": think,
        "failed": failed,
        "no_call": no_call,
        "r_nd": parts.r_nd,
        "r_thru": parts.r_thru,
        "r_fair": parts.r_fair,
        "r_idle": parts.r_idle,
        "tokens_in": 100,
        "tokens_out": 10,
        "latency_s": 0.5,
    }


def frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Build an episode table with the contract's dtypes."""
    return pl.DataFrame(rows, schema=EPISODE_SCHEMA)


def table(sizes: tuple[int, ...] = (5,)) -> pl.DataFrame:
    """Four models with distinct behaviour: varied, deadlocking, silent and idle."""
    rows = []
    for n in sizes:
        for i in range(6):
            rows.append(episode("hierarchy", n, i, meals=[1 + i % 3] + [1] * (n - 1), think=i))
            rows.append(
                episode(
                    "left_first",
                    n,
                    i,
                    meals=[i % 2] + [0] * (n - 1),
                    deadlock=i % 3 != 0,
                    failed=i,
                )
            )
            rows.append(episode("silent", n, i, no_call=n * ROUNDS))
            rows.append(episode("idle", n, i, think=n * ROUNDS))
    return frame(rows)


def rewards(episodes: pl.DataFrame, model: str, variant: RewardVariant) -> np.ndarray:
    """The per-episode rewards of one model, straight from the reward module."""
    selected = episodes.filter(pl.col("model") == model)
    return selected.select(reward_expr(variant, CONFIG.weights))["reward"].to_numpy()


@pytest.mark.parametrize(("successes", "trials"), [(0, 10), (10, 10), (3, 10), (1, 1), (17, 30)])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_wilson_interval_matches_statsmodels(
    successes: int, trials: int, confidence: float
) -> None:
    expected = proportion_confint(successes, trials, alpha=1 - confidence, method="wilson")
    assert wilson_interval(successes, trials, confidence) == pytest.approx(expected, abs=1e-12)


def test_wilson_interval_without_trials_is_undefined() -> None:
    assert all(math.isnan(bound) for bound in wilson_interval(0, 0, 0.95))


def test_bootstrap_interval_contains_the_mean_and_is_seeded() -> None:
    values = np.random.default_rng(0).uniform(size=30)
    mean, low, high = bootstrap_mean_ci(values, 0.95, 2000, seed=3)
    assert mean == pytest.approx(values.mean())
    assert low < mean < high
    assert bootstrap_mean_ci(values, 0.95, 2000, seed=3) == (mean, low, high)
    assert bootstrap_mean_ci(values, 0.95, 2000, seed=4) != (mean, low, high)


def test_bootstrap_interval_of_constant_data_has_zero_width_at_the_value() -> None:
    assert bootstrap_mean_ci(np.full(12, 0.1), 0.95, 2000, seed=3) == (0.1, 0.1, 0.1)
    silent = summarize(table(), CONFIG).filter(pl.col("model") == "silent").row(0, named=True)
    assert silent["reward_paper_mean"] == silent["reward_paper_ci_low"] == 1.0
    assert silent["reward_paper_ci_high"] == 1.0


def test_error_rows_are_counted_and_excluded_from_every_statistic() -> None:
    ok = table()
    # Errors that would drag every statistic down if they were mixed in.
    broken = [episode("hierarchy", 5, 10 + i, deadlock=True, status="error") for i in range(3)]
    broken += [episode("crashed", 5, i, status="error") for i in range(2)]
    with_errors = pl.concat([ok, frame(broken)])

    summary = summarize(with_errors, CONFIG)
    expected = summarize(ok, CONFIG)
    hierarchy = pl.col("model") == "hierarchy"
    assert summary.filter(hierarchy)["errors"].item() == 3
    assert summary.filter(hierarchy)["episodes"].item() == 6
    assert (
        summary.filter(pl.col("model") != "crashed").drop("errors").equals(expected.drop("errors"))
    )
    crashed = summary.filter(pl.col("model") == "crashed").row(0, named=True)
    assert (crashed["episodes"], crashed["errors"]) == (0, 2)
    assert crashed["reward_paper_mean"] is None
    assert crashed["deadlock_rate"] is None
    assert compare(with_errors, CONFIG).equals(compare(ok, CONFIG))


def test_summary_columns_follow_their_definitions() -> None:
    episodes = table()
    row = summarize(episodes, CONFIG).filter(pl.col("model") == "left_first").row(0, named=True)
    left_first = episodes.filter(pl.col("model") == "left_first")
    assert row["deadlock_rate"] == pytest.approx(4 / 6)
    low, high = proportion_confint(4, 6, alpha=0.05, method="wilson")
    assert (row["deadlock_ci_low"], row["deadlock_ci_high"]) == pytest.approx((low, high))
    assert row["meals_mean"] == pytest.approx(left_first["meals_total"].mean())
    assert row["throughput"] == pytest.approx(left_first["r_thru"].mean())
    assert row["failed_rate"] == pytest.approx(
        left_first["failed"].sum() / left_first["decisions"].sum()
    )
    assert row["reward_shaped_mean"] == pytest.approx(
        rewards(episodes, "left_first", RewardVariant.SHAPED).mean()
    )
    silent = summarize(episodes, CONFIG).filter(pl.col("model") == "silent").row(0, named=True)
    assert silent["no_call_rate"] == 1.0
    assert silent["failed_rate"] == 0.0


def test_welch_test_and_hedges_g_match_direct_computation() -> None:
    episodes = table()
    x = rewards(episodes, "hierarchy", RewardVariant.PAPER)
    y = rewards(episodes, "left_first", RewardVariant.PAPER)
    row = compare(episodes, CONFIG).row(0, named=True)
    assert (row["variant"], row["model_a"], row["model_b"], row["n"]) == (
        "paper",
        "hierarchy",
        "left_first",
        5,
    )
    welch = scipy_stats.ttest_ind(x, y, equal_var=False)
    assert row["t"] == pytest.approx(welch.statistic)
    assert row["p"] == pytest.approx(welch.pvalue)
    nx, ny = x.size, y.size
    pooled = math.sqrt(((nx - 1) * x.var(ddof=1) + (ny - 1) * y.var(ddof=1)) / (nx + ny - 2))
    hedges = (x.mean() - y.mean()) / pooled * (1 - 3 / (4 * (nx + ny) - 9))
    assert row["hedges_g"] == pytest.approx(hedges)
    assert row["diff"] == pytest.approx(x.mean() - y.mean())


def test_holm_adjusts_each_variant_family_and_never_lowers_p() -> None:
    comparisons = compare(table(sizes=(5, 7)), CONFIG)
    for variant in CONFIG.variants:
        family = comparisons.filter((pl.col("variant") == variant) & pl.col("p").is_not_nan())
        assert family.height == 4  # two testable pairs at two sizes
        assert (family["p_holm"] >= family["p"]).all()
        expected = multipletests(family["p"].to_numpy(), method="holm")[1]
        assert family["p_holm"].to_numpy() == pytest.approx(expected)


def test_zero_variance_pair_is_nan_with_a_note_and_no_warning() -> None:
    episodes = pl.concat([table(), frame([episode("solo", 5, 0)])])
    config = replace(CONFIG, comparisons=(*CONFIG.comparisons, ("solo", "idle")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comparisons = compare(episodes, config)
    constant = comparisons.filter(pl.col("model_a") == "silent").row(0, named=True)
    assert constant["note"] == "zero variance in both samples"
    assert all(math.isnan(constant[key]) for key in ("t", "dof", "p", "hedges_g", "p_holm"))
    solo = comparisons.filter(pl.col("model_a") == "solo").row(0, named=True)
    assert solo["note"] == "fewer than two episodes in a sample"
    tested = comparisons.filter(pl.col("model_a") == "hierarchy")
    assert tested["note"].null_count() == tested.height
    assert not tested["p"].is_nan().any()


def _write_episodes(episodes: pl.DataFrame, folder: Path) -> list[Path]:
    paths = []
    for (model, n), cell in episodes.partition_by("model", "n", as_dict=True).items():
        path = folder / f"{model}-n{n}.parquet"
        cell.write_parquet(path)
        paths.append(path)
    return paths


def _write_stats(episodes: pl.DataFrame, folder: Path) -> tuple[Path, Path, Path]:
    folder.mkdir()
    outputs = (folder / "summary.csv", folder / "comparisons.csv", folder / "metrics.json")
    write_stats(_write_episodes(episodes, folder), CONFIG, *outputs)
    return outputs


def test_load_episodes_needs_a_path() -> None:
    with pytest.raises(ValueError, match="no episode tables"):
        load_episodes([])


def test_write_stats_is_byte_stable(tmp_path: Path) -> None:
    first = _write_stats(table(sizes=(5, 7)), tmp_path / "first")
    second = _write_stats(table(sizes=(5, 7)), tmp_path / "second")
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes()
    summary = pl.read_csv(first[0])
    assert summary.select("model", "n").rows() == sorted(summary.select("model", "n").rows())
    metrics = json.loads(first[2].read_text(encoding="utf-8"))
    assert metrics["silent"]["n5"] == {"deadlock_rate": 0.0, "reward_paper": 1.0}
    assert set(metrics["hierarchy"]) == {"n5", "n7"}


def test_figures_are_written_and_the_pdf_is_deterministic(tmp_path: Path) -> None:
    summary = summarize(table(sizes=(5, 7)), CONFIG)
    pdfs = []
    for name in ("a", "b"):
        png, pdf = tmp_path / f"{name}.png", tmp_path / f"{name}.pdf"
        plot_reward_by_model(summary, RewardVariant.PAPER, png, pdf)
        assert png.stat().st_size > 0
        pdfs.append(pdf.read_bytes())
    assert pdfs[0] == pdfs[1]
    assert b"CreationDate" not in pdfs[0]

    summary.write_csv(tmp_path / "summary.csv")
    write_reward_figure(tmp_path / "summary.csv", "shaped", tmp_path / "c.png", tmp_path / "c.pdf")
    assert (tmp_path / "c.pdf").stat().st_size > 0


def test_report_shows_tables_figure_degenerate_maximum_and_paper(tmp_path: Path) -> None:
    summary_csv, comparisons_csv, _ = _write_stats(table(sizes=(5, 7)), tmp_path / "stats")
    figure = tmp_path / "figures" / "reward.png"
    figure.parent.mkdir()
    paper = yaml.safe_load(PAPER_REFERENCE.read_text(encoding="utf-8"))
    paper["models"]["silent"] = {"mean_reward_n5": 1.0, "meals_n5": 0}
    paper["comparisons"].append({"name": "hierarchy vs left_first at N=5", "p": 0.5})
    reference = tmp_path / "paper.yaml"
    reference.write_text(yaml.safe_dump(paper, sort_keys=False), encoding="utf-8")
    out_md = tmp_path / "report" / "report.md"
    out_md.parent.mkdir()

    write_report(summary_csv, comparisons_csv, figure, reference, CONFIG, out_md)
    text = out_md.read_text(encoding="utf-8")

    assert "| silent | 5 | 6 | 0 | 1.000 [1.000, 1.000] | -0.100 [-0.100, -0.100] |" in text
    assert "| hierarchy | 5 | 6 | 0 |" in text
    assert "zero variance in both samples" in text
    assert "](../figures/reward.png)" in text
    assert "r = 1.0 r_nd + 0.5 r_thru - 0.3 r_fair - 0.1 r_idle" in text
    degenerate = text.split("## The degenerate maximum")[1].split("##")[0]
    assert "**silent** at N=5" in degenerate
    assert "**silent** at N=7" in degenerate
    assert "**hierarchy**" not in degenerate
    assert "by doing nothing" in degenerate
    published = text.split("## Published figures")[1]
    assert "arXiv:2606.07845" in published
    assert "| qwen3-14b | mean_reward_n5: 0.128;" in published
    assert "p: 0.66; hedges_g: -0.11" in published
    assert "| silent | mean_reward_n5: 1.0; meals_n5: 0 | N=5: reward 1.000 [1.000, 1.000]" in (
        published
    )
    assert "| hierarchy vs left_first at N=5 | p: 0.5 | N=5: diff " in published
    assert "N=7: diff" not in published  # the paper's comparison is at N=5 only

    again = tmp_path / "again" / "report.md"
    again.parent.mkdir()
    write_report(summary_csv, comparisons_csv, figure, reference, CONFIG, again)
    assert again.read_text(encoding="utf-8") == text
