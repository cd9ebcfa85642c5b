"""Unit tests of coordgap.analysis.stats: summaries, comparisons, breakdowns, edge cases."""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestIndPower
from statsmodels.stats.proportion import proportion_confint

from coordgap.analysis.comparisons import COMPARISON_SCHEMA, compare, two_sample_tests
from coordgap.analysis.control import CONTROL_SCHEMA, write_control
from coordgap.analysis.stats import (
    SEAT_SCHEMA,
    component_table,
    episode_rewards,
    load_episodes,
    read_table,
    seat_table,
    summarize,
    summary_schema,
    write_csv,
    write_stats,
)
from coordgap.env.variants import RewardVariant, reward_expr
from tests.unit.analysis_tables import (
    COMPARE,
    CONFIG,
    CONTROL,
    CONTROL_RUNS,
    CONTROL_STEPS,
    Written,
    control_check,
    control_history,
    episode,
    frame,
    reaching,
    table,
    write_tables,
)

pytestmark = pytest.mark.unit


def rewards(episodes: pl.DataFrame, model: str, variant: RewardVariant) -> np.ndarray:
    """The per-episode rewards of one model, straight from the reward module."""
    selected = episodes.filter(pl.col("model") == model)
    return selected.select(reward_expr(variant, CONFIG.weights))["reward"].to_numpy()


def cell(summary: pl.DataFrame, model: str, n: int = 5) -> dict:
    return summary.filter((pl.col("model") == model) & (pl.col("n") == n)).row(0, named=True)


def test_summary_columns_follow_their_definitions() -> None:
    episodes = table()
    summary = summarize(episodes, CONFIG)
    assert summary.columns == list(summary_schema(CONFIG.variants))
    row = cell(summary, "left_first")
    left_first = episodes.filter(pl.col("model") == "left_first")
    assert row["deadlock_rate"] == pytest.approx(4 / 6)
    low, high = proportion_confint(4, 6, alpha=0.05, method="wilson")
    assert (row["deadlock_ci_low"], row["deadlock_ci_high"]) == pytest.approx((low, high))
    # Three of six episodes eat nothing (meals [i % 2, 0, ...]).
    assert row["zero_meal_rate"] == pytest.approx(3 / 6)
    low, high = proportion_confint(3, 6, alpha=0.05, method="wilson")
    assert (row["zero_meal_ci_low"], row["zero_meal_ci_high"]) == pytest.approx((low, high))
    assert row["meals_mean"] == pytest.approx(left_first["meals_total"].mean())
    assert row["meals_sd"] == pytest.approx(left_first["meals_total"].std())
    assert row["throughput"] == pytest.approx(left_first["r_thru"].mean())
    assert row["failed_rate"] == pytest.approx(
        left_first["failed"].sum() / left_first["decisions"].sum()
    )
    shaped = rewards(episodes, "left_first", RewardVariant.SHAPED)
    assert row["reward_shaped_mean"] == pytest.approx(shaped.mean())
    assert row["reward_shaped_sd"] == pytest.approx(shaped.std(ddof=1))
    assert row["reward_shaped_ci_low"] < row["reward_shaped_mean"] < row["reward_shaped_ci_high"]
    silent = cell(summary, "silent")
    assert silent["no_call_rate"] == 1.0
    assert silent["failed_rate"] == 0.0


def test_tokens_and_latency_per_decision_only_where_recorded() -> None:
    llm = [episode("llm", 5, i, think=10, tokens=(400 + i, 20, 2.5)) for i in range(3)]
    summary = summarize(pl.concat([table(), frame(llm)]), CONFIG)
    row = cell(summary, "llm")
    assert row["tokens_in_per_decision"] == pytest.approx((400 + 401 + 402) / 30)
    assert row["tokens_out_per_decision"] == pytest.approx(2.0)
    assert row["latency_s_per_decision"] == pytest.approx(0.25)
    # Scripted policies record no cost: absent, not free.
    hierarchy = cell(summary, "hierarchy")
    assert hierarchy["tokens_in_per_decision"] is None
    assert hierarchy["latency_s_per_decision"] is None


def test_a_binary_cell_has_wilsons_interval_and_a_constant_one_a_zero_width_one() -> None:
    summary = summarize(table(), CONFIG)
    # Six paper rewards of exactly 1.0 are six successes of a binary outcome: Wilson's interval,
    # not the bootstrap's point [1, 1].
    silent = cell(summary, "silent")
    assert silent["reward_paper_mean"] == 1.0
    assert (silent["reward_paper_ci_low"], silent["reward_paper_ci_high"]) == pytest.approx(
        proportion_confint(6, 6, alpha=0.05, method="wilson")
    )
    assert silent["reward_paper_sd"] == 0.0
    # Six rewards of 0.9 are no proportion: the bootstrap, whose every resample is the sample.
    idle = cell(summary, "idle")
    assert idle["reward_paper_mean"] == idle["reward_paper_ci_low"] == 0.9
    assert idle["reward_paper_ci_high"] == 0.9


def test_one_episode_cell_has_a_mean_but_no_sd_or_interval() -> None:
    episodes = pl.concat([table(), frame([episode("solo", 5, 0, meals=[1, 0, 0, 0, 0])])])
    solo = cell(summarize(episodes, CONFIG), "solo")
    assert solo["episodes"] == 1
    assert solo["reward_paper_mean"] is not None
    for column in ("reward_paper_sd", "reward_paper_ci_low", "reward_paper_ci_high", "meals_sd"):
        assert solo[column] is None, column
    # A rate of one trial still has its (wide) Wilson interval.
    assert (solo["deadlock_ci_low"], solo["deadlock_ci_high"]) == pytest.approx(
        proportion_confint(0, 1, alpha=0.05, method="wilson")
    )


def test_error_rows_are_counted_and_excluded_from_every_statistic() -> None:
    ok = table()
    # Errors that would drag every statistic down if they were mixed in.
    broken = [episode("hierarchy", 5, 10 + i, deadlock=True, status="error") for i in range(3)]
    with_errors = pl.concat([ok, frame(broken)])
    summary = summarize(with_errors, CONFIG)
    hierarchy = cell(summary, "hierarchy")
    assert (hierarchy["episodes"], hierarchy["errors"]) == (6, 3)
    assert summary.drop("errors").equals(summarize(ok, CONFIG).drop("errors"))
    assert compare(with_errors, COMPARE).equals(compare(ok, COMPARE))
    assert component_table(with_errors, CONFIG).equals(component_table(ok, CONFIG))
    assert seat_table(with_errors, CONFIG).equals(seat_table(ok, CONFIG))


def test_a_model_whose_every_episode_errored_is_shown_without_numbers(tmp_path: Path) -> None:
    crashed = [episode("crashed", 5, i, status="error") for i in range(2)]
    episodes = pl.concat([table(), frame(crashed)])
    config = replace(COMPARE, comparisons=(*COMPARE.comparisons, ("crashed", "hierarchy")))
    row = cell(summarize(episodes, CONFIG), "crashed")
    assert (row["episodes"], row["errors"]) == (0, 2)
    numbers = [key for key, dtype in summary_schema(CONFIG.variants).items() if dtype.is_float()]
    assert all(row[key] is None for key in numbers)
    pair = compare(episodes, config).filter(pl.col("model_a") == "crashed").row(0, named=True)
    assert pair["note"] == "no ok episodes of crashed"
    assert (pair["episodes_a"], pair["episodes_b"]) == (0, 6)
    assert math.isnan(pair["p"])
    assert math.isnan(pair["p_holm"])
    # Nothing undefined reaches a file as a number.
    written = write_tables(episodes, tmp_path / "stats", config)
    for path in (written.stats.summary, written.comparisons, written.stats.components):
        assert "nan" not in path.read_text().lower(), path
        # A penalty on a zero mean is written 0.0, never -0.0.
        assert ",-0.0," not in path.read_text(), path


def test_a_six_episode_pair_reads_the_studentized_permutation_test_beside_welch() -> None:
    episodes = table()
    x = rewards(episodes, "hierarchy", RewardVariant.PAPER)
    y = rewards(episodes, "left_first", RewardVariant.PAPER)
    row = compare(episodes, COMPARE).row(0, named=True)
    assert (row["family"], row["variant"], row["model_a"], row["model_b"], row["n"]) == (
        "configured",
        "paper",
        "hierarchy",
        "left_first",
        5,
    )
    welch = scipy_stats.ttest_ind(x, y, equal_var=False)
    assert (row["t"], row["welch_p"]) == pytest.approx((welch.statistic, welch.pvalue))
    # Six episodes per sample: Welch's normal approximation is not the one to read.
    assert row["test"] == "studentized_permutation"
    assert row["p"] == row["permutation_p"]
    assert row["note"] == (
        "Welch not read: fewer than 10 episodes in a sample; SDs differ 16.7x: read g_av"
    )
    assert row["diff"] == pytest.approx(x.mean() - y.mean())
    assert row["diff_ci_low"] < row["diff"] < row["diff_ci_high"]
    assert row["hedges_g_ci_low"] < row["hedges_g"] < row["hedges_g_ci_high"]
    assert row["g_av_ci_low"] < row["g_av"] < row["g_av_ci_high"]
    assert row["sd_ratio"] == pytest.approx(y.std(ddof=1) / x.std(ddof=1))
    pairs = x[:, None] - y[None, :]
    assert row["superiority"] == pytest.approx((pairs > 0).mean() + (pairs == 0).mean() / 2)
    # The smallest |g| a 6 vs 6 comparison detects with power 0.8 at alpha 0.05.
    assert row["detectable_g"] == pytest.approx(1.7955, abs=1e-4)


def test_a_pair_of_large_varied_samples_reads_welch() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.normal(0.6, 0.2, 30), rng.normal(0.5, 0.25, 40)
    names = ("a", "b")
    row = two_sample_tests(x, y, names, COMPARE)
    assert (row["test"], row["note"]) == ("welch", None)
    assert (
        row["p"]
        == row["welch_p"]
        == pytest.approx(scipy_stats.ttest_ind(x, y, equal_var=False).pvalue)
    )
    assert row["detectable_g"] == pytest.approx(
        TTestIndPower().solve_power(nobs1=30, ratio=40 / 30, alpha=0.05, power=0.8)
    )


def test_deadlock_difference_carries_newcombes_interval() -> None:
    row = compare(table(), COMPARE).row(0, named=True)  # hierarchy (0 of 6) - left_first (4 of 6)
    assert (row["deadlock_rate_a"], row["deadlock_rate_b"]) == (0.0, pytest.approx(4 / 6))
    assert row["deadlock_diff"] == pytest.approx(-4 / 6)
    assert row["deadlock_diff_ci_low"] < row["deadlock_diff"] < row["deadlock_diff_ci_high"]


def test_holm_adjusts_each_family_and_variant_and_never_lowers_p() -> None:
    comparisons = compare(table(sizes=(5, 7)), COMPARE)
    for variant in CONFIG.variants:
        family = comparisons.filter((pl.col("variant") == variant) & pl.col("p").is_not_nan())
        assert family.height == 6  # three pairs at two sizes; the constant pair by permutation
        assert (family["p_holm"] >= family["p"]).all()
        expected = multipletests(family["p"].to_numpy(), method="holm")[1]
        assert family["p_holm"].to_numpy() == pytest.approx(expected)
        ranks = comparisons.filter((pl.col("variant") == variant) & pl.col("bm_p").is_not_nan())
        expected = multipletests(ranks["bm_p"].to_numpy(), method="holm")[1]
        assert ranks["bm_p_holm"].to_numpy() == pytest.approx(expected)


def test_zero_variance_and_one_episode_pairs_say_why_and_raise_no_warning() -> None:
    episodes = pl.concat([table(), frame([episode("solo", 5, 0)])])
    config = replace(COMPARE, comparisons=(*COMPARE.comparisons, ("solo", "idle")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comparisons = compare(episodes, config)
    constant = comparisons.filter(pl.col("model_a") == "silent").row(0, named=True)
    assert constant["note"] == (
        "Welch not read: zero variance in silent and idle; fewer than 10 episodes in a sample; "
        "no g, g_av or SD ratio: both samples constant"
    )
    for key in ("t", "dof", "welch_p", "hedges_g", "hedges_g_ci_low", "g_av", "sd_ratio"):
        assert math.isnan(constant[key]), key
    # 1.0 against 0.9, every time: of the 924 splits of the 12 episodes, only this one and its
    # mirror are as extreme, for the means and for the ranks.
    assert constant["test"] == "studentized_permutation"
    assert constant["p"] == pytest.approx(2 / 924)
    assert (constant["superiority"], constant["bm_p"]) == (1.0, pytest.approx(2 / 924))
    assert constant["diff"] == pytest.approx(0.1)
    assert (constant["diff_ci_low"], constant["diff_ci_high"]) == pytest.approx((0.1, 0.1))
    solo = comparisons.filter(pl.col("model_a") == "solo").row(0, named=True)
    assert solo["note"] == "fewer than two episodes in a sample"
    assert solo["test"] is None
    assert math.isnan(solo["p"])
    assert math.isnan(solo["bm_p"])


def test_rewards_equal_but_for_rounding_noise_tie_in_every_statistic() -> None:
    # Weighted sums 0.9541666666666667 and 0.9541666666666666 of one reward, 0.95416 repeating.
    episodes = frame(
        [episode("a", 5, i, meals=[0, 0, 0, 1, 1], think=1) for i in range(6)]
        + [episode("b", 5, i, meals=[0, 0, 0, 1, 2], think=5) for i in range(6)]
    )
    config = replace(COMPARE, comparisons=(("a", "b"),))
    for row in compare(episodes, config).iter_rows(named=True):
        assert (row["mean_a"], row["diff"]) == (row["mean_b"], 0.0)
        # Ranks tie: without rounding every pair would be A > B, and bm_p 2 / 924.
        assert (row["superiority"], row["bm_p"], row["p"]) == (0.5, 1.0, 1.0)
        assert math.isnan(row["hedges_g"])
        assert row["note"].endswith("no g, g_av or SD ratio: both samples constant")


def test_comparison_families_are_a_hook_of_the_config() -> None:
    config = replace(COMPARE, comparisons=(("hierarchy", "left_first"),))
    comparisons = compare(table(), config)
    assert set(comparisons["family"]) == {"configured"}
    assert comparisons.height == len(CONFIG.variants)


def test_components_sum_to_the_mean_reward_under_every_variant() -> None:
    episodes = table(sizes=(5, 7))
    components = component_table(episodes, CONFIG)
    summary = summarize(episodes, CONFIG)
    assert components.height == summary.height * len(CONFIG.variants) * 4
    for variant in CONFIG.variants:
        sums = (
            components.filter(pl.col("variant") == str(variant))
            .group_by("model", "n")
            .agg(pl.col("contribution").sum())
            .join(summary, on=["model", "n"])
        )
        assert sums["contribution"].to_numpy() == pytest.approx(
            sums[f"reward_{variant}_mean"].to_numpy()
        )
    idle = components.filter(
        (pl.col("model") == "idle") & (pl.col("component") == "idle") & (pl.col("n") == 5)
    )
    assert idle["contribution"].to_list() == [pytest.approx(-0.1), pytest.approx(-0.1)]


def test_seat_table_audits_meals_by_seat() -> None:
    seats = seat_table(table(), CONFIG)
    assert seats.columns == list(SEAT_SCHEMA)
    hierarchy = seats.filter(pl.col("model") == "hierarchy").sort("seat")
    # Seat 0 eats 1, 2 or 3 meals (mean 2), every other seat exactly one.
    assert hierarchy["meals_mean"].to_list() == pytest.approx([2.0, 1.0, 1.0, 1.0, 1.0])
    assert hierarchy["meal_share"].sum() == pytest.approx(1.0)
    assert hierarchy["starved_rate"].to_list() == [0.0] * 5
    left_first = seats.filter(pl.col("model") == "left_first").sort("seat")
    # Seat 0 eats in three episodes; the others starve in exactly those three.
    assert left_first["starved_rate"].to_list() == pytest.approx([0.0, 0.5, 0.5, 0.5, 0.5])
    silent = seats.filter(pl.col("model") == "silent")
    assert silent["meal_share"].null_count() == silent.height


def test_episode_rewards_list_every_ok_episode_under_every_variant() -> None:
    episodes = pl.concat([table(), frame([episode("hierarchy", 5, 99, status="error")])])
    listed = episode_rewards(episodes, CONFIG)
    assert listed.height == table().height
    assert listed.filter(pl.col("model") == "silent")["reward_paper"].to_list() == [1.0] * 6
    assert listed.filter(pl.col("model") == "silent")["reward_shaped"].to_list() == [-0.1] * 6


def test_model_names_with_an_at_sign_pass_through(tmp_path: Path) -> None:
    trained = [
        episode("smollm2-grpo@best_val", 5, i, meals=[1, 0, 1, 0, 0], think=i) for i in range(4)
    ]
    config = replace(COMPARE, comparisons=(("smollm2-grpo@best_val", "hierarchy"),))
    written = write_tables(pl.concat([table(), frame(trained)]), tmp_path / "stats", config)
    summary = read_table(written.stats.summary, summary_schema(CONFIG.variants))
    assert "smollm2-grpo@best_val" in summary["model"].to_list()
    comparisons = read_table(written.comparisons, COMPARISON_SCHEMA)
    assert set(comparisons["model_a"]) == {"smollm2-grpo@best_val"}


def test_load_episodes_needs_a_path() -> None:
    with pytest.raises(ValueError, match="no episode tables"):
        load_episodes([])


def _files(written: Written) -> list[Path]:
    """Every file ``write_tables`` wrote, the metrics file of each model included."""
    stats = vars(written.stats)
    tables = [path for name, path in stats.items() if name != "metrics"]
    metrics = [stats["metrics"][model] for model in sorted(stats["metrics"])]
    return [*tables, *metrics, written.comparisons, written.power, written.monitors]


def test_written_tables_are_byte_stable_and_read_back(tmp_path: Path) -> None:
    first = write_tables(table(sizes=(5, 7)), tmp_path / "first")
    second = write_tables(table(sizes=(5, 7)), tmp_path / "second")
    assert [Path(f).read_bytes() for f in _files(first)] == [
        Path(f).read_bytes() for f in _files(second)
    ]
    summary = read_table(first.stats.summary, summary_schema(CONFIG.variants))
    assert summary.select("model", "n").rows() == sorted(summary.select("model", "n").rows())
    assert read_table(first.comparisons, COMPARISON_SCHEMA).height == 2 * 3 * 2
    # One metrics file per model, a row of `dvc metrics show` each, and nothing else.
    metrics = first.stats.metrics
    assert sorted(p.name for p in Path(metrics["silent"]).parent.iterdir()) == [
        f"{model}.json" for model in ("hierarchy", "idle", "left_first", "silent")
    ]
    silent = json.loads(Path(metrics["silent"]).read_text(encoding="utf-8"))
    assert silent["n5"] == {"deadlock_rate": 0.0, "reward_paper": 1.0}
    hierarchy = json.loads(Path(metrics["hierarchy"]).read_text(encoding="utf-8"))
    assert set(hierarchy) == {"n5", "n7"}


def test_a_rerun_leaves_no_stale_file_among_the_metrics(tmp_path: Path) -> None:
    written = write_tables(table(), tmp_path / "tables")
    folder = Path(written.stats.metrics["silent"]).parent
    # What an older run left there: a model since dropped from the config, and the timestamp
    # Snakemake wrote into the folder while it was a directory output.
    for stale in ("dropped.json", ".snakemake_timestamp"):
        (folder / stale).write_text("{}\n", encoding="utf-8")
    write_stats([tmp_path / "tables" / "episodes.parquet"], CONFIG, written.stats)
    assert sorted(p.name for p in folder.iterdir()) == [
        f"{model}.json" for model in ("hierarchy", "idle", "left_first", "silent")
    ]


def test_the_metrics_files_must_be_those_of_the_summary_s_models(tmp_path: Path) -> None:
    written = write_tables(table(), tmp_path / "tables")
    metrics = {**written.stats.metrics, "ghost": tmp_path / "ghost.json"}
    del metrics["idle"]
    summary_models = "['hierarchy', 'idle', 'left_first', 'silent']"
    declared = "['ghost', 'hierarchy', 'left_first', 'silent']"
    with pytest.raises(
        ValueError,
        match=re.escape(f"{summary_models}, but metrics files are declared for {declared}"),
    ):
        write_stats(
            [tmp_path / "tables" / "episodes.parquet"],
            CONFIG,
            replace(written.stats, metrics=metrics),
        )
    assert not (tmp_path / "ghost.json").exists()


def test_write_csv_rounds_and_writes_no_nan_and_no_negative_zero(tmp_path: Path) -> None:
    path = tmp_path / "table.csv"
    values = [-0.0, -1e-9, 0.1234567, None, math.nan]
    write_csv(pl.DataFrame({"x": values, "k": range(5)}), path)
    assert path.read_text().splitlines() == ["x,k", "0.0,0", "0.0,1", "0.123457,2", ",3", ",4"]


def test_the_control_check_passes_only_when_every_seed_gains_the_threshold() -> None:
    # The untrained model's exact E[r1] is 0.2; the seeds' last checkpoints reach 0.36, 0.32
    # and 0.30: gains 0.16, 0.12 and exactly the threshold, 0.10, which passes (0.3 - 0.2 is
    # 0.09999999999999998 in floats).
    passing = control_check([0.36, 0.32, 0.30])
    assert passing.columns == list(CONTROL_SCHEMA)
    seeds = passing.filter(pl.col("level") == "seed")
    assert seeds["name"].to_list() == [f"{run}@last" for run in CONTROL_RUNS]
    assert seeds["step"].to_list() == [3, 3, 3]
    assert seeds["exact"].to_list() == pytest.approx([0.36, 0.32, 0.30])
    assert seeds["model_exact"].to_list() == pytest.approx([0.2] * 3)
    assert seeds["gain"].to_list() == pytest.approx([0.16, 0.12, 0.10])
    assert seeds["passed"].to_list() == [True, True, True]
    # Beside them the test episodes' shares: 2 and 1 of the 5 seats reach right in round 1.
    assert seeds["episodes"].to_list() == [2, 2, 2]
    assert seeds["share"].to_list() == pytest.approx([0.4] * 3)
    arm = passing.filter(pl.col("level") == "arm").row(0, named=True)
    assert (arm["name"], arm["n"], arm["step"], arm["episodes"]) == ("control@last", 5, None, 6)
    assert (arm["model"], arm["model_episodes"], arm["min_gain"]) == ("base", 3, 0.10)
    assert arm["model_share"] == pytest.approx(0.2)
    assert arm["exact"] == pytest.approx((0.36 + 0.32 + 0.30) / 3)
    assert arm["model_exact"] == pytest.approx(0.2)
    assert arm["gain"] == pytest.approx(0.10)  # the smallest seed's: it decides the verdict
    assert arm["passed"]

    # One seed short of the threshold fails the arm, however far the others moved and
    # whatever its test episodes' share (every seat of both reached right): the check reads
    # the exact value, not the noisy estimate.
    short = control_check([0.9, 0.28, 0.30], tests=[[2, 2], [5, 5], [2, 2]])
    assert short["passed"].to_list() == [True, False, True, False]
    assert short.filter(pl.col("level") == "arm")["gain"].item() == pytest.approx(0.08)
    # A seed whose run measured nothing fails, and so does one without a test episode to say
    # which checkpoint it chose; one whose test episodes all ended in an error still has both.
    unmeasured = control_check([0.36, 0.36, None])
    assert unmeasured["passed"].to_list() == [True, True, False, False]
    assert unmeasured["exact"].to_list()[2:] == [None, None]
    untested = control_check([0.36, 0.36, 0.36], tests=[[2], [2], None])
    assert untested["passed"].to_list() == [True, True, False, False]
    assert untested["step"].to_list() == [3, 3, None, None]
    assert untested["episodes"].to_list() == [1, 1, 0, 2]
    errored = control_check([0.36, 0.36, 0.36], tests=[[2], [2], []])
    assert errored["passed"].to_list() == [True, True, True, True]
    assert errored["share"].to_list()[2:] == [None, None]


@pytest.mark.parametrize(("step", "exact"), [(0, 0.2), (1, 0.21), (2, 0.22), (3, 0.36)])
def test_the_control_check_reads_the_history_row_that_made_the_checkpoint(step, exact) -> None:
    # Checkpoint k is what the update of step k - 1 made; checkpoint 0 is the untrained adapter,
    # which acts as the base model (control_history: 0.21, 0.22, then the run's last value).
    checked = control_check([0.36, 0.36, 0.36], step=step)
    assert checked["step"].to_list() == [step] * 3 + [None]
    assert checked["exact"].to_list() == pytest.approx([exact] * 4)


def test_the_control_check_reads_only_its_cells_and_writes_its_table(tmp_path: Path) -> None:
    # Another size and another policy of the same runs are not the check's cells.
    rows = reaching("base", [1, 2]) + reaching("control-s1@best_val", [0], step=1)
    for run in CONTROL_RUNS:
        rows += reaching(f"{run}@last", [3], step=CONTROL_STEPS)
        rows += [row | {"n": 7} for row in reaching(f"{run}@last", [0], step=CONTROL_STEPS)]
    path = tmp_path / "episodes.parquet"
    frame(rows).write_parquet(path)
    histories = []
    for run, last in zip(CONTROL_RUNS, (0.5, 0.6, 0.7), strict=True):
        histories.append(tmp_path / f"{run}.parquet")
        control_history(last).write_parquet(histories[-1])
    out = tmp_path / "control.csv"
    write_control([path], histories, CONTROL_RUNS, CONTROL, out)
    written = read_table(out, CONTROL_SCHEMA)
    assert written["exact"].to_list() == pytest.approx([0.5, 0.6, 0.7, 0.6])
    assert written["gain"].to_list() == pytest.approx([0.3, 0.4, 0.5, 0.3])
    assert written["share"].to_list() == pytest.approx([0.6, 0.6, 0.6, 0.6])
    assert written["model_share"].to_list() == pytest.approx([0.3] * 4)
    assert written["passed"].all()
