"""The training curve of a GRPO run and its checkpoint selection, as a figure and a report part.

Both read ``results/eval/<run>/selection.json`` alone: it holds every step's training
estimate (the rollouts that checkpoint played) and validation estimate (its validation
episodes), with their intervals, and each selection policy's choice and runner-up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from matplotlib.ticker import MaxNLocator

from coordgap.analysis.style import LINESTYLES, marks, new_figure, save_figure, styled

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.figure import Figure

CURVE_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    **{
        f"{split}_{stat}": pl.Float64()
        for split in ("training", "validation")
        for stat in ("mean", "ci_low", "ci_high")
    },
    "episodes_training": pl.Int64(),
    "episodes_validation": pl.Int64(),
}


def read_selection(path: str | Path) -> dict[str, Any]:
    """A run's ``selection.json``."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def curve(selection: dict[str, Any]) -> pl.DataFrame:
    """Every step's training and validation estimate, one row per step (null where none)."""
    rows: dict[int, dict[str, Any]] = {}
    for split in ("training", "validation"):
        for estimate in selection[split]:
            row = rows.setdefault(estimate["step"], {"step": estimate["step"]})
            row |= {f"{split}_{k}": estimate[k] for k in ("mean", "ci_low", "ci_high")}
            row[f"episodes_{split}"] = estimate["episodes"]
    return pl.DataFrame([rows[step] for step in sorted(rows)], schema=CURVE_SCHEMA)


def training_figure(selection: dict[str, Any]) -> tuple[Figure, pl.DataFrame]:
    """The training reward per step with its band, the validation curve, and the choices.

    Args:
        selection: A run's selection (``read_selection``).

    Returns:
        The figure and the curve it draws.
    """
    data = curve(selection)
    figure, (axes,) = new_figure(6.0, 3.2)
    styles = marks(["training", "validation"])
    for split in ("training", "validation"):
        rows = data.drop_nulls(f"{split}_mean")
        mark = styles[split]
        axes.plot(
            rows["step"],
            rows[f"{split}_mean"],
            color=mark.colour,
            marker=mark.marker,
            linestyle=mark.linestyle if split == "training" else "--",
            label=f"{split} reward (95% CI band)",
        )
        bounded = rows.drop_nulls(f"{split}_ci_low")
        axes.fill_between(
            bounded["step"],
            bounded[f"{split}_ci_low"],
            bounded[f"{split}_ci_high"],
            color=mark.colour,
            alpha=0.15,
            hatch=None if split == "training" else "//",
            linewidth=0,
        )
    peak = max(selection["training"], key=lambda e: (e["mean"], -e["step"]), default=None)
    if peak is not None:
        axes.axvline(peak["step"], color="0.3", linestyle=":", linewidth=1)
        axes.annotate(
            "training peak",
            (peak["step"], 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
        )
    for index, (policy, choice) in enumerate(selection["choices"].items()):
        axes.axvline(
            choice["step"],
            color="0.5",
            linestyle=LINESTYLES[(index + 1) % len(LINESTYLES)],
            linewidth=1,
            label=f"{policy}: step {choice['step']}",
        )
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("checkpoint (training step)")
    axes.set_ylabel(f"mean reward ({selection['reward']['variant']})")
    axes.set_title(f"{selection['run']}: training and validation reward")
    axes.legend(loc="best")
    return figure, data


def write_training_figure(
    selection_json: str | Path, png: str | Path, pdf: str | Path, csv: str | Path
) -> None:
    """Draw a run's training curve from its selection and write it with its data."""
    with styled():
        save_figure(*training_figure(read_selection(selection_json)), png, pdf, csv)


def _estimate(estimate: dict[str, Any] | None) -> str:
    if estimate is None:
        return "—"
    if estimate["ci_low"] is None:
        return f"{estimate['mean']:.3f} (step {estimate['step']})"
    return (
        f"{estimate['mean']:.3f} [{estimate['ci_low']:.3f}, {estimate['ci_high']:.3f}] "
        f"(step {estimate['step']})"
    )


def selection_section(selections: Sequence[dict[str, Any]], figures: Sequence[str]) -> str:
    """The report's part on training and checkpoint selection.

    Args:
        selections: Every run's selection.
        figures: The relative links of their training figures, in the same order.

    Returns:
        Markdown.
    """
    parts = [
        "## Training and checkpoint selection\n\n"
        "Each run's checkpoints played validation scenarios (disjoint from the training and "
        "test scenarios); every selection policy's checkpoint then played the test grid as a "
        "model named `<run>@<policy>`, compared above with the base model and with `last`. "
        "Estimates are mean rewards under the trained variant with 95% bootstrap intervals."
    ]
    for selection, link in zip(selections, figures, strict=True):
        rows = [
            f"| {policy} | {choice['step']} | {_estimate(choice['estimate'])} | "
            f"{_estimate(choice['runner_up'])} |"
            for policy, choice in selection["choices"].items()
        ]
        parts.append(
            f"### {selection['run']}\n\n![training curve of {selection['run']}]({link})\n\n"
            "| policy | step | estimate | runner-up |\n| --- | --- | --- | --- |\n"
            + "\n".join(rows)
        )
    return "\n\n".join(parts)
