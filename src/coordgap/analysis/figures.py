"""Figures of the statistics tables, each written as PNG and PDF with its data as CSV.

Every figure is built by a pure function from a table of :mod:`coordgap.analysis.stats`
(returning the figure and the slice of the table it shows), and written by a ``write_*``
function that reads the table's CSV. Models keep the same mark in every figure (their sorted
order), and the style comes from :mod:`coordgap.analysis.style`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from coordgap.analysis.catalog import figure_spec
from coordgap.analysis.stats import (
    COMPONENT_SCHEMA,
    SEAT_COLUMNS,
    SEAT_SCHEMA,
    SMALL_CELL,
    episode_reward_schema,
    read_columns,
    reward_columns,
)
from coordgap.analysis.style import GREYS, HATCHES, marks, new_figure, save_figure, styled
from coordgap.env.variants import RewardVariant

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_GROUP_WIDTH = 0.8  # share of the space between two x positions taken by one group of models

DEADLOCK_COLUMNS = ("deadlock_rate", "deadlock_ci_low", "deadlock_ci_high")
# The components' names in figures, in the order of coordgap.env.variants.SIGNS.
COMPONENT_LABELS = {
    "nd": "no deadlock (+)",
    "thru": "throughput (+)",
    "fair": "unfairness (-)",
    "idle": "idleness (-)",
}


def _models(table: pl.DataFrame) -> list[str]:
    return table["model"].unique().sort().to_list()


def _sizes(table: pl.DataFrame) -> list[int]:
    return table["n"].unique().sort().to_list()


def _episodes(counts: Sequence[int]) -> str:
    low, high = min(counts), max(counts)
    return f"n={low}" if low == high else f"n={low}-{high}"


def _dodged_intervals(
    axes: Axes, data: pl.DataFrame, x: str, columns: Sequence[str], models: Sequence[str]
) -> None:
    """Draw each model's estimates with their intervals, side by side around each x value.

    Where ``data`` has an ``episodes`` column (one row per model x N cell), each model's label
    states its episodes per cell and the cells below :data:`SMALL_CELL` episodes are drawn
    hollow: their intervals are a smoke run's, not estimates to set beside the others.

    Args:
        axes: Where to draw.
        data: Rows with ``model``, the x column and the estimate, low and high columns.
        x: The column of x positions (consecutive integers or categories).
        columns: The estimate, lower-bound and upper-bound columns.
        models: Every model of the figure, which fixes marks and offsets.
    """
    positions = {value: index for index, value in enumerate(data[x].unique().sort())}
    step = _GROUP_WIDTH / max(len(models), 1)
    value, low, high = columns
    counted = "episodes" in data.columns
    for index, (model, mark) in enumerate(marks(models).items()):
        cell = data.filter(pl.col("model") == model)
        if cell.is_empty():
            continue
        offset = (index - (len(models) - 1) / 2) * step
        label = f"{model} ({_episodes(cell['episodes'].to_list())})" if counted else model
        small = (
            cell["episodes"] < SMALL_CELL
            if counted
            else pl.zeros(cell.height, dtype=pl.Boolean, eager=True)
        )
        for hollow in (False, True):
            part = cell.filter(small if hollow else ~small)
            if part.is_empty():
                continue
            centre = part[value].to_numpy()
            errors = np.vstack([centre - part[low].to_numpy(), part[high].to_numpy() - centre])
            axes.errorbar(
                [positions[v] + offset for v in part[x]],
                centre,
                yerr=np.nan_to_num(errors),  # an undefined interval is drawn as none
                fmt=mark.marker,
                color=mark.colour,
                markerfacecolor="none" if hollow else mark.colour,
                markersize=5,
                capsize=2.5,
                label=label,
            )
            label = "_" + label  # one legend entry per model: matplotlib skips "_" labels
    axes.set_xticks(range(len(positions)), [str(v) for v in positions])


def _cells_legend(figure: Figure, axes: Axes, data: pl.DataFrame) -> None:
    """Put a per-cell figure's legend right of its axes, off the data.

    A hollow mark gets an entry of its own when some cell has fewer than :data:`SMALL_CELL`
    episodes.
    """
    handles, labels = axes.get_legend_handles_labels()
    if (data["episodes"] < SMALL_CELL).any():
        handles.append(
            Line2D([], [], marker="o", color="0.3", markerfacecolor="none", linestyle="none")
        )
        labels.append(f"hollow: n < {SMALL_CELL}\n(a smoke run)")
    figure.legend(handles, labels, title="model (episodes per cell)", loc="outside right upper")


def _shared_legend(figure: Figure, panels: Sequence[Axes], title: str | None = None) -> None:
    """One legend for side-by-side panels, right of them, from the first panel's entries."""
    handles, labels = panels[0].get_legend_handles_labels()
    figure.legend(handles, labels, title=title, loc="outside right upper")


def reward_figure(summary: pl.DataFrame, variant: RewardVariant) -> tuple[Figure, pl.DataFrame]:
    """Plot each model's mean reward with its confidence interval, grouped by N.

    Args:
        summary: The table of :func:`coordgap.analysis.stats.summarize`.
        variant: Which reward variant.

    Returns:
        The figure, and the columns of ``summary`` it shows.
    """
    data = summary.select("model", "n", "episodes", *reward_columns(variant))
    figure, (axes,) = new_figure(7.6, 3.8)
    _dodged_intervals(axes, data, "n", reward_columns(variant), _models(data))
    axes.set_xticklabels([f"N={n}" for n in _sizes(data)])
    axes.set_xlabel("philosophers at the table")
    axes.set_ylabel(f"mean {variant} reward (95% CI)")
    _cells_legend(figure, axes, data)
    return figure, data


def deadlock_figure(summary: pl.DataFrame) -> tuple[Figure, pl.DataFrame]:
    """Plot each model's deadlock rate with its Wilson interval, grouped by N.

    Args:
        summary: The table of :func:`coordgap.analysis.stats.summarize`.

    Returns:
        The figure, and the columns of ``summary`` it shows.
    """
    data = summary.select("model", "n", "episodes", *DEADLOCK_COLUMNS)
    figure, (axes,) = new_figure(7.6, 3.8)
    _dodged_intervals(axes, data, "n", DEADLOCK_COLUMNS, _models(data))
    axes.set_xticklabels([f"N={n}" for n in _sizes(data)])
    axes.set_ylim(-0.05, 1.05)
    axes.set_xlabel("philosophers at the table")
    axes.set_ylabel("share of episodes that deadlocked (Wilson CI)")
    _cells_legend(figure, axes, data)
    return figure, data


def reward_vs_meals_figure(
    episode_rewards: pl.DataFrame, variant: RewardVariant
) -> tuple[Figure, pl.DataFrame]:
    """Plot every episode's reward against its meals, one panel per N.

    The paper reward's degenerate maximum shows as episodes at zero meals scoring above the
    ones that ate; a line marks the best score reached without a meal.

    Args:
        episode_rewards: The table of :func:`coordgap.analysis.stats.episode_rewards`.
        variant: Which reward variant.

    Returns:
        The figure, and the columns of ``episode_rewards`` it shows.
    """
    reward = f"reward_{variant}"
    data = episode_rewards.select("model", "n", "episode", "meals_total", reward)
    models, sizes = _models(data), _sizes(data)
    figure, panels = new_figure(3.0 * len(sizes) + 1.0, 3.6, panels=len(sizes))
    step = _GROUP_WIDTH / max(len(models), 1)
    for axes, n in zip(panels[: len(sizes)], sizes, strict=True):
        cell = data.filter(pl.col("n") == n)
        axes.axvspan(-0.5, 0.5, color="0.93", zorder=0, label="no meal")
        for index, (model, mark) in enumerate(marks(models).items()):
            points = cell.filter(pl.col("model") == model)
            offset = (index - (len(models) - 1) / 2) * step
            axes.scatter(
                points["meals_total"].to_numpy() + offset,
                points[reward].to_numpy(),
                marker=mark.marker,
                color=mark.colour,
                s=18,
                alpha=0.6,
                label=model,
            )
        best = cell.filter(pl.col("meals_total") == 0)[reward].max()
        if best is not None:
            axes.axhline(
                best, color="0.2", linestyle="--", linewidth=0.8, label="best without a meal"
            )
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # meals are counts
        axes.set_title(f"N={n}")
        axes.set_xlabel("meals in the episode")
    panels[0].set_ylabel(f"episode {variant} reward")
    _shared_legend(figure, panels)
    return figure, data


def components_figure(
    components: pl.DataFrame, variant: RewardVariant
) -> tuple[Figure, pl.DataFrame]:
    """Stack each model's mean reward from its four signed, weighted terms, one panel per N.

    Rewards stack upwards from zero, penalties downwards; a marker shows their sum, the mean
    reward.

    Args:
        components: The table of :func:`coordgap.analysis.stats.component_table`.
        variant: Which reward variant.

    Returns:
        The figure, and the rows of ``components`` it shows.
    """
    data = components.filter(pl.col("variant") == str(variant))
    models, sizes = _models(data), _sizes(data)
    figure, panels = new_figure(1.2 + len(sizes) * (0.5 * len(models) + 0.8), 3.8, len(sizes))
    x = np.arange(len(models))
    for axes, n in zip(panels[: len(sizes)], sizes, strict=True):
        # models x components; a model missing at this N, or without ok episodes, stacks nothing.
        wide = (
            pl.DataFrame({"model": models})
            .join(
                data.filter(pl.col("n") == n).pivot(
                    "component", index="model", values="contribution"
                ),
                on="model",
                how="left",
            )
            .fill_null(0.0)
        )
        up, down = np.zeros(len(models)), np.zeros(len(models))
        for index, (component, label) in enumerate(COMPONENT_LABELS.items()):
            values = wide[component].to_numpy() if component in wide else np.zeros(len(models))
            rising = values >= 0
            axes.bar(
                x,
                values,
                bottom=np.where(rising, up, down),
                width=0.7,
                color=GREYS[index],
                hatch=HATCHES[index],
                edgecolor="black",
                linewidth=0.5,
                label=label,
            )
            up, down = np.where(rising, up + values, up), np.where(rising, down, down + values)
        axes.scatter(
            x,
            up + down,
            marker="D",
            color="white",
            edgecolor="black",
            zorder=3,
            label="mean reward",
        )
        axes.axhline(0, color="black", linewidth=0.6)
        axes.set_xticks(x, models, rotation=35, ha="right")
        axes.set_title(f"N={n}")
        axes.set_xlabel("model")
    panels[0].set_ylabel(f"mean {variant} reward, by term")
    _shared_legend(figure, panels)
    return figure, data


def meals_by_seat_figure(seats: pl.DataFrame) -> tuple[Figure, pl.DataFrame]:
    """Plot each model's mean meals per seat with bootstrap intervals, one panel per N.

    Under a symmetric policy and random tie-breaks every seat should eat alike; a slope or a
    spike points at the tie-break rule or at a seat-dependent policy.

    Args:
        seats: The table of :func:`coordgap.analysis.stats.seat_table`.

    Returns:
        The figure, and the columns of ``seats`` it shows.
    """
    data = seats.select("model", "n", "seat", *SEAT_COLUMNS)
    models, sizes = _models(data), _sizes(data)
    figure, panels = new_figure(1.5 + sum(0.35 * n + 0.6 for n in sizes), 3.6, len(sizes))
    for axes, n in zip(panels[: len(sizes)], sizes, strict=True):
        _dodged_intervals(axes, data.filter(pl.col("n") == n), "seat", SEAT_COLUMNS, models)
        axes.set_title(f"N={n}")
        axes.set_xlabel("seat")
    panels[0].set_ylabel("mean meals per episode (bootstrap CI)")
    _shared_legend(figure, panels, title="model")
    return figure, data


def _summary_columns(columns: Sequence[str]) -> dict[str, pl.DataType]:
    cell = {"model": pl.String(), "n": pl.Int64(), "episodes": pl.Int64()}
    return cell | dict.fromkeys(columns, pl.Float64())


# How each figure of coordgap.analysis.catalog is drawn, by its name: the columns it reads
# from its table (for a variant), and the function that draws it.
_DRAWINGS: dict[
    str,
    tuple[
        Callable[[RewardVariant | None], dict[str, pl.DataType]],
        Callable[[pl.DataFrame, RewardVariant | None], tuple[Figure, pl.DataFrame]],
    ],
] = {
    "reward": (lambda variant: _summary_columns(reward_columns(variant)), reward_figure),
    "deadlock": (
        lambda _: _summary_columns(DEADLOCK_COLUMNS),
        lambda summary, _: deadlock_figure(summary),
    ),
    "reward_vs_meals": (lambda variant: episode_reward_schema([variant]), reward_vs_meals_figure),
    "components": (lambda _: COMPONENT_SCHEMA, components_figure),
    "meals_by_seat": (lambda _: SEAT_SCHEMA, lambda seats, _: meals_by_seat_figure(seats)),
}


def write_figure(
    figure: str,
    table_csv: str | Path,
    png: str | Path,
    pdf: str | Path,
    csv: str | Path,
    variant: RewardVariant | str | None = None,
) -> None:
    """Read a statistics table, draw a figure of the catalog from it, and write it with its data.

    Args:
        figure: The figure's name in :data:`coordgap.analysis.catalog.STATISTICS_FIGURES`.
        table_csv: The table its entry names, as written by
            :func:`coordgap.analysis.stats.write_stats`.
        png: Output PNG file.
        pdf: Output PDF file.
        csv: Output CSV file of the numbers shown.
        variant: The reward variant of a per-variant figure, or its name.

    Raises:
        ValueError: ``figure`` is not in the catalog, or a per-variant figure has no variant.
    """
    spec = figure_spec(figure)
    if spec.per_variant and variant is None:
        raise ValueError(f"figure {figure!r} is drawn per reward variant; none was given")
    variant = None if variant is None else RewardVariant(variant)
    columns, draw = _DRAWINGS[spec.name]
    table = read_columns(table_csv, columns(variant))
    with styled():
        save_figure(*draw(table, variant), png, pdf, csv)
