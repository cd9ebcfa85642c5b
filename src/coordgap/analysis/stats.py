"""Statistics of episode tables: per-cell summaries and their breakdowns.

A cell is one model at one table size N. Only episodes with status ``ok`` enter a statistic;
every other episode is counted in the cell's ``errors`` column, so a transport failure never
looks like a silent, high-reward episode. Rewards are derived here from the stored components
with :mod:`coordgap.env.variants`, one column ``reward_<variant>`` per configured variant, and
every table that involves a reward has it under every variant: the paper reward's degenerate
maximum stays visible beside the shaped one.

Tables, all polars, written as CSV by :func:`write_stats`:

* ``summary``: per cell, each variant's mean reward with its CI (Wilson's when every reward of
  the cell is 0 or 1, the bootstrap's otherwise: ``coordgap.intervals.mean_interval``) and SD;
  deadlock and zero-meal rates with Wilson CIs; meals, throughput, fairness, idle, failed and
  no-call rates; tokens and latency per decision where the model recorded them.
* ``components``: each variant's mean reward split into its four signed, weighted terms.
* ``seats``: meals by seat (the tie-break audit).
* ``episode_rewards``: every ok episode's meals and rewards.

Comparisons and power are in :mod:`coordgap.analysis.comparisons`. Statistics that are
undefined are null, and NaN never reaches a file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from coordgap.env.variants import SIGNS, RewardVariant, component_exprs, reward_expr
from coordgap.intervals import bootstrap_mean_ci, mean_interval, wilson_interval

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from coordgap.config.analysis import AnalysisConfig

DECIMALS = 6  # written floats are rounded so that the files are byte-stable across platforms

COMPONENT_SCHEMA: dict[str, pl.DataType] = {
    "model": pl.String(),
    "n": pl.Int64(),
    "variant": pl.String(),
    "component": pl.String(),
    "weight": pl.Float64(),
    "value_mean": pl.Float64(),
    "contribution": pl.Float64(),
}

# The seats table's mean meals and its interval.
SEAT_COLUMNS = ("meals_mean", "meals_ci_low", "meals_ci_high")

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

# Only episodes that ended without a transport error enter a statistic.
OK = pl.col("status") == "ok"
# Cells with fewer ok episodes than this are a smoke run of the machinery, not an estimate: the
# report's findings and the figures mark them (a two-sample comparison of two such cells detects
# only |g| of about 1.3 or more at alpha 0.05 and power 0.8).
SMALL_CELL = 10
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
        paths: Parquet episode tables (``coordgap.data``), one per model x N.

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
    total = pl.col(denominator).filter(OK).sum()
    part = pl.col(numerator).filter(OK).sum()
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


def _mean_columns(
    samples: pl.Series,
    names: Sequence[str],
    config: AnalysisConfig,
    estimator: Callable[..., tuple[float, float, float]] = bootstrap_mean_ci,
) -> list[pl.Series]:
    """Estimate each sample's mean with its CI, as three columns named ``names``.

    ``estimator(values, confidence, resamples, seed)`` gives a mean and its interval.
    """
    estimates = [
        estimator(sample.to_numpy(), config.confidence, config.bootstrap_resamples, config.seed)
        for sample in samples
    ]
    columns = zip(*estimates, strict=True) if estimates else ([], [], [])
    return [
        pl.Series(name, column, dtype=pl.Float64)
        for name, column in zip(names, columns, strict=True)
    ]


def summarize(episodes: pl.DataFrame, config: AnalysisConfig) -> pl.DataFrame:
    """Summarise every model x N cell: rewards with intervals, deadlocks, meals, rates, costs.

    Args:
        episodes: Episode rows (``coordgap.data.EPISODE_SCHEMA``), any number of models and sizes.
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
            OK.sum().cast(pl.Int64).alias("episodes"),
            (~OK).sum().cast(pl.Int64).alias("errors"),
            pl.col("deadlock").filter(OK).sum().alias("deadlocks"),
            (pl.col("meals_total") == 0).filter(OK).sum().alias("zero_meals"),
            pl.col("meals_total").filter(OK).mean().alias("meals_mean"),
            pl.col("meals_total").filter(OK).std().alias("meals_sd"),
            pl.col("r_thru").filter(OK).mean().alias("throughput"),
            pl.col("r_fair").filter(OK).mean().alias("fairness"),
            pl.col("r_idle").filter(OK).mean().alias("idle"),
            _ok_ratio("failed", "decisions").alias("failed_rate"),
            _ok_ratio("no_call", "decisions").alias("no_call_rate"),
            *(
                _ok_ratio(column, "decisions", recorded_only=True).alias(name)
                for name, column in _COSTS.items()
            ),
            *(
                pl.col(f"reward_{variant}").filter(OK).std().alias(reward_sd_column(variant))
                for variant in config.variants
            ),
            *(pl.col(f"reward_{variant}").filter(OK) for variant in config.variants),
        )
        .sort("model", "n")
    )
    columns: list[pl.Series] = []
    for variant in config.variants:
        columns += _mean_columns(
            cells[f"reward_{variant}"], reward_columns(variant), config, mean_interval
        )
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


def component_table(episodes: pl.DataFrame, config: AnalysisConfig) -> pl.DataFrame:
    """Split each cell's mean reward into its four signed, weighted terms, under every variant.

    Args:
        episodes: Episode rows (``coordgap.data.EPISODE_SCHEMA``).
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
            expr.filter(OK).mean().alias(name) for name, expr in component_exprs(variant).items()
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
        episodes: Episode rows (``coordgap.data.EPISODE_SCHEMA``).
        config: The analysis configuration (interval level, bootstrap).

    Returns:
        One row per model, N and seat over ``ok`` episodes, with the columns of
        ``SEAT_SCHEMA``: mean meals with a bootstrap CI, the seat's share of all meals (null
        when nobody ate), and the share of episodes in which the seat starved (no meal while
        another seat ate).
    """
    seats = (
        episodes.filter(OK)
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
    # Meals are counts, not a binary outcome, even where no seat ate twice: the bootstrap.
    columns = _mean_columns(seats["meals"], SEAT_COLUMNS, config)
    return (
        seats.with_columns(columns)
        .select(list(SEAT_SCHEMA))
        .with_columns(pl.col(pl.Float64).fill_nan(None))
    )


def episode_rewards(episodes: pl.DataFrame, config: AnalysisConfig) -> pl.DataFrame:
    """List every ``ok`` episode's deadlock, meals and reward under every variant.

    Args:
        episodes: Episode rows (``coordgap.data.EPISODE_SCHEMA``).
        config: The analysis configuration.

    Returns:
        One row per ``ok`` episode, sorted by model, N and episode, with the columns of
        :func:`episode_reward_schema`.
    """
    schema = episode_reward_schema(config.variants)
    return (
        with_rewards(episodes.filter(OK), config).select(list(schema)).sort("model", "n", "episode")
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


@dataclass(frozen=True)
class StatsOutputs:
    """The files :func:`write_stats` writes."""

    summary: str | Path
    components: str | Path
    seats: str | Path
    episode_rewards: str | Path
    # Model -> its JSON file of headline numbers (a row of `dvc metrics show` each).
    metrics: Mapping[str, str | Path]


def write_stats(
    episode_paths: Sequence[str | Path], config: AnalysisConfig, outputs: StatsOutputs
) -> None:
    """Compute the summary and its breakdowns of the episode tables, and write them.

    Floats are rounded to ``DECIMALS`` places, so the same episodes give the same bytes.

    Args:
        episode_paths: Parquet episode tables.
        config: The analysis configuration.
        outputs: Where each table goes.

    Raises:
        ValueError: The summary's models are not those ``outputs.metrics`` has files for.
    """
    episodes = load_episodes(episode_paths)
    summary = summarize(episodes, config)
    headline = metrics(summary.with_columns(pl.col(pl.Float64).round(DECIMALS)), config)
    if set(headline) != set(outputs.metrics):
        raise ValueError(
            f"the summary holds the models {sorted(headline)}, but metrics files are declared "
            f"for {sorted(outputs.metrics)}"
        )
    write_csv(summary, outputs.summary)
    write_csv(component_table(episodes, config), outputs.components)
    write_csv(seat_table(episodes, config), outputs.seats)
    write_csv(episode_rewards(episodes, config), outputs.episode_rewards)
    files = {Path(path): headline[model] for model, path in outputs.metrics.items()}
    for path, numbers in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(numbers, sort_keys=True, indent=2) + "\n", encoding="utf-8")
    # DVC shows a row for every file of the metrics folder, and Snakemake clears only the
    # declared files: a model dropped from the config, or the .snakemake_timestamp of the folder
    # once declared as a directory output, would stay a row. So no file but these stays there.
    for folder in {path.parent for path in files}:
        for stale in folder.iterdir():
            if stale.is_file() and stale not in files:
                stale.unlink()
