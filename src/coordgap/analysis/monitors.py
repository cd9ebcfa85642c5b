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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from coordgap.analysis.stats import OK, load_episodes, write_csv
from coordgap.env.variants import RewardVariant, reward_expr

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from coordgap.config.analysis import MonitorConfig


@dataclass(frozen=True)
class Monitor:
    """One degenerate-policy monitor: a share per model x N cell, flagged at a threshold.

    Attributes:
        share: The cell's share column; its threshold is ``analysis.monitors.<share>``.
        definition: What the share counts, for the report; ``{c}`` is the ``MonitorConfig``.
        cell_share: The share as an aggregation over a cell's episode rows, given the config.
    """

    share: str
    definition: str
    cell_share: Callable[[MonitorConfig], pl.Expr]


def _share_of_episodes(
    in_episode: Callable[[MonitorConfig], pl.Expr],
) -> Callable[[MonitorConfig], pl.Expr]:
    """The share of a cell's ok episodes for which ``in_episode`` holds."""
    return lambda config: in_episode(config).filter(OK).mean()


def _share_of_decisions(column: str) -> Callable[[MonitorConfig], pl.Expr]:
    """The share of a cell's ok decisions that ``column`` counts; null without decisions."""
    decisions = pl.col("decisions").filter(OK).sum()
    return lambda _: pl.when(decisions > 0).then(pl.col(column).filter(OK).sum() / decisions)


_NO_MEAL = pl.col("meals_total") == 0

MONITORS: dict[str, Monitor] = {
    "degenerate": Monitor(
        share="degenerate_share",
        definition="share of episodes without a meal scoring at least {c.degenerate_reward} "
        "under the paper reward",
        cell_share=_share_of_episodes(
            lambda c: (
                _NO_MEAL & (reward_expr(RewardVariant.PAPER, c.weights) >= c.degenerate_reward)
            )
        ),
    ),
    "all_think": Monitor(
        share="all_think_share",
        definition="share of episodes in which every action was a think",
        cell_share=_share_of_episodes(
            lambda _: (pl.col("actions") > 0) & (pl.col("think") == pl.col("actions"))
        ),
    ),
    "no_call": Monitor(
        share="no_call_rate",
        definition="share of decisions without a parseable tool call",
        cell_share=_share_of_decisions("no_call"),
    ),
    "truncated": Monitor(
        share="truncated_rate",
        definition="share of decisions cut off by the completion token limit before they held "
        "a valid call (no_call to the reward; raise max_tokens)",
        cell_share=_share_of_decisions("truncated"),
    ),
    "starvation": Monitor(
        share="starvation_share",
        definition="share of episodes in which a seat had no meal while another seat ate",
        cell_share=_share_of_episodes(
            lambda _: ~_NO_MEAL & (pl.col("meals_per_philosopher").list.min() == 0)
        ),
    ),
}
"""Every monitor by name (its flag column), in the order of the monitors table and report."""

MONITOR_SCHEMA: dict[str, pl.DataType] = {
    "model": pl.String(),
    "n": pl.Int64(),
    "episodes": pl.Int64(),
    **{check.share: pl.Float64() for check in MONITORS.values()},
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
    cells = (
        episodes.group_by("model", "n")
        .agg(
            OK.sum().cast(pl.Int64).alias("episodes"),
            *(check.cell_share(config).alias(check.share) for check in MONITORS.values()),
        )
        .sort("model", "n")
    )
    flags = (
        (pl.col(check.share) >= config.thresholds[check.share]).alias(name)
        for name, check in MONITORS.items()
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
