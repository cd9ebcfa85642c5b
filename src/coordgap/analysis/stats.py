"""Statistics of episode tables: cell summaries, comparisons, power, and their breakdowns.

A cell is one model at one table size N. Only episodes with status ``ok`` enter a statistic;
every other episode is counted in the cell's ``errors`` column, so a transport failure never
looks like a silent, high-reward episode. Rewards are derived here from the stored components
with :mod:`coordgap.env.reward`, one column ``reward_<variant>`` per configured variant, and
every table that involves a reward has it under every variant: the paper reward's degenerate
maximum stays visible beside the shaped one.

Tables (DESIGN.md §7), all polars, written as CSV by :func:`write_stats`:

* ``summary``: per cell, each variant's mean reward with its bootstrap CI and SD; deadlock and
  zero-meal rates with Wilson CIs; meals, throughput, fairness, idle, failed and no-call rates;
  tokens and latency per decision where the model recorded them.
* ``comparisons``: per family of comparisons, variant, pair and N: Welch's t-test; Hedges' g
  with its CI and the test's achieved power; the mean difference with a bootstrap CI;
  Mann-Whitney U as a robustness check; the deadlock-rate difference with Newcombe's CI. Holm's
  correction runs within each family and variant.
* ``power``: the episodes per cell a two-sample t-test needs for the configured effect, beside
  the paper's design and ours.
* ``components``: each variant's mean reward split into its four signed, weighted terms.
* ``seats``: meals by seat (the tie-break audit).
* ``episode_rewards``: every ok episode's meals and rewards.

Statistics that are undefined are null (NaN never reaches a file), and comparisons say why in
their ``note``.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pingouin as pg
import polars as pl
import yaml

from coordgap.analysis.intervals import (
    bootstrap_difference_ci,
    bootstrap_mean_ci,
    newcombe_interval,
    wilson_interval,
)
from coordgap.env.reward import SIGNS, RewardVariant, component_exprs, reward_expr

if TYPE_CHECKING:
    from collections.abc import Sequence

    from coordgap.config import AnalysisConfig

DECIMALS = 6  # written floats are rounded so that the files are byte-stable across platforms

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
    "t": pl.Float64(),
    "dof": pl.Float64(),
    "p": pl.Float64(),
    "p_holm": pl.Float64(),
    "hedges_g": pl.Float64(),
    "hedges_g_ci_low": pl.Float64(),
    "hedges_g_ci_high": pl.Float64(),
    "power": pl.Float64(),
    "mwu_u": pl.Float64(),
    "mwu_p": pl.Float64(),
    "mwu_p_holm": pl.Float64(),
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

COMPONENT_SCHEMA: dict[str, pl.DataType] = {
    "model": pl.String(),
    "n": pl.Int64(),
    "variant": pl.String(),
    "component": pl.String(),
    "weight": pl.Float64(),
    "value_mean": pl.Float64(),
    "contribution": pl.Float64(),
}

SEAT_SCHEMA: dict[str, pl.DataType] = {
    "model": pl.String(),
    "n": pl.Int64(),
    "seat": pl.Int64(),
    "episodes": pl.Int64(),
    "meals_mean": pl.Float64(),
    "meals_ci_low": pl.Float64(),
    "meals_ci_high": pl.Float64(),
    "meal_share": pl.Float64(),
    "starved_rate": pl.Float64(),
}

_OK = pl.col("status") == "ok"
_RATES = ("throughput", "fairness", "idle", "failed_rate", "no_call_rate")
# Per-decision costs, from the episode columns that language models fill and scripted ones
# leave at zero.
_COSTS = {
    "tokens_in_per_decision": "tokens_in",
    "tokens_out_per_decision": "tokens_out",
    "latency_s_per_decision": "latency_s",
}


def reward_columns(variant: RewardVariant) -> tuple[str, str, str]:
    """Name the summary columns of one variant's mean reward and its interval.

    Args:
        variant: The reward variant.

    Returns:
        The mean, lower-bound and upper-bound column names.
    """
    return f"reward_{variant}_mean", f"reward_{variant}_ci_low", f"reward_{variant}_ci_high"


def reward_sd_column(variant: RewardVariant) -> str:
    """Name the summary column of one variant's reward standard deviation."""
    return f"reward_{variant}_sd"


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
        schema.update(
            dict.fromkeys((*reward_columns(variant), reward_sd_column(variant)), pl.Float64())
        )
    rates = ("deadlock_rate", "deadlock_ci_low", "deadlock_ci_high")
    rates += ("zero_meal_rate", "zero_meal_ci_low", "zero_meal_ci_high", "meals_mean", "meals_sd")
    schema.update(dict.fromkeys(rates + _RATES + tuple(_COSTS), pl.Float64()))
    return schema


def episode_reward_schema(variants: Sequence[RewardVariant]) -> dict[str, pl.DataType]:
    """Give the column names and dtypes of :func:`episode_rewards`'s table, in order."""
    schema: dict[str, pl.DataType] = {
        "model": pl.String(),
        "n": pl.Int64(),
        "episode": pl.Int64(),
        "deadlock": pl.Boolean(),
        "meals_total": pl.Int64(),
    }
    return schema | {f"reward_{variant}": pl.Float64() for variant in variants}


def read_table(path: str | Path, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Read a CSV written by this package with its exact dtypes.

    Explicit dtypes matter: a column that is null in every row is empty in the file and would
    otherwise read as text.

    Args:
        path: The CSV file.
        schema: Its columns, e.g. :data:`COMPARISON_SCHEMA` or :func:`summary_schema`'s.

    Returns:
        The table.
    """
    return pl.read_csv(path, schema=schema)


def read_columns(path: str | Path, dtypes: dict[str, pl.DataType]) -> pl.DataFrame:
    """Read some columns of a CSV written by this package, with their exact dtypes.

    Args:
        path: The CSV file.
        dtypes: The columns wanted and their dtypes.

    Returns:
        Those columns, in the order of ``dtypes``.
    """
    return pl.read_csv(path, columns=list(dtypes), schema_overrides=dtypes).select(list(dtypes))


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


def with_rewards(episodes: pl.DataFrame, config: AnalysisConfig) -> pl.DataFrame:
    """Add one ``reward_<variant>`` column per configured variant to an episode table."""
    return episodes.with_columns(
        reward_expr(variant, config.weights).alias(f"reward_{variant}")
        for variant in config.variants
    )


def _ok_ratio(numerator: str, denominator: str, *, recorded_only: bool = False) -> pl.Expr:
    """Build sum(numerator) / sum(denominator) over ``ok`` episodes; null with nothing to divide.

    With ``recorded_only``, also null when the numerator is zero throughout: costs that only
    language models record (tokens, latency) are then absent rather than free.
    """
    total = pl.col(denominator).filter(_OK).sum()
    part = pl.col(numerator).filter(_OK).sum()
    defined = (total > 0) & (part > 0) if recorded_only else total > 0
    return pl.when(defined).then(part / total)


def _wilson_columns(
    successes: pl.Series, trials: pl.Series, prefix: str, confidence: float
) -> list[pl.Series]:
    bounds = [wilson_interval(k, t, confidence) for k, t in zip(successes, trials, strict=True)]
    return [
        pl.Series(f"{prefix}_ci_low", [low for low, _ in bounds], dtype=pl.Float64),
        pl.Series(f"{prefix}_ci_high", [high for _, high in bounds], dtype=pl.Float64),
    ]


def summarize(episodes: pl.DataFrame, config: AnalysisConfig) -> pl.DataFrame:
    """Summarise every model x N cell: rewards with intervals, deadlocks, meals, rates, costs.

    Args:
        episodes: Episode rows (DESIGN.md §5), any number of models and sizes.
        config: The analysis configuration.

    Returns:
        One row per (model, n), sorted by model then n, with the columns of
        :func:`summary_schema`; statistics of a cell without ``ok`` episodes are null, and so
        is an SD or interval that one episode cannot give.
    """
    cells = (
        with_rewards(episodes, config)
        .group_by("model", "n")
        .agg(
            _OK.sum().cast(pl.Int64).alias("episodes"),
            (~_OK).sum().cast(pl.Int64).alias("errors"),
            pl.col("deadlock").filter(_OK).sum().alias("deadlocks"),
            (pl.col("meals_total") == 0).filter(_OK).sum().alias("zero_meals"),
            pl.col("meals_total").filter(_OK).mean().alias("meals_mean"),
            pl.col("meals_total").filter(_OK).std().alias("meals_sd"),
            pl.col("r_thru").filter(_OK).mean().alias("throughput"),
            pl.col("r_fair").filter(_OK).mean().alias("fairness"),
            pl.col("r_idle").filter(_OK).mean().alias("idle"),
            _ok_ratio("failed", "decisions").alias("failed_rate"),
            _ok_ratio("no_call", "decisions").alias("no_call_rate"),
            *(
                _ok_ratio(column, "decisions", recorded_only=True).alias(name)
                for name, column in _COSTS.items()
            ),
            *(
                pl.col(f"reward_{variant}").filter(_OK).std().alias(reward_sd_column(variant))
                for variant in config.variants
            ),
            *(pl.col(f"reward_{variant}").filter(_OK) for variant in config.variants),
        )
        .sort("model", "n")
    )
    columns: list[pl.Series] = []
    for variant in config.variants:
        estimates = [
            bootstrap_mean_ci(
                sample.to_numpy(), config.confidence, config.bootstrap_resamples, config.seed
            )
            for sample in cells[f"reward_{variant}"]
        ]
        for name, column in zip(reward_columns(variant), zip(*estimates, strict=True), strict=True):
            columns.append(pl.Series(name, column, dtype=pl.Float64))
    columns += _wilson_columns(cells["deadlocks"], cells["episodes"], "deadlock", config.confidence)
    columns += _wilson_columns(
        cells["zero_meals"], cells["episodes"], "zero_meal", config.confidence
    )
    schema = summary_schema(config.variants)
    return (
        cells.with_columns(
            (pl.col("deadlocks") / pl.col("episodes")).alias("deadlock_rate"),
            (pl.col("zero_meals") / pl.col("episodes")).alias("zero_meal_rate"),
            *columns,
        )
        .select(list(schema))
        .with_columns(pl.col(pl.Float64).fill_nan(None))
    )


def comparison_families(config: AnalysisConfig) -> dict[str, tuple[tuple[str, str], ...]]:
    """Group the comparisons into families; Holm's correction runs within each (and variant).

    Today there is one family, the pairs of ``analysis.comparisons``. Another question asked of
    the same episodes (a trained checkpoint against its base model, say) is another family,
    built here from its own config, so that its tests do not dilute these.

    Args:
        config: The analysis configuration.

    Returns:
        Family name -> its (model a, model b) pairs, in config order.
    """
    return {"configured": config.comparisons}


_TESTS = ("t", "dof", "p", "hedges_g", "hedges_g_ci_low", "hedges_g_ci_high", "power")


def welch(x: np.ndarray, y: np.ndarray, config: AnalysisConfig) -> dict[str, Any]:
    """Run Welch's t-test, Hedges' g with its CI and the achieved power, or say why not."""
    if np.ptp(x) == 0 and np.ptp(y) == 0:
        return dict.fromkeys(_TESTS, math.nan) | {"note": "zero variance in both samples"}
    with warnings.catch_warnings():
        # scipy calls one constant sample a "precision loss"; its variance is exactly zero,
        # which Welch's test handles, so the warning would only be noise.
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        test = pg.ttest(x, y, correction=True).iloc[0]
    g = float(pg.compute_effsize(x, y, eftype="hedges"))
    low, high = pg.compute_esci(
        stat=g, nx=x.size, ny=y.size, eftype="hedges", confidence=config.confidence, decimals=15
    )
    # Power of the pooled two-sample t-test at the observed effect: Welch's test has no closed
    # form, and with similar variances the two agree closely.
    power = pg.power_ttest2n(x.size, y.size, d=abs(g), alpha=config.power.alpha)
    return {
        "t": float(test["T"]),
        "dof": float(test["dof"]),
        "p": float(test["p_val"]),
        "hedges_g": g,
        "hedges_g_ci_low": float(low),
        "hedges_g_ci_high": float(high),
        "power": float(power),
        "note": None,
    }


def _pair(
    a: pl.DataFrame | None,
    b: pl.DataFrame | None,
    names: tuple[str, str],
    variant: RewardVariant,
    config: AnalysisConfig,
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
    bounds = newcombe_interval(deadlocks_a, x.size, deadlocks_b, y.size, config.confidence)
    row["deadlock_diff_ci_low"], row["deadlock_diff_ci_high"] = bounds
    row["diff_ci_low"], row["diff_ci_high"] = bootstrap_difference_ci(
        x, y, config.confidence, config.bootstrap_resamples, config.seed
    )
    missing = [name for name, sample in zip(names, (x, y), strict=True) if sample.size == 0]
    if missing:
        note = "no ok episodes of " + " and ".join(missing)
    elif min(x.size, y.size) < 2:
        note = "fewer than two episodes in a sample"
    else:
        mwu = pg.mwu(x, y).iloc[0]
        row |= {"mwu_u": float(mwu["U_val"]), "mwu_p": float(mwu["p_val"])} | welch(x, y, config)
        return row
    return row | dict.fromkeys((*_TESTS, "mwu_u", "mwu_p"), math.nan) | {"note": note}


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


def compare(episodes: pl.DataFrame, config: AnalysisConfig) -> pl.DataFrame:
    """Compare each family's model pairs at every N at which both models played.

    Args:
        episodes: Episode rows (DESIGN.md §5).
        config: The analysis configuration.

    Returns:
        One row per family, variant, pair and N (in that order; pairs in config order, N
        ascending) with the columns of ``COMPARISON_SCHEMA``. ``diff`` is ``mean_a - mean_b``;
        ``p_holm`` and ``mwu_p_holm`` are Holm-adjusted within the family and variant. A pair
        at an N where a model has no ``ok`` episode is kept, with a note saying so.
    """
    rewarded = with_rewards(episodes, config)
    played = set(rewarded.select("model", "n").unique().iter_rows())
    samples = rewarded.filter(_OK).partition_by("model", "n", as_dict=True)
    rows: list[dict[str, Any]] = []
    for family, pairs in comparison_families(config).items():
        for variant in config.variants:
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
            for p, adjusted in (("p", "p_holm"), ("mwu_p", "mwu_p_holm")):
                for row, value in zip(group, holm([r[p] for r in group]), strict=True):
                    row[adjusted] = value
            rows.extend(group)
    return pl.DataFrame(rows, schema=COMPARISON_SCHEMA)


def _design(
    design: str, episodes: int, cells: int | None, config: AnalysisConfig
) -> dict[str, Any]:
    """Power at the configured effect, and the smallest detectable effect, of one design."""
    settings = config.power
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


def power_table(summary: pl.DataFrame, paper_episodes: int, config: AnalysisConfig) -> pl.DataFrame:
    """Tabulate the a-priori power of two-sample comparisons under three designs.

    ``required`` is the smallest number of episodes per cell that detects the configured
    effect (Hedges' g) at the configured alpha with the configured power; ``paper`` is the
    paper's episodes per cell; ``ours`` is one row per distinct number of ``ok`` episodes among
    our cells. Each row gives the power at the configured effect and the smallest effect
    detectable with the configured power.

    Args:
        summary: The table of :func:`summarize`.
        paper_episodes: The paper's episodes per cell (30).
        config: The analysis configuration.

    Returns:
        Rows with the columns of ``POWER_SCHEMA``.
    """
    settings = config.power
    needed = pg.power_ttest(
        d=settings.effect_size, power=settings.power, alpha=settings.alpha, contrast="two-samples"
    )
    rows = [
        _design("required", math.ceil(needed), None, config),
        _design("paper", paper_episodes, None, config),
    ]
    # A t-test needs two episodes per sample.
    counts = summary.filter(pl.col("episodes") >= 2)["episodes"].value_counts().sort("episodes")
    rows += [_design("ours", k, cells, config) for k, cells in counts.iter_rows()]
    return pl.DataFrame(rows, schema=POWER_SCHEMA)


def component_table(episodes: pl.DataFrame, config: AnalysisConfig) -> pl.DataFrame:
    """Split each cell's mean reward into its four signed, weighted terms, under every variant.

    Args:
        episodes: Episode rows (DESIGN.md §5).
        config: The analysis configuration.

    Returns:
        One row per model, N, variant and component (``nd``, ``thru``, ``fair``, ``idle``)
        with the columns of ``COMPONENT_SCHEMA``: the component's weight and mean value over
        ``ok`` episodes, and its contribution (sign x weight x mean), so that a cell's
        contributions sum to its mean reward. Null for a cell without ``ok`` episodes.
    """
    frames = []
    for variant in config.variants:
        means = episodes.group_by("model", "n").agg(
            expr.filter(_OK).mean().alias(name) for name, expr in component_exprs(variant).items()
        )
        long = means.unpivot(
            index=["model", "n"], variable_name="component", value_name="value_mean"
        )
        frames.append(long.with_columns(pl.lit(str(variant)).alias("variant")))
    weights = pl.DataFrame(
        {
            "component": list(SIGNS),
            "weight": [getattr(config.weights, name) for name in SIGNS],
            "sign": list(SIGNS.values()),
            "order": range(len(SIGNS)),
        }
    )
    return (
        pl.concat(frames)
        .join(weights, on="component")
        .with_columns(
            (pl.col("sign") * pl.col("weight") * pl.col("value_mean")).alias("contribution")
        )
        .sort(
            "model",
            "n",
            pl.col("variant").cast(pl.Enum([str(v) for v in config.variants])),
            "order",
        )
        .select(list(COMPONENT_SCHEMA))
    )


def seat_table(episodes: pl.DataFrame, config: AnalysisConfig) -> pl.DataFrame:
    """Tabulate meals by seat: the audit of tie-breaks and seat-dependent policies.

    Args:
        episodes: Episode rows (DESIGN.md §5).
        config: The analysis configuration (interval level, bootstrap).

    Returns:
        One row per model, N and seat over ``ok`` episodes, with the columns of
        ``SEAT_SCHEMA``: mean meals with a bootstrap CI, the seat's share of all meals (null
        when nobody ate), and the share of episodes in which the seat starved (no meal while
        another seat ate).
    """
    seats = (
        episodes.filter(_OK)
        .select("model", "n", "meals_total", pl.col("meals_per_philosopher").alias("meals"))
        .with_columns(pl.int_ranges(0, pl.col("n")).alias("seat"))
        .explode("meals", "seat")
        .group_by("model", "n", "seat")
        .agg(
            pl.len().cast(pl.Int64).alias("episodes"),
            pl.when(pl.col("meals_total").sum() > 0)
            .then(pl.col("meals").sum() / pl.col("meals_total").sum())
            .alias("meal_share"),
            ((pl.col("meals") == 0) & (pl.col("meals_total") > 0)).mean().alias("starved_rate"),
            pl.col("meals").cast(pl.Float64),
        )
        .sort("model", "n", "seat")
    )
    estimates = [
        bootstrap_mean_ci(
            sample.to_numpy(), config.confidence, config.bootstrap_resamples, config.seed
        )
        for sample in seats["meals"]
    ]
    names = ("meals_mean", "meals_ci_low", "meals_ci_high")
    columns = (
        [
            pl.Series(name, column, dtype=pl.Float64)
            for name, column in zip(names, zip(*estimates, strict=True), strict=True)
        ]
        if estimates
        else [pl.Series(name, [], dtype=pl.Float64) for name in names]
    )
    return (
        seats.with_columns(columns)
        .select(list(SEAT_SCHEMA))
        .with_columns(pl.col(pl.Float64).fill_nan(None))
    )


def episode_rewards(episodes: pl.DataFrame, config: AnalysisConfig) -> pl.DataFrame:
    """List every ``ok`` episode's deadlock, meals and reward under every variant.

    Args:
        episodes: Episode rows (DESIGN.md §5).
        config: The analysis configuration.

    Returns:
        One row per ``ok`` episode, sorted by model, N and episode, with the columns of
        :func:`episode_reward_schema`.
    """
    schema = episode_reward_schema(config.variants)
    return (
        with_rewards(episodes.filter(_OK), config)
        .select(list(schema))
        .sort("model", "n", "episode")
    )


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


def write_csv(frame: pl.DataFrame, path: str | Path) -> None:
    """Write a table as CSV with floats rounded to ``DECIMALS`` places and NaN as empty.

    A zero is written ``0.0`` whatever its sign: a penalty on a zero mean, or a tiny negative
    value rounded away, would otherwise read ``-0.0``.

    Args:
        frame: The table.
        path: The CSV file.
    """
    rounded = pl.col(pl.Float64).fill_nan(None).round(DECIMALS)
    frame.with_columns(pl.when(rounded == 0).then(0.0).otherwise(rounded).name.keep()).write_csv(
        path
    )


def paper_episodes_per_cell(paper_reference_yaml: str | Path) -> int:
    """Read the paper's episodes per model x N cell from ``config/paper_reference.yaml``."""
    paper = yaml.safe_load(Path(paper_reference_yaml).read_text(encoding="utf-8"))
    return int(paper["episodes"]["per_cell"])


@dataclass(frozen=True)
class StatsOutputs:
    """The files :func:`write_stats` writes."""

    summary: str | Path
    comparisons: str | Path
    power: str | Path
    components: str | Path
    seats: str | Path
    episode_rewards: str | Path
    metrics: str | Path


def write_stats(
    episode_paths: Sequence[str | Path],
    paper_reference_yaml: str | Path,
    config: AnalysisConfig,
    outputs: StatsOutputs,
) -> None:
    """Compute every statistics table of the episode tables and write them.

    Floats are rounded to ``DECIMALS`` places, so the same episodes give the same bytes.

    Args:
        episode_paths: Parquet episode tables.
        paper_reference_yaml: The paper's published design (episodes per cell).
        config: The analysis configuration.
        outputs: Where each table goes.
    """
    episodes = load_episodes(episode_paths)
    summary = summarize(episodes, config)
    write_csv(summary, outputs.summary)
    write_csv(compare(episodes, config), outputs.comparisons)
    paper_episodes = paper_episodes_per_cell(paper_reference_yaml)
    write_csv(power_table(summary, paper_episodes, config), outputs.power)
    write_csv(component_table(episodes, config), outputs.components)
    write_csv(seat_table(episodes, config), outputs.seats)
    write_csv(episode_rewards(episodes, config), outputs.episode_rewards)
    rounded = summary.with_columns(pl.col(pl.Float64).round(DECIMALS))
    text = json.dumps(metrics(rounded, config), sort_keys=True, indent=2)
    Path(outputs.metrics).write_text(text + "\n", encoding="utf-8")
