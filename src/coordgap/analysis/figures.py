"""Figures of the summary table, drawn with matplotlib's object-oriented API.

Figures are built on a bare :class:`~matplotlib.figure.Figure` with an Agg canvas rather than
through ``pyplot``, so no global figure registry or backend state is touched and nothing has to
be closed. PNG and PDF files carry no software or creation-date metadata, so the same summary
gives the same bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from coordgap.analysis.stats import reward_columns
from coordgap.env.reward import RewardVariant

if TYPE_CHECKING:
    from pathlib import Path

_GROUP_WIDTH = 0.8  # share of the space between two sizes N taken by one group of models


def plot_reward_by_model(
    summary: pl.DataFrame, variant: RewardVariant, png: str | Path, pdf: str | Path
) -> None:
    """Plot each model's mean reward with its confidence interval, grouped by N.

    Args:
        summary: The table of :func:`coordgap.analysis.stats.summarize`.
        variant: Which reward variant to plot.
        png: Output PNG file.
        pdf: Output PDF file.
    """
    mean, low, high = reward_columns(variant)
    sizes = summary["n"].unique().sort().to_list()
    models = summary["model"].unique(maintain_order=True).to_list()
    figure = Figure(figsize=(6.4, 4.0), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    step = _GROUP_WIDTH / len(models)
    for index, model in enumerate(models):
        cell = summary.filter(pl.col("model") == model)
        offset = (index - (len(models) - 1) / 2) * step
        positions = [sizes.index(n) + offset for n in cell["n"]]
        centre = cell[mean].to_numpy()
        errors = np.vstack([centre - cell[low].to_numpy(), cell[high].to_numpy() - centre])
        axes.errorbar(positions, centre, yerr=errors, fmt="o", capsize=3, label=model)
    axes.set_xticks(range(len(sizes)), [f"N={n}" for n in sizes])
    axes.set_xlabel("philosophers")
    axes.set_ylabel(f"mean {variant} reward (with CI)")
    axes.legend(title="model", fontsize="small")
    figure.savefig(png, dpi=150, metadata={"Software": None})
    figure.savefig(pdf, metadata={"CreationDate": None})


def write_reward_figure(
    summary_csv: str | Path, variant: RewardVariant | str, png: str | Path, pdf: str | Path
) -> None:
    """Read a summary CSV and plot one variant's reward by model and N.

    Args:
        summary_csv: The summary written by :func:`coordgap.analysis.stats.write_stats`.
        variant: The reward variant, or its name.
        png: Output PNG file.
        pdf: Output PDF file.
    """
    variant = RewardVariant(variant)
    # Explicit dtypes: a column that is undefined in every cell is empty and would read as text.
    dtypes = {"model": pl.String, "n": pl.Int64} | dict.fromkeys(
        reward_columns(variant), pl.Float64
    )
    summary = pl.read_csv(summary_csv, schema_overrides=dtypes)
    plot_reward_by_model(summary, variant, png, pdf)
