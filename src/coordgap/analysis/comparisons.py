"""Pairwise comparisons of models, and the power of such comparisons.

Per family of comparisons, reward variant, pair and N (:func:`compare`):

* the mean difference with its interval (Newcombe's when both samples are binary, the
  bootstrap's otherwise: ``coordgap.intervals.difference_interval``);
* the test to read, in ``test`` and ``p``: Welch's t-test where its normal approximation holds,
  the studentized permutation test (the permutation test of Welch's t,
  ``coordgap.analysis.two_sample``) where it does not, i.e. when a sample has fewer than
  ``SMALL_CELL`` episodes or is constant; both p-values are kept (``welch_p``,
  ``permutation_p``) and ``note`` says why Welch is not the one to read. Studentizing keeps the
  permutation test valid when the two SDs differ, as they do between models;
* Hedges' g (pooled SD), the primary effect size, with its normal-approximation interval; beside
  it the SD ratio and the average-variance g with Bonett's interval, the one to read when the
  SDs differ by more than ``SD_RATIO_LIMIT``. With both samples constant the three are
  undefined (empty, and the note says so), whatever the means;
* the smallest |g| the comparison could detect (``detectable_g``), in place of achieved power;
* the probability of superiority with the Brunner-Munzel permutation test, in place of
  Mann-Whitney U, which tests stochastic order under equal shapes rather than what it reports;
* the deadlock-rate difference with Newcombe's interval.

Holm's correction runs within each family and variant, over ``p`` and over ``bm_p``. Undefined
statistics are NaN in memory, with a ``note`` saying why, and empty in the written table.

The power table answers the design question beside the paper's: how many episodes per cell a
two-sample t-test needs to detect the configured effect, and what the paper's and our cell sizes
can detect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pingouin as pg
import polars as pl
import yaml

from coordgap.analysis.stats import (
    OK,
    SMALL_CELL,
    load_episodes,
    read_columns,
    with_rewards,
    write_csv,
)
from coordgap.analysis.two_sample import (
    average_sd_g,
    brunner_munzel,
    detectable_effect,
    hedges_g,
    is_constant,
    sd_ratio,
    studentized_permutation_p,
    welch,
)
from coordgap.intervals import difference_interval, newcombe_interval

if TYPE_CHECKING:
    from collections.abc import Sequence

    from coordgap.config.analysis import ComparisonConfig, PowerConfig
    from coordgap.env.variants import RewardVariant

COMPARISON_SCHEMA: dict[str, pl.DataType] = {
    "family": pl.String(),
    "variant": pl.String(),
    "model_a": pl.String(),
    "model_b": pl.String(),
    "n": pl.Int64(),
    "episodes_a": pl.Int64(),
    "episodes_b": pl.Int64(),
    "mean_a": pl.Float64(),
    "mean_b": pl.Float64(),
    "diff": pl.Float64(),
    "diff_ci_low": pl.Float64(),
    "diff_ci_high": pl.Float64(),
    "test": pl.String(),
    "p": pl.Float64(),
    "p_holm": pl.Float64(),
    "t": pl.Float64(),
    "dof": pl.Float64(),
    "welch_p": pl.Float64(),
    "permutation_p": pl.Float64(),
    "hedges_g": pl.Float64(),
    "hedges_g_ci_low": pl.Float64(),
    "hedges_g_ci_high": pl.Float64(),
    "sd_ratio": pl.Float64(),
    "g_av": pl.Float64(),
    "g_av_ci_low": pl.Float64(),
    "g_av_ci_high": pl.Float64(),
    "detectable_g": pl.Float64(),
    "superiority": pl.Float64(),
    "bm_p": pl.Float64(),
    "bm_p_holm": pl.Float64(),
    "deadlock_rate_a": pl.Float64(),
    "deadlock_rate_b": pl.Float64(),
    "deadlock_diff": pl.Float64(),
    "deadlock_diff_ci_low": pl.Float64(),
    "deadlock_diff_ci_high": pl.Float64(),
    "note": pl.String(),
}

POWER_SCHEMA: dict[str, pl.DataType] = {
    "design": pl.String(),
    "episodes_per_cell": pl.Int64(),
    "cells": pl.Int64(),
    "effect_size": pl.Float64(),
    "alpha": pl.Float64(),
    "power_at_effect": pl.Float64(),
    "target_power": pl.Float64(),
    "detectable_effect": pl.Float64(),
}


def comparison_families(config: ComparisonConfig) -> dict[str, tuple[tuple[str, str], ...]]:
    """Group the comparisons into families; Holm's correction runs within each (and variant).

    The pairs of ``analysis.comparisons`` are one family. Each question checkpoint selection
    asks of the same episodes (each selected checkpoint against its base model, each against
    the run's last checkpoint) is a family of its own, so that its tests do not dilute these.

    Args:
        config: The comparisons' configuration.

    Returns:
        Family name -> its (model a, model b) pairs, in config order.
    """
    return {"configured": config.comparisons, **config.checkpoints}


# Above this ratio of the two SDs the pooled SD mostly measures the larger sample: read g_av.
SD_RATIO_LIMIT = 2.0

_TESTS = (
    "test",
    "p",
    "t",
    "dof",
    "welch_p",
    "permutation_p",
    "hedges_g",
    "hedges_g_ci_low",
    "hedges_g_ci_high",
    "sd_ratio",
    "g_av",
    "g_av_ci_low",
    "g_av_ci_high",
    "detectable_g",
    "superiority",
    "bm_p",
)


def _why_not_welch(x: np.ndarray, y: np.ndarray, names: tuple[str, str]) -> list[str]:
    """The reasons Welch's approximation does not hold for these samples (none: read Welch)."""
    reasons = []
    constant = [name for name, sample in zip(names, (x, y), strict=True) if is_constant(sample)]
    if constant:
        reasons.append("zero variance in " + " and ".join(constant))
    if min(x.size, y.size) < SMALL_CELL:
        reasons.append(f"fewer than {SMALL_CELL} episodes in a sample")
    return reasons


@dataclass(frozen=True, slots=True)
class MeanTest:
    """Welch's t-test and the permutation test of Welch's t, and which one to read.

    Attributes:
        t: Welch's t (NaN when both samples are constant).
        dof: Its degrees of freedom.
        welch_p: Its p-value.
        permutation_p: The studentized permutation test's p-value.
        reasons: Why Welch's approximation does not hold (empty: read Welch).
    """

    t: float
    dof: float
    welch_p: float
    permutation_p: float
    reasons: tuple[str, ...]

    @property
    def test(self) -> str:
        """The test to read: ``welch`` or ``studentized_permutation``."""
        return "studentized_permutation" if self.reasons else "welch"

    @property
    def p(self) -> float:
        """The p-value of the test to read."""
        return self.permutation_p if self.reasons else self.welch_p


def mean_test(x: np.ndarray, y: np.ndarray, names: tuple[str, str], seed: int) -> MeanTest:
    """Test the mean difference of two samples of at least two episodes each, both ways.

    Args:
        x: Sample A's rewards.
        y: Sample B's rewards.
        names: The two samples' names, for the reasons.
        seed: Seed of the permutation test's random splits.

    Returns:
        Both tests, and which one to read.
    """
    welch_test = welch(x, y)
    reasons = tuple(_why_not_welch(x, y, names))
    permutation = studentized_permutation_p(x, y, seed)
    return MeanTest(welch_test.t, welch_test.dof, welch_test.p, permutation, reasons)


def two_sample_tests(
    x: np.ndarray, y: np.ndarray, names: tuple[str, str], config: ComparisonConfig
) -> dict[str, Any]:
    """Test and size the difference of two samples of at least two episodes each.

    Args:
        x: Sample A's rewards.
        y: Sample B's rewards.
        names: The two models, for the note.
        config: The comparisons' configuration (confidence, seed, power settings).

    Returns:
        The values of ``_TESTS`` and a ``note``: why Welch is not the test to read, why the
        effect sizes in SDs are undefined, and when the SDs differ by more than
        ``SD_RATIO_LIMIT``.
    """
    seed = config.analysis.seed
    confidence = config.analysis.confidence
    tested = mean_test(x, y, names, seed)
    g, g_low, g_high = hedges_g(x, y, confidence)
    g_av, g_av_low, g_av_high = average_sd_g(x, y, confidence)
    ratio = sd_ratio(x, y)
    superiority, bm_p = brunner_munzel(x, y, seed)
    notes = [f"Welch not read: {'; '.join(tested.reasons)}"] if tested.reasons else []
    if is_constant(x) and is_constant(y):
        notes.append("no g, g_av or SD ratio: both samples constant")
    elif math.isinf(ratio):
        notes.append("one SD is 0: read g_av")
    elif ratio > SD_RATIO_LIMIT:
        notes.append(f"SDs differ {ratio:.1f}x: read g_av")
    return {
        "test": tested.test,
        "p": tested.p,
        "t": tested.t,
        "dof": tested.dof,
        "welch_p": tested.welch_p,
        "permutation_p": tested.permutation_p,
        "hedges_g": g,
        "hedges_g_ci_low": g_low,
        "hedges_g_ci_high": g_high,
        "sd_ratio": ratio,
        "g_av": g_av,
        "g_av_ci_low": g_av_low,
        "g_av_ci_high": g_av_high,
        "detectable_g": detectable_effect(x.size, y.size, config.power.alpha, config.power.power),
        "superiority": superiority,
        "bm_p": bm_p,
        "note": "; ".join(notes) or None,
    }


def _pair(
    a: pl.DataFrame | None,
    b: pl.DataFrame | None,
    names: tuple[str, str],
    variant: RewardVariant,
    config: ComparisonConfig,
) -> dict[str, Any]:
    """Compare the ``ok`` episodes of two models at one N under one variant."""
    column = f"reward_{variant}"
    x = a[column].to_numpy() if a is not None else np.empty(0)
    y = b[column].to_numpy() if b is not None else np.empty(0)
    deadlocks_a = int(a["deadlock"].sum()) if a is not None else 0
    deadlocks_b = int(b["deadlock"].sum()) if b is not None else 0
    mean_a = float(x.mean()) if x.size else math.nan
    mean_b = float(y.mean()) if y.size else math.nan
    rate_a = deadlocks_a / x.size if x.size else math.nan
    rate_b = deadlocks_b / y.size if y.size else math.nan
    row: dict[str, Any] = {
        "episodes_a": x.size,
        "episodes_b": y.size,
        "mean_a": mean_a,
        "mean_b": mean_b,
        "diff": mean_a - mean_b,
        "deadlock_rate_a": rate_a,
        "deadlock_rate_b": rate_b,
        "deadlock_diff": rate_a - rate_b,
    }
    settings = config.analysis
    bounds = newcombe_interval(deadlocks_a, x.size, deadlocks_b, y.size, settings.confidence)
    row["deadlock_diff_ci_low"], row["deadlock_diff_ci_high"] = bounds
    row["diff_ci_low"], row["diff_ci_high"] = difference_interval(
        x, y, settings.confidence, settings.bootstrap_resamples, settings.seed
    )
    missing = [name for name, sample in zip(names, (x, y), strict=True) if sample.size == 0]
    if missing:
        note = "no ok episodes of " + " and ".join(missing)
    elif min(x.size, y.size) < 2:
        note = "fewer than two episodes in a sample"
    else:
        return row | two_sample_tests(x, y, names, config)
    return row | dict.fromkeys(_TESTS, math.nan) | {"test": None, "note": note}


def holm(p_values: Sequence[float]) -> list[float]:
    """Adjust a family of p-values with Holm's step-down correction (pingouin).

    Args:
        p_values: The family; NaN marks a test that could not be run.

    Returns:
        The adjusted p-values in the same order; NaN stays NaN and stays out of the family.
    """
    tested = [i for i, p in enumerate(p_values) if not math.isnan(p)]
    adjusted = [math.nan] * len(p_values)
    if tested:
        values = pg.multicomp([p_values[i] for i in tested], method="holm")[1]
        for i, value in zip(tested, values, strict=True):
            adjusted[i] = float(value)
    return adjusted


def compare(episodes: pl.DataFrame, config: ComparisonConfig) -> pl.DataFrame:
    """Compare each family's model pairs at every N at which both models played.

    Args:
        episodes: Episode rows (``coordgap.data.EPISODE_SCHEMA``).
        config: The comparisons' configuration.

    Returns:
        One row per family, variant, pair and N (in that order; pairs in config order, N
        ascending) with the columns of ``COMPARISON_SCHEMA``. ``diff`` is ``mean_a - mean_b``;
        ``p_holm`` and ``bm_p_holm`` are Holm-adjusted within the family and variant. A pair
        at an N where a model has no ``ok`` episode is kept, with a note saying so.
    """
    rewarded = with_rewards(episodes, config.analysis)
    played = set(rewarded.select("model", "n").unique().iter_rows())
    samples = rewarded.filter(OK).partition_by("model", "n", as_dict=True)
    rows: list[dict[str, Any]] = []
    for family, pairs in comparison_families(config).items():
        for variant in config.analysis.variants:
            group = []
            for a, b in pairs:
                sizes = {n for model, n in played if model == a}
                sizes &= {n for model, n in played if model == b}
                for n in sorted(sizes):
                    key = {"family": family, "variant": str(variant), "model_a": a, "model_b": b}
                    compared = _pair(
                        samples.get((a, n)), samples.get((b, n)), (a, b), variant, config
                    )
                    group.append(key | {"n": n} | compared)
            for p, adjusted in (("p", "p_holm"), ("bm_p", "bm_p_holm")):
                for row, value in zip(group, holm([r[p] for r in group]), strict=True):
                    row[adjusted] = value
            rows.extend(group)
    return pl.DataFrame(rows, schema=COMPARISON_SCHEMA)


def _design(design: str, episodes: int, cells: int | None, settings: PowerConfig) -> dict[str, Any]:
    """Power at the configured effect, and the smallest detectable effect, of one design."""
    power = pg.power_ttest(
        d=settings.effect_size, n=episodes, alpha=settings.alpha, contrast="two-samples"
    )
    detectable = pg.power_ttest(
        n=episodes, power=settings.power, alpha=settings.alpha, contrast="two-samples"
    )
    return {
        "design": design,
        "episodes_per_cell": episodes,
        "cells": cells,
        "effect_size": settings.effect_size,
        "alpha": settings.alpha,
        "power_at_effect": float(power),
        "target_power": settings.power,
        "detectable_effect": float(detectable),
    }


def power_table(summary: pl.DataFrame, paper_episodes: int, settings: PowerConfig) -> pl.DataFrame:
    """Tabulate the a-priori power of two-sample comparisons under three designs.

    ``required`` is the smallest number of episodes per cell that detects the configured
    effect (Hedges' g) at the configured alpha with the configured power; ``paper`` is the
    paper's episodes per cell; ``ours`` is one row per distinct number of ``ok`` episodes among
    our cells. Each row gives the power at the configured effect and the smallest effect
    detectable with the configured power.

    Args:
        summary: The ``model``, ``n`` and ``episodes`` columns of
            :func:`coordgap.analysis.stats.summarize`'s table.
        paper_episodes: The paper's episodes per cell (30).
        settings: The power settings.

    Returns:
        Rows with the columns of ``POWER_SCHEMA``.
    """
    needed = pg.power_ttest(
        d=settings.effect_size, power=settings.power, alpha=settings.alpha, contrast="two-samples"
    )
    rows = [
        _design("required", math.ceil(needed), None, settings),
        _design("paper", paper_episodes, None, settings),
    ]
    # A t-test needs two episodes per sample.
    counts = summary.filter(pl.col("episodes") >= 2)["episodes"].value_counts().sort("episodes")
    rows += [_design("ours", k, cells, settings) for k, cells in counts.iter_rows()]
    return pl.DataFrame(rows, schema=POWER_SCHEMA)


def write_comparisons(
    episode_paths: Sequence[str | Path], config: ComparisonConfig, out_csv: str | Path
) -> None:
    """Compare the configured pairs on the episode tables and write the table (byte-stable).

    Args:
        episode_paths: Parquet episode tables.
        config: The comparisons' configuration.
        out_csv: The comparisons table.
    """
    write_csv(compare(load_episodes(episode_paths), config), out_csv)


def paper_episodes_per_cell(paper_reference_yaml: str | Path) -> int:
    """Read the paper's episodes per model x N cell from ``config/paper_reference.yaml``."""
    paper = yaml.safe_load(Path(paper_reference_yaml).read_text(encoding="utf-8"))
    return int(paper["episodes"]["per_cell"])


def write_power(
    summary_csv: str | Path,
    paper_reference_yaml: str | Path,
    settings: PowerConfig,
    out_csv: str | Path,
) -> None:
    """Tabulate the power of the needed, the paper's and our designs, and write it.

    Args:
        summary_csv: The summary of :func:`coordgap.analysis.stats.write_stats` (its cell sizes).
        paper_reference_yaml: The paper's published design (episodes per cell).
        settings: The power settings.
        out_csv: The power table.
    """
    columns = {"model": pl.String(), "n": pl.Int64(), "episodes": pl.Int64()}
    summary = read_columns(summary_csv, columns)
    paper_episodes = paper_episodes_per_cell(paper_reference_yaml)
    write_csv(power_table(summary, paper_episodes, settings), out_csv)
