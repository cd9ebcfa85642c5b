"""Degenerate-policy monitors: per model x N, the shares that give a degenerate policy away.

A policy can score well on the paper reward by not playing, and an API model can look as if
it did when its replies are cut off. Five monitors look for that, each on the ``ok`` episodes of
a cell (``coordgap.env.variants`` for the reward):

* ``degenerate``: the share of episodes without a meal that still score at least
  ``degenerate_reward`` under the paper reward (its maximum, 1.0, needs no action at all);
* ``all_think``: the share of episodes in which every action was a think (a collapse to
  idling; an episode without any action is not one, it is a no-call);
* ``no_call``: the share of decisions that carried no parseable tool call;
* ``truncated``: the share of decisions cut off by the completion token limit before they held
  a valid call (they count as no_call in the reward, which scores them near its maximum);
* ``starvation``: the share of episodes in which a seat had no meal while another seat ate.

A cell whose share reaches the monitor's threshold (config ``analysis.monitors``) is flagged;
the report prints the flags beside the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from coordgap.analysis.stats import OK, load_episodes, write_csv
from coordgap.env.variants import RewardVariant, reward_expr

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from coordgap.config.analysis import MonitorConfig

# Monitor name -> (the cell's share column, the MonitorConfig threshold it is held to).
MONITORS: dict[str, tuple[str, str]] = {
    "degenerate": ("degenerate_share", "degenerate_share"),
    "all_think": ("all_think_share", "all_think_share"),
    "no_call": ("no_call_rate", "no_call_rate"),
    "truncated": ("truncated_rate", "truncated_rate"),
    "starvation": ("starvation_share", "starvation_share"),
}

MONITOR_SCHEMA: dict[str, pl.DataType] = {
    "model": pl.String(),
    "n": pl.Int64(),
    "episodes": pl.Int64(),
    **{share: pl.Float64() for share, _ in MONITORS.values()},
    **{name: pl.Boolean() for name in MONITORS},
}


def monitor(episodes: pl.DataFrame, config: MonitorConfig) -> pl.DataFrame:
    """Compute every monitor's share and flag for every model x N cell.

    Args:
        episodes: Episode rows (``coordgap.data.EPISODE_SCHEMA``).
        config: The monitors' thresholds and the reward weights.

    Returns:
        One row per (model, n), sorted, with the columns of ``MONITOR_SCHEMA``: the shares,
        then one boolean flag per monitor (share >= threshold). Shares and flags of a cell
        without ``ok`` episodes are null.
    """
    paper = reward_expr(RewardVariant.PAPER, config.weights)
    no_meal = pl.col("meals_total") == 0
    per_episode = {
        "degenerate_share": no_meal & (paper >= config.degenerate_reward),
        "all_think_share": (pl.col("actions") > 0) & (pl.col("think") == pl.col("actions")),
        "starvation_share": ~no_meal & (pl.col("meals_per_philosopher").list.min() == 0),
    }
    decisions = pl.col("decisions").filter(OK).sum()
    cells = (
        episodes.group_by("model", "n")
        .agg(
            OK.sum().cast(pl.Int64).alias("episodes"),
            *(flag.filter(OK).mean().alias(name) for name, flag in per_episode.items()),
            pl.when(decisions > 0)
            .then(pl.col("no_call").filter(OK).sum() / decisions)
            .alias("no_call_rate"),
            pl.when(decisions > 0)
            .then(pl.col("truncated").filter(OK).sum() / decisions)
            .alias("truncated_rate"),
        )
        .sort("model", "n")
    )
    flags = (
        (pl.col(share) >= getattr(config, threshold)).alias(name)
        for name, (share, threshold) in MONITORS.items()
    )
    return cells.with_columns(flags).select(list(MONITOR_SCHEMA))


def flagged(row: dict[str, object]) -> list[str]:
    """Name the monitors that flag one row of :func:`monitor`'s table, in ``MONITORS`` order."""
    return [name for name in MONITORS if row[name]]


def write_monitors(
    episode_paths: Sequence[str | Path], config: MonitorConfig, out_csv: str | Path
) -> None:
    """Monitor episode tables and write the table as CSV (floats rounded, byte-stable).

    Args:
        episode_paths: Parquet episode tables.
        config: The monitors' thresholds and the reward weights.
        out_csv: The monitors table.
    """
    write_csv(monitor(load_episodes(episode_paths), config), out_csv)
