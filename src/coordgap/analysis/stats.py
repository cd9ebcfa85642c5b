"""Per-cell summaries with confidence intervals, and pairwise model comparisons.

A cell is one model at one table size N. Only episodes with status ``ok`` enter a statistic;
every other episode is counted in the cell's ``errors`` column, so a transport failure never
looks like a silent, high-reward episode. Rewards are derived here from the stored components
with :func:`coordgap.env.reward.reward_expr`, one column ``reward_<variant>`` per configured
variant.

Intervals (DESIGN.md §7): a bootstrap percentile interval for mean rewards, a Wilson score
interval for the deadlock rate. Comparisons: Welch's t-test and Hedges' g (pingouin), with Holm's
correction across each variant's family of comparisons. Undefined statistics are null in the
summary (a cell without ``ok`` episodes) and NaN with a ``note`` in the comparisons.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np
import pingouin as pg
import polars as pl

from coordgap.env.reward import RewardVariant, reward_expr

if TYPE_CHECKING:
    from collections.abc import Sequence

    from coordgap.config import AnalysisConfig

DECIMALS = 6  # written floats are rounded so that the files are byte-stable across platforms

COMPARISON_SCHEMA: dict[str, pl.DataType] = {
    "variant": pl.String(),
    "model_a": pl.String(),
    "model_b": pl.String(),
    "n": pl.Int64(),
    "mean_a": pl.Float64(),
    "mean_b": pl.Float64(),
    "diff": pl.Float64(),
    "t": pl.Float64(),
    "dof": pl.Float64(),
    "p": pl.Float64(),
    "hedges_g": pl.Float64(),
    "p_holm": pl.Float64(),
    "note": pl.String(),
}

_OK = pl.col("status") == "ok"


def reward_columns(variant: RewardVariant) -> tuple[str, str, str]:
    """Name the summary columns of one variant's mean reward and its interval.

    Args:
        variant: The reward variant.

    Returns:
        The mean, lower-bound and upper-bound column names.
    """
    return f"reward_{variant}_mean", f"reward_{variant}_ci_low", f"reward_{variant}_ci_high"


def summary_schema(variants: Sequence[RewardVariant]) -> dict[str, pl.DataType]:
    """Give the column names and dtypes of :func:`summarize`'s table, in order.

    Args:
        variants: The configured reward variants.

    Returns:
        An ordered mapping from column name to dtype, usable as ``pl.read_csv(schema=...)``.
    """
    schema: dict[str, pl.DataType] = {
        "model": pl.String(),
        "n": pl.Int64(),
        "episodes": pl.Int64(),
        "errors": pl.Int64(),
    }
    for variant in variants:
        schema.update(dict.fromkeys(reward_columns(variant), pl.Float64()))
    rates = ("deadlock_rate", "deadlock_ci_low", "deadlock_ci_high", "meals_mean")
    means = ("throughput", "fairness", "idle", "failed_rate", "no_call_rate")
    schema.update(dict.fromkeys(rates + means, pl.Float64()))
    return schema


def load_episodes(paths: Sequence[str | Path]) -> pl.DataFrame:
    """Read and concatenate episode tables.

    Args:
        paths: Parquet episode tables (DESIGN.md §5), one per model x N.

    Returns:
        All their rows, in the order given.

    Raises:
        ValueError: If no path is given.
    """
    if not paths:
        raise ValueError("load_episodes: no episode tables given")
    return pl.concat([pl.read_parquet(path) for path in paths], how="vertical")


def wilson_interval(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """Compute the Wilson score interval of a binomial proportion.

    Args:
        successes: Number of successes (e.g. deadlocked episodes).
        trials: Number of trials; with none, the interval is undefined.
        confidence: Coverage, e.g. 0.95.

    Returns:
        The lower and upper bounds, or two NaNs when ``trials`` is 0.
    """
    if trials == 0:
        return math.nan, math.nan
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / trials
    z2n = z * z / trials
    centre = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * math.sqrt(p * (1 - p) / trials + z2n / (4 * trials))
    # Clipping only removes rounding error at k = 0 and k = n, where a bound equals 0 or 1.
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_mean_ci(
    values: np.ndarray, confidence: float, resamples: int, seed: int
) -> tuple[float, float, float]:
    """Compute a mean with its bootstrap percentile confidence interval.

    Args:
        values: The sample.
        confidence: Coverage, e.g. 0.95.
        resamples: Number of bootstrap resamples.
        seed: Seed of the local generator; every call starts from it, so a cell's interval does
            not depend on which other cells are summarised.

    Returns:
        The mean and the interval's lower and upper bounds; three NaNs for an empty sample.
    """
    if values.size == 0:
        return math.nan, math.nan, math.nan
    if np.ptp(values) == 0:
        # Every resample is the sample itself; summing it would only add rounding error.
        value = float(values[0])
        return value, value, value
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(resamples, values.size))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(values.mean()), float(low), float(high)


def _with_rewards(episodes: pl.DataFrame, config: AnalysisConfig) -> pl.DataFrame:
    return episodes.with_columns(
        reward_expr(variant, config.weights).alias(f"reward_{variant}")
        for variant in config.variants
    )


def _rate(numerator: str, denominator: str) -> pl.Expr:
    """Build the ratio of two summed columns over ``ok`` episodes; null when nothing to divide."""
    total = pl.col(denominator).filter(_OK).sum()
    return pl.when(total > 0).then(pl.col(numerator).filter(_OK).sum() / total)


def summarize(episodes: pl.DataFrame, config: AnalysisConfig) -> pl.DataFrame:
    """Summarise every model x N cell: rewards with intervals, deadlocks, meals and rates.

    Args:
        episodes: Episode rows (DESIGN.md §5), any number of models and sizes.
        config: The analysis configuration.

    Returns:
        One row per (model, n), sorted by model then n, with the columns of
        :func:`summary_schema`; statistics of a cell without ``ok`` episodes are null.
    """
    cells = (
        _with_rewards(episodes, config)
        .group_by("model", "n")
        .agg(
            _OK.sum().cast(pl.Int64).alias("episodes"),
            (~_OK).sum().cast(pl.Int64).alias("errors"),
            pl.col("deadlock").filter(_OK).sum().alias("deadlocks"),
            pl.col("meals_total").filter(_OK).mean().alias("meals_mean"),
            pl.col("r_thru").filter(_OK).mean().alias("throughput"),
            pl.col("r_fair").filter(_OK).mean().alias("fairness"),
            pl.col("r_idle").filter(_OK).mean().alias("idle"),
            _rate("failed", "decisions").alias("failed_rate"),
            _rate("no_call", "decisions").alias("no_call_rate"),
            *(pl.col(f"reward_{variant}").filter(_OK) for variant in config.variants),
        )
        .sort("model", "n")
    )
    intervals: dict[str, list[float]] = {}
    for variant in config.variants:
        estimates = [
            bootstrap_mean_ci(
                sample.to_numpy(), config.confidence, config.bootstrap_resamples, config.seed
            )
            for sample in cells[f"reward_{variant}"]
        ]
        for name, column in zip(reward_columns(variant), zip(*estimates, strict=True), strict=True):
            intervals[name] = list(column)
    deadlocks = [
        wilson_interval(k, trials, config.confidence)
        for k, trials in zip(cells["deadlocks"], cells["episodes"], strict=True)
    ]
    intervals["deadlock_ci_low"] = [low for low, _ in deadlocks]
    intervals["deadlock_ci_high"] = [high for _, high in deadlocks]
    schema = summary_schema(config.variants)
    return (
        cells.with_columns(
            (pl.col("deadlocks") / pl.col("episodes")).alias("deadlock_rate"),
            *(pl.Series(name, values, dtype=pl.Float64) for name, values in intervals.items()),
        )
        .select(list(schema))
        .with_columns(pl.col(pl.Float64).fill_nan(None))
    )


def _undefined(note: str) -> dict[str, Any]:
    return dict.fromkeys(("t", "dof", "p", "hedges_g"), math.nan) | {"note": note}


def _welch(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Run Welch's t-test and Hedges' g on two samples, or say why they are undefined."""
    if min(x.size, y.size) < 2:
        return _undefined("fewer than two episodes in a sample")
    if np.ptp(x) == 0 and np.ptp(y) == 0:
        return _undefined("zero variance in both samples")
    with warnings.catch_warnings():
        # scipy calls one constant sample a "precision loss"; its variance is exactly zero,
        # which Welch's test handles, so the warning would only be noise.
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        test = pg.ttest(x, y, correction=True).iloc[0]
    return {
        "t": float(test["T"]),
        "dof": float(test["dof"]),
        "p": float(test["p_val"]),
        "hedges_g": float(pg.compute_effsize(x, y, eftype="hedges")),
        "note": None,
    }


def _holm(family: list[dict[str, Any]]) -> None:
    """Fill ``p_holm`` across one family in place; rows with an undefined p stay out of it."""
    tested = [row for row in family if not math.isnan(row["p"])]
    adjusted = pg.multicomp([row["p"] for row in tested], method="holm")[1] if tested else []
    for row in family:
        row["p_holm"] = math.nan
    for row, p_holm in zip(tested, adjusted, strict=True):
        row["p_holm"] = float(p_holm)


def compare(episodes: pl.DataFrame, config: AnalysisConfig) -> pl.DataFrame:
    """Compare the configured model pairs at every N both have ``ok`` episodes for.

    Args:
        episodes: Episode rows (DESIGN.md §5).
        config: The analysis configuration; ``comparisons`` lists the (a, b) pairs.

    Returns:
        One row per variant, pair and N (in config order, then by N) with the columns of
        ``COMPARISON_SCHEMA``; ``diff`` is ``mean_a - mean_b``, and ``p_holm`` is Holm-adjusted
        across the variant's rows.
    """
    samples = _with_rewards(episodes.filter(_OK), config).partition_by("model", "n", as_dict=True)
    rows: list[dict[str, Any]] = []
    for variant in config.variants:
        family = []
        for a, b in config.comparisons:
            sizes_a = {n for model, n in samples if model == a}
            sizes_b = {n for model, n in samples if model == b}
            for n in sorted(sizes_a & sizes_b):
                x = samples[a, n][f"reward_{variant}"].to_numpy()
                y = samples[b, n][f"reward_{variant}"].to_numpy()
                mean_a, mean_b = float(x.mean()), float(y.mean())
                family.append(
                    {
                        "variant": str(variant),
                        "model_a": a,
                        "model_b": b,
                        "n": n,
                        "mean_a": mean_a,
                        "mean_b": mean_b,
                        "diff": mean_a - mean_b,
                        **_welch(x, y),
                    }
                )
        _holm(family)
        rows.extend(family)
    return pl.DataFrame(rows, schema=COMPARISON_SCHEMA)


def metrics(summary: pl.DataFrame, config: AnalysisConfig) -> dict[str, dict[str, Any]]:
    """Extract the headline numbers of a summary as a nested dict for DVC metrics.

    Args:
        summary: The table of :func:`summarize`.
        config: The analysis configuration; its first variant is the headline.

    Returns:
        ``{model: {"n<N>": {"reward_<headline>": mean, "deadlock_rate": rate}}}``, with None
        where a statistic is undefined.
    """
    headline = config.variants[0]
    mean = reward_columns(headline)[0]
    nested: dict[str, dict[str, Any]] = {}
    for row in summary.iter_rows(named=True):
        nested.setdefault(row["model"], {})[f"n{row['n']}"] = {
            f"reward_{headline}": row[mean],
            "deadlock_rate": row["deadlock_rate"],
        }
    return nested


def _rounded(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.col(pl.Float64).round(DECIMALS))


def write_stats(
    episode_paths: Sequence[str | Path],
    config: AnalysisConfig,
    summary_csv: str | Path,
    comparisons_csv: str | Path,
    metrics_json: str | Path,
) -> None:
    """Compute the summary, comparisons and metrics of episode tables and write them.

    Floats are rounded to ``DECIMALS`` places, so the same episodes give the same bytes.

    Args:
        episode_paths: Parquet episode tables.
        config: The analysis configuration.
        summary_csv: Output of :func:`summarize`.
        comparisons_csv: Output of :func:`compare`.
        metrics_json: Output of :func:`metrics` (sorted keys, indent 2).
    """
    episodes = load_episodes(episode_paths)
    summary = _rounded(summarize(episodes, config))
    summary.write_csv(summary_csv)
    _rounded(compare(episodes, config)).write_csv(comparisons_csv)
    text = json.dumps(metrics(summary, config), sort_keys=True, indent=2)
    Path(metrics_json).write_text(text + "\n", encoding="utf-8")
