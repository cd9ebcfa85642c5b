"""The one look of every figure: greyscale-readable marks, deterministic files, data beside.

Figures are built on a bare :class:`~matplotlib.figure.Figure` with an Agg canvas rather than
through ``pyplot``, so no global figure registry or backend state is touched and nothing has to
be closed. Series differ by marker, hatch and grey level as well as by colour, so a figure
printed in greyscale still reads. PNG and PDF files carry no software or creation-date
metadata, so the same data give the same bytes; each figure's data go beside it as a CSV.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import matplotlib as mpl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from coordgap.analysis.stats import write_csv

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    import polars as pl

# Okabe & Ito's colour-blind-safe palette, ordered so that neighbours differ in lightness too.
COLOURS = ("#000000", "#E69F00", "#0072B2", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.")
# Fills and hatches of stacked or categorical areas: distinct in greyscale.
GREYS = ("0.15", "0.45", "0.7", "0.9")
HATCHES = ("", "//", "..", "xx")

RC = {
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": "0.88",
    "grid.linewidth": 0.6,
    "legend.frameon": False,
    "hatch.linewidth": 0.6,
    "savefig.dpi": 150,
}


@dataclass(frozen=True)
class Mark:
    """How one series (a model) is drawn."""

    colour: str
    marker: str
    linestyle: str


def marks(names: Sequence[str]) -> dict[str, Mark]:
    """Assign each series a colour, a marker and a line style, stable in the order given.

    Args:
        names: The series, e.g. the models of a table in its sorted order.

    Returns:
        A mark per name; names past the palette reuse it with another line style.
    """
    return {
        name: Mark(
            COLOURS[i % len(COLOURS)],
            MARKERS[i % len(MARKERS)],
            LINESTYLES[i // len(MARKERS) % len(LINESTYLES)],
        )
        for i, name in enumerate(names)
    }


@contextmanager
def styled() -> Iterator[None]:
    """Apply the figure style while building and saving a figure (rcParams are read then)."""
    with mpl.rc_context(RC):
        yield


def new_figure(width: float, height: float, panels: int = 1) -> tuple[Figure, list]:
    """Create a figure with ``panels`` side-by-side axes sharing their y axis.

    Args:
        width: Width in inches.
        height: Height in inches.
        panels: Number of axes, left to right.

    Returns:
        The figure and its axes.
    """
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    # One panel per N: a study whose every episode ended in an error still gets an (empty)
    # figure rather than a crash of its job.
    axes = figure.subplots(1, max(panels, 1), sharey=True, squeeze=False)[0]
    return figure, list(axes)


def save_figure(
    figure: Figure, data: pl.DataFrame, png: str | Path, pdf: str | Path, csv: str | Path
) -> None:
    """Write a figure as PNG and PDF without time or software stamps, and its data as CSV.

    Args:
        figure: The figure.
        data: The numbers it shows.
        png: Output PNG file.
        pdf: Output PDF file.
        csv: Output CSV file (floats rounded as in the statistics tables).
    """
    figure.savefig(png, metadata={"Software": None})
    figure.savefig(pdf, metadata={"CreationDate": None})
    write_csv(data, csv)
