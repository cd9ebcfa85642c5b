"""Seeds as the unit (coordgap.analysis.seeds), against scipy and splits enumerated by hand."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.power import TTestIndPower

from coordgap.analysis.comparisons import holm, mean_test
from coordgap.analysis.report import seeds_section
from coordgap.analysis.seeds import (
    SEED_COMPARISON_SCHEMA,
    SEED_SCHEMA,
    seed_comparisons,
    seed_table,
    sides,
    write_seed_tables,
)
from coordgap.analysis.stats import read_table
from coordgap.analysis.two_sample import sign_flip_p
from tests.unit.analysis_tables import CONFIG, episode, frame

pytestmark = pytest.mark.unit

# Deadlocks among 6 episodes of each seed's test cell (paper reward 0 for a deadlock, 1 else).
DEADLOCKS = {"paper": (4, 2, 3), "shaped": (1, 0, 2)}
BASE_DEADLOCKS = 5
ARMS = {arm: [f"{arm}-s{seed}" for seed in (1, 2, 3)] for arm in DEADLOCKS}
POLICIES = ("last",)
# The pooled episodes' detectable effect: analysis.power's alpha and power.
DETECT = {"alpha": 0.05, "power": 0.8}


def _cell(model: str, deadlocks: int, n: int = 5) -> list[dict]:
    return [episode(model, n, i, deadlock=i < deadlocks) for i in range(6)]


@pytest.fixture(scope="module")
def episodes() -> pl.DataFrame:
    rows = _cell("base", BASE_DEADLOCKS)
    for arm, runs in ARMS.items():
        for run, deadlocks in zip(runs, DEADLOCKS[arm], strict=True):
            rows += _cell(f"{run}@last", deadlocks)
    return frame(rows)


def _seed_means(arm: str) -> np.ndarray:
    return np.array([1 - d / 6 for d in DEADLOCKS[arm]])


def test_each_arm_shows_its_seeds_their_mean_and_the_t_interval_over_seeds(episodes) -> None:
    table = seed_table(episodes, ARMS, POLICIES, CONFIG).filter(pl.col("variant") == "paper")
    row = table.filter(pl.col("arm") == "paper").row(0, named=True)
    means = _seed_means("paper")
    assert (row["policy"], row["n"], row["seeds"], row["episodes"]) == ("last", 5, 3, 18)
    assert row["seed_means"] == ", ".join(f"{m:.3f}" for m in means)
    assert row["mean"] == pytest.approx(means.mean())
    assert row["sd"] == pytest.approx(means.std(ddof=1))
    low, high = scipy_stats.t.interval(0.95, 2, loc=means.mean(), scale=scipy_stats.sem(means))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high))
    assert row["pooled_mean"] == pytest.approx(means.mean())  # equal cells: the same mean


def test_arms_compare_seed_by_seed_with_welch_and_every_split_of_the_seeds(episodes) -> None:
    compared = seed_comparisons(
        episodes, [("shaped@last", "paper@last")], sides(ARMS, POLICIES), CONFIG, **DETECT
    )
    row = compared.filter(pl.col("variant") == "paper").row(0, named=True)
    x, y = _seed_means("shaped"), _seed_means("paper")
    welch = scipy_stats.ttest_ind(x, y, equal_var=False)
    assert row["test"] == "welch_seeds"
    assert (row["seeds_a"], row["seeds_b"]) == (3, 3)
    assert row["diff"] == pytest.approx(x.mean() - y.mean())
    assert (row["t"], row["dof"], row["p"]) == pytest.approx(
        (welch.statistic, welch.df, welch.pvalue)
    )
    low, high = welch.confidence_interval(0.95)
    assert (row["diff_ci_low"], row["diff_ci_high"]) == pytest.approx((low, high))
    # Every split of the six seed means into two arms of three, by hand.
    pooled = np.concatenate([x, y])
    observed = abs(x.mean() - y.mean())
    extreme = [
        abs(pooled[list(a)].mean() - np.delete(pooled, list(a)).mean()) >= observed - 1e-12
        for a in itertools.combinations(range(6), 3)
    ]
    assert row["permutation_p"] == pytest.approx(np.mean(extreme))
    assert row["min_p"] == pytest.approx(0.1)
    assert "cannot go below p = 0.1" in row["note"]
    # Beside it, the pooled episodes as analysis.comparisons would test them.
    x_episodes = np.repeat([0.0, 1.0], [3, 15])
    y_episodes = np.repeat([0.0, 1.0], [9, 9])
    pooled_test = mean_test(x_episodes, y_episodes, ("a", "b"), CONFIG.seed)
    assert (row["pooled_test"], row["pooled_p"]) == (pooled_test.test, pooled_test.p)
    # The smallest effect 18 vs 18 episodes detect, as statsmodels solves it, and in reward
    # units over the SD Hedges' g pools (equal sizes: the root of the mean variance).
    g = TTestIndPower().solve_power(nobs1=18, ratio=1.0, **DETECT)
    assert row["pooled_detectable_g"] == pytest.approx(g, rel=1e-4)
    pooled_sd = np.sqrt((x_episodes.var(ddof=1) + y_episodes.var(ddof=1)) / 2)
    assert row["pooled_detectable_diff"] == pytest.approx(g * pooled_sd, rel=1e-4)


def test_an_arm_against_a_model_tests_each_seeds_difference_from_its_fixed_mean(
    episodes,
) -> None:
    compared = seed_comparisons(
        episodes,
        [("shaped@last", "base"), ("paper@last", "base")],
        sides(ARMS, POLICIES),
        CONFIG,
        **DETECT,
    ).filter(pl.col("variant") == "paper")
    rows = compared.to_dicts()
    for row, arm in zip(rows, ("shaped", "paper"), strict=True):
        differences = _seed_means(arm) - (1 - BASE_DEADLOCKS / 6)
        test = scipy_stats.ttest_1samp(differences, 0.0)
        assert (row["test"], row["seeds_b"]) == ("one_sample_seeds", None)
        assert (row["t"], row["p"]) == pytest.approx((test.statistic, test.pvalue))
        low, high = test.confidence_interval(0.95)
        assert (row["diff_ci_low"], row["diff_ci_high"]) == pytest.approx((low, high))
        assert row["min_p"] == pytest.approx(0.25)
    # Holm over the pairs at this N and variant: the study's primary family.
    assert [r["p_holm"] for r in rows] == pytest.approx(holm([r["p"] for r in rows]))


def test_sign_flips_enumerate_every_pattern() -> None:
    differences = np.array([0.5, 0.2, -0.1, 0.4])
    observed = abs(differences.mean())
    means = [abs(np.mean(differences * signs)) for signs in itertools.product((1, -1), repeat=4)]
    assert sign_flip_p(differences) == pytest.approx(np.mean(np.array(means) >= observed - 1e-12))
    # All positive: only it and its mirror are as extreme, 2 of 16.
    assert sign_flip_p(np.array([0.1, 0.2, 0.3, 0.4])) == pytest.approx(2 / 16)


def test_one_seed_gets_no_t_test_and_says_why(episodes) -> None:
    single = {"paper": ["paper-s1"]}
    row = seed_comparisons(
        episodes, [("paper@last", "base")], sides(single, POLICIES), CONFIG, **DETECT
    ).row(0, named=True)
    assert np.isnan(row["p"])
    assert np.isnan(row["p_holm"])
    assert row["note"].startswith("no t test: one seed")
    table = seed_table(episodes, single, POLICIES, CONFIG).row(0, named=True)
    assert table["seeds"] == 1
    assert np.isnan(table["ci_low"])
    assert np.isnan(table["sd"])


def test_the_written_tables_keep_their_schemas(episodes, tmp_path) -> None:
    paths = []
    for (model,), cell in episodes.partition_by("model", as_dict=True).items():
        path = tmp_path / model / "n5.parquet"
        path.parent.mkdir()
        cell.write_parquet(path)
        paths.append(path)
    out_seeds, out_pairs = tmp_path / "seeds.csv", tmp_path / "pairs.csv"
    pairs = [("shaped@last", "paper@last")]
    write_seed_tables(paths, ARMS, POLICIES, pairs, CONFIG, out_seeds, out_pairs, **DETECT)
    assert read_table(out_seeds, SEED_SCHEMA).height == 2 * len(CONFIG.variants)
    assert read_table(out_pairs, SEED_COMPARISON_SCHEMA).height == len(CONFIG.variants)


def test_the_report_shows_seeds_only_where_an_arm_has_several(episodes) -> None:
    pairs = [("shaped@last", "paper@last"), ("shaped@last", "base")]
    seeds = seed_table(episodes, ARMS, POLICIES, CONFIG)
    compared = seed_comparisons(episodes, pairs, sides(ARMS, POLICIES), CONFIG, **DETECT)
    section = seeds_section(seeds, compared)
    assert section.startswith("## Seeds")
    assert "| `shaped@last` | `paper` | 5 | 3 | 0.833, 1.000, 0.667 |" in section
    assert "| shaped@last vs paper@last | 3 vs 3 |" in section
    assert "| shaped@last vs base | 3 vs model |" in section
    assert "(min 0.100)" in section
    single = {"paper": ["paper-s1"]}
    one_seed = seed_table(episodes, single, POLICIES, CONFIG)
    assert seeds_section(one_seed, compared.clear()) is None
