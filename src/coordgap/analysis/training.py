"""The training curve of a GRPO run and its checkpoint selection, as a figure and a report part.

The curve comes from ``results/eval/<run>/selection.json``: it holds every step's training
estimate (the rollouts that checkpoint played) and validation estimate (its validation
episodes), with their intervals, and each selection policy's choice and runner-up. What the
updates did to the policy comes from the run's ``history.parquet``: the rollouts' choices, the
entropy of the six-way policy that drew them, the probe set's KL from the untrained policy and
the share of rows whose gradient the clip cut.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from coordgap.analysis.style import (
    COLOURS,
    HATCHES,
    LINESTYLES,
    MARKERS,
    marks,
    save_figure,
    styled,
)
from coordgap.env.protocols import Tool

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.axes import Axes

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


def policy_by_checkpoint(history: pl.DataFrame) -> pl.DataFrame:
    """What each checkpoint's policy did, from a run's history, one row per checkpoint.

    A history row ``k`` describes the rollouts checkpoint ``k`` played and the update that
    made checkpoint ``k + 1``: its choices and entropy belong to checkpoint ``k``, its probe
    to checkpoint ``k + 1``, its clipped share to the update after checkpoint ``k``.

    Args:
        history: A run's ``history.parquet``.

    Returns:
        ``step`` (the checkpoint), the tools' ``actions_*`` shares that were ever non-zero,
        ``entropy_mean``, the rollouts' ``meals_mean``, ``both_forks_mean`` (rounds ending
        ready to eat) and ``deadlock_rate``, the share of
        their groups with a training signal (``trainable_share``: rewards not all equal),
        ``clipped_share``, ``probe_kl`` and ``probe_kl_acting`` (null where not measured).
    """
    actions = [
        f"actions_{tool}" for tool in Tool if history[f"actions_{tool}"].fill_null(0).sum() > 0
    ]
    trainable = pl.when(pl.col("groups") > 0).then(pl.col("groups_trainable") / pl.col("groups"))
    played = history.select(
        "step",
        *actions,
        "entropy_mean",
        "meals_mean",
        "both_forks_mean",
        "deadlock_rate",
        trainable.alias("trainable_share"),
        "clipped_share",
    )
    probed = history.select((pl.col("step") + 1).alias("step"), "probe_kl", "probe_kl_acting")
    return played.join(probed, on="step", how="full", coalesce=True).sort("step")


def training_figure(
    selection: dict[str, Any], history: pl.DataFrame
) -> tuple[Figure, pl.DataFrame]:
    """The training and validation reward with the choices above; what the policy did below.

    Below, per checkpoint: the rollouts' choices, the meals and deadlocks they came to (what
    the reward is made of), the policy's entropy and its probe KL from the untrained policy.

    Args:
        selection: A run's selection (``read_selection``).
        history: The run's ``history.parquet``.

    Returns:
        The figure and the data it draws, one row per checkpoint.
    """
    data = curve(selection)
    policy = policy_by_checkpoint(history)
    figure = Figure(figsize=(11.0, 6.0), layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(2, 4, height_ratios=(1.3, 1.0))
    axes = figure.add_subplot(grid[0, :])
    _reward_panel(axes, selection, data)
    _actions_panel(figure.add_subplot(grid[1, 0]), policy)
    panels = {
        "the checkpoint's rollouts": {
            "meals_mean": "meals per episode",
            "both_forks_mean": "rounds ready to eat per episode",
            "deadlock_rate": "deadlock rate",
            "trainable_share": "groups trainable",
        },
        "mean entropy of mu (nats)": {"entropy_mean": "rollouts"},
        "probe KL(mu || mu_0), nats": {"probe_kl": "float32", "probe_kl_acting": "as it acts"},
    }
    for column, (label, series) in enumerate(panels.items(), start=1):
        panel = figure.add_subplot(grid[1, column])
        for index, (key, name) in enumerate(series.items()):
            rows = policy.drop_nulls(key)
            panel.plot(
                rows["step"],
                rows[key],
                color=COLOURS[index],
                marker=MARKERS[index],
                linestyle=LINESTYLES[index],
                label=name,
            )
        panel.set_xlim(policy["step"].min() - 0.5, policy["step"].max() + 0.5)
        panel.xaxis.set_major_locator(MaxNLocator(integer=True))
        panel.set_xlabel("checkpoint")
        panel.set_ylabel(label)
        if len(series) > 1:
            # Headroom above the lines for the legend, so that it covers none of them.
            top = policy.select(pl.max_horizontal(pl.col(*series).max())).item() or 0
            panel.set_ylim(0, 1.7 * top if top > 0 else 1)
            panel.legend(loc="upper left", fontsize=6)
    figure.suptitle(_title(selection["run"], history), fontsize=9)
    return figure, data.join(policy, on="step", how="full", coalesce=True).sort("step")


def training_signal(history: pl.DataFrame) -> str:
    """What a run's rollouts gave it to learn from: trainable groups, meals, readiness to eat.

    Args:
        history: The run's ``history.parquet``.

    Returns:
        E.g. ``3 of 6 groups trainable; 0 meals and 12 rounds ready to eat in 18 rollout
        episodes``, and a warning when no group was trainable: no update changed the adapter.
    """
    meals, ready = history.select(
        (pl.col(column) * pl.col("episodes")).sum() for column in ("meals_mean", "both_forks_mean")
    ).row(0)
    trainable = history["groups_trainable"].sum()
    signal = (
        f"{trainable} of {history['groups'].sum()} groups trainable; {meals:.0f} meals and "
        f"{ready:.0f} rounds ready to eat in {history['episodes'].sum()} rollout episodes"
    )
    if trainable == 0:
        signal += " (no training signal: every group's rewards were equal, nothing was learnt)"
    return signal


def _title(run: str, history: pl.DataFrame) -> str:
    """The run with what its rollouts gave it to learn from, and how hard the clip cut."""
    parts = [training_signal(history)]
    clipped = history.drop_nulls("clipped_share")["clipped_share"]
    if clipped.len():
        parts.append(f"the gradient clip cut {clipped.mean():.0%} of the update rows")
    return f"{run}: " + "; ".join(parts)


def _actions_panel(axes: Axes, policy: pl.DataFrame) -> None:
    """The rollouts' choices of each checkpoint, as stacked shares."""
    bottom = [0.0] * policy.height
    columns = [c for c in policy.columns if c.startswith("actions_")]
    for index, column in enumerate(columns):
        shares = policy[column].fill_null(0).to_list()
        axes.bar(
            policy["step"],
            shares,
            bottom=bottom,
            color=COLOURS[index % len(COLOURS)],
            hatch=HATCHES[index % len(HATCHES)],
            edgecolor="white",
            linewidth=0.5,
            label=column.removeprefix("actions_"),
        )
        bottom = [b + v for b, v in zip(bottom, shares, strict=True)]
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("checkpoint")
    axes.set_ylabel("share of rollout decisions")
    # Headroom above the bars for the legend, so that it covers none of them.
    axes.set_ylim(0, 1.4)
    axes.set_yticks([0, 0.25, 0.5, 0.75, 1])
    axes.legend(loc="upper center", fontsize=6, ncols=2)


def _reward_panel(axes: Axes, selection: dict[str, Any], data: pl.DataFrame) -> None:
    """The training and validation reward per checkpoint, the peak and each selection."""
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
    axes.set_title("training and validation reward")
    axes.legend(loc="best")


def write_training_figure(
    selection_json: str | Path,
    history: str | Path,
    png: str | Path,
    pdf: str | Path,
    csv: str | Path,
) -> None:
    """Draw a run's training figure from its selection and history; write it with its data."""
    with styled():
        figure = training_figure(read_selection(selection_json), pl.read_parquet(history))
        save_figure(*figure, png, pdf, csv)


def _estimate(estimate: dict[str, Any] | None) -> str:
    if estimate is None:
        return "—"
    if estimate["ci_low"] is None:
        return f"{estimate['mean']:.3f} (step {estimate['step']})"
    return (
        f"{estimate['mean']:.3f} [{estimate['ci_low']:.3f}, {estimate['ci_high']:.3f}] "
        f"(step {estimate['step']})"
    )


def _step(step: int) -> str:
    return "0 (the untrained adapter)" if step == 0 else str(step)


def selection_section(
    selections: Sequence[dict[str, Any]],
    figures: Sequence[str],
    histories: Sequence[pl.DataFrame],
) -> str:
    """The report's part on training and checkpoint selection.

    Args:
        selections: Every run's selection.
        figures: The relative links of their training figures, in the same order.
        histories: Their ``history.parquet`` tables, in the same order: each run's training
            signal (:func:`training_signal`).

    Returns:
        Markdown.
    """
    parts = [
        "## Training and checkpoint selection\n\n"
        "Each run's checkpoints played validation scenarios (disjoint from the training and "
        "test scenarios); every selection policy's checkpoint then played the test grid as a "
        "model named `<run>@<policy>`, compared above with the base model and with `last`. "
        "Estimates are mean rewards under the trained variant with the statistics' intervals "
        "(Wilson's where every reward is 0 or 1, the bootstrap's otherwise). A policy that "
        "chose step 0 kept the untrained adapter: its model is the base model."
    ]
    for selection, link, history in zip(selections, figures, histories, strict=True):
        rows = [
            f"| {policy} | {_step(choice['step'])} | {_estimate(choice['estimate'])} | "
            f"{_estimate(choice['runner_up'])} |"
            for policy, choice in selection["choices"].items()
        ]
        parts.append(
            f"### {selection['run']}\n\n![training curve of {selection['run']}]({link})\n\n"
            f"Training signal: {training_signal(history)}.\n\n"
            "| policy | step | estimate | runner-up |\n| --- | --- | --- | --- |\n"
            + "\n".join(rows)
        )
    return "\n\n".join(parts)


# What an arm's figure overlays seed by seed, by history column: each panel's label.
ARM_PANELS = {
    "reward_mean": "reward trained on",
    "meals_mean": "meals per episode",
    "both_forks_mean": "rounds ready to eat per episode",
    "deadlock_rate": "deadlock rate",
    "trainable_share": "groups trainable",
}


def arm_figure(arm: str, histories: dict[str, pl.DataFrame]) -> tuple[Figure, pl.DataFrame]:
    """An arm's seeds over training, overlaid: what each seed's rollouts did, step by step.

    The first panel stacks the six-way choices of the rollouts, averaged over seeds; each other
    panel draws every seed's curve thin and their mean thick (``ARM_PANELS``).

    Args:
        arm: The arm's name.
        histories: Its runs' ``history.parquet`` tables, by run (each run one seed).

    Returns:
        The figure and the data it draws: one row per run and step, with ``run``.
    """
    data = pl.concat(
        [_seed_rows(run, history) for run, history in histories.items()],
        how="diagonal_relaxed",
    )
    data = data.with_columns(pl.col("^actions_.*$").fill_null(0.0))
    actions = [c for c in data.columns if c.startswith("actions_")]
    mean = data.group_by("step").agg(pl.col(*actions, *ARM_PANELS).mean()).sort("step")
    figure = Figure(figsize=(11.0, 5.2), layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(2, 3)
    _actions_panel(figure.add_subplot(grid[0, 0]), mean.select("step", *actions))
    cells = [grid[row, column] for row in range(2) for column in range(3)][1:]
    for cell, (column, label) in zip(cells, ARM_PANELS.items(), strict=True):
        panel = figure.add_subplot(cell)
        for index, (run, rows) in enumerate(data.partition_by("run", as_dict=True).items()):
            panel.plot(
                rows["step"],
                rows[column],
                color=COLOURS[1 + index % (len(COLOURS) - 1)],
                marker=MARKERS[1 + index % (len(MARKERS) - 1)],
                linewidth=0.8,
                markersize=3,
                label=run[0],
            )
        panel.plot(mean["step"], mean[column], color=COLOURS[0], linewidth=2.2, label="mean")
        panel.xaxis.set_major_locator(MaxNLocator(integer=True))
        panel.set_xlabel("checkpoint")
        panel.set_ylabel(label)
    figure.axes[1].legend(loc="best", fontsize=6)
    runs = ", ".join(histories)
    figure.suptitle(
        f"{arm}: {len(histories)} seeds ({runs}), each thin, their mean thick", fontsize=9
    )
    return figure, data.sort("run", "step")


def _seed_rows(run: str, history: pl.DataFrame) -> pl.DataFrame:
    """What one seed's rollouts did at each checkpoint that played them, with its reward."""
    played = policy_by_checkpoint(history).join(
        history.select("step", "reward_mean"), on="step", how="inner"
    )
    actions = [column for column in played.columns if column.startswith("actions_")]
    return played.select(pl.lit(run).alias("run"), "step", *actions, *ARM_PANELS)


def write_arm_figure(
    arm: str, histories: dict[str, str | Path], png: str | Path, pdf: str | Path, csv: str | Path
) -> None:
    """Draw an arm's figure from its runs' histories; write it with its data."""
    with styled():
        figure = arm_figure(arm, {run: pl.read_parquet(path) for run, path in histories.items()})
        save_figure(*figure, png, pdf, csv)
