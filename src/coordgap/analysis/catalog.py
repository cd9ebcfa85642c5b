"""The figures of the statistics tables: one entry per figure, and everything follows from it.

An entry names the figure, the statistics table it is drawn from, whether it is drawn once
per reward variant, and how the reports present it. From the entries come the plot rules
(``rules/analysis.smk`` defines one rule ``plot_<name>`` per entry), the targets of ``all``,
the figure section of ``results/report.md`` (:mod:`coordgap.analysis.report`) and the
caption of each figure in Snakemake's HTML report. How a figure is drawn is its entry in
:mod:`coordgap.analysis.figures`, under the same name.

The Snakefile reads this module while it parses, so it imports nothing beyond the standard
library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclass(frozen=True)
class FigureSpec:
    """One figure of the statistics tables.

    Attributes:
        name: The figure's name: its rule is ``plot_<name>``, its files
            ``results/figures/<name>[_<variant>].{png,pdf,csv}``.
        table: The table it is drawn from, ``results/stats/<table>.csv``.
        per_variant: Whether it is drawn once per configured reward variant.
        label: Its name in Snakemake's report, the same for every variant.
        title: Its heading in ``results/report.md``; ``{variant}`` stands for the variant.
        caption: What it shows, under the figure in both reports.
    """

    name: str
    table: str
    per_variant: bool
    label: str
    title: str
    caption: str

    @property
    def stem(self) -> str:
        """The file stem, with the ``{variant}`` wildcard of a per-variant figure."""
        return f"{self.name}_{{variant}}" if self.per_variant else self.name

    def stems(self, variants: Sequence[str]) -> list[str]:
        """The file stems of the figure for the configured reward variants.

        Args:
            variants: The configured reward variants.

        Returns:
            One stem per variant for a per-variant figure, else its one stem.
        """
        return [self.stem.format(variant=v) for v in variants] if self.per_variant else [self.stem]


STATISTICS_FIGURES = (
    FigureSpec(
        name="reward",
        table="summary",
        per_variant=True,
        label="reward by model and N",
        title="Mean `{variant}` reward by model and N",
        caption="Each model's mean episode reward with its 95% interval (Wilson's when every "
        "reward is 0 or 1, the percentile bootstrap's otherwise), side by side at each table size.",
    ),
    FigureSpec(
        name="deadlock",
        table="summary",
        per_variant=False,
        label="deadlock rate by model and N",
        title="Deadlock rate by model and N",
        caption="The share of episodes that deadlocked, with Wilson score intervals.",
    ),
    FigureSpec(
        name="reward_vs_meals",
        table="episode_rewards",
        per_variant=True,
        label="reward against meals",
        title="`{variant}` reward against meals, per episode",
        caption="Every episode as one mark; the shaded band holds episodes without a meal and "
        "the dashed line the best score reached without one. Marks on that line at zero meals "
        "are the degenerate maximum: the score of not playing.",
    ),
    FigureSpec(
        name="components",
        table="components",
        per_variant=True,
        label="reward by term",
        title="`{variant}` reward by term",
        caption="Each model's mean reward split into its signed, weighted terms: rewards "
        "stacked up from zero, penalties down; the diamond is their sum, the mean reward.",
    ),
    FigureSpec(
        name="meals_by_seat",
        table="seats",
        per_variant=False,
        label="meals by seat",
        title="Meals by seat",
        caption="Mean meals per episode at each seat with bootstrap intervals: the audit of "
        "tie-breaks and of seat-dependent policies (equal under a symmetric policy with random "
        "tie-breaks).",
    ),
)
"""Every figure of the statistics tables, in the report's order."""


def figure_spec(name: str) -> FigureSpec:
    """The entry of the figure called ``name``.

    Args:
        name: One of the names of ``STATISTICS_FIGURES``.

    Returns:
        Its entry.

    Raises:
        ValueError: No figure has that name.
    """
    for spec in STATISTICS_FIGURES:
        if spec.name == name:
            return spec
    known = ", ".join(spec.name for spec in STATISTICS_FIGURES)
    raise ValueError(f"unknown figure {name!r}; the figures are {known}")


def figure_catalog(variants: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Give every figure of the report, by file stem, its title and caption, in report order.

    Args:
        variants: The configured reward variants.

    Returns:
        ``{stem: (title, caption)}``, one stem per variant for a per-variant figure.
    """
    return {
        stem: (spec.title.format(variant=variant), spec.caption)
        for spec in STATISTICS_FIGURES
        for stem, variant in zip(
            spec.stems(variants), variants if spec.per_variant else [None], strict=True
        )
    }
