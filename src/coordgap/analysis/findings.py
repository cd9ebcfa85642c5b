"""The report's opening: what the numbers say, in a few sentences and one small table.

Every sentence is generated from the statistics tables and the checkpoint selections, never
written by hand, so a run that finds nothing says so. The findings, in order:

* **positive control**, first, where the study has one (``analysis.control``): whether
  training moved the control arm's exact expected reward, the share of seats whose round-1
  decision reaches for the right fork, by the stated threshold in every seed
  (:mod:`coordgap.analysis.control`). If it did not, the study's training could not move the
  model the way a reward asks, and every null result below reads as "not trained enough". The
  control arm is in no other finding: the statistics tables below do not include it;
* **cell sizes**: the smallest cell, the smallest effect a comparison at that size detects (from
  the power table), and which models' cells are below :data:`SMALL_CELL` episodes, whose
  numbers are a smoke run of the machinery rather than an estimate;
* **errors**: the cells with error episodes, if any;
* **deadlock**: which models deadlock in every episode, in some, or never;
* **degenerate maximum**: which models score near the paper reward's maximum without eating
  (the ``degenerate`` monitor), i.e. where that reward cannot tell idling from coordination;
* **training**: each selected checkpoint against its base model under the headline reward,
  and whether any difference survives Holm's correction at the configured alpha;
* **checkpoints**: the step each selection policy chose, naming step 0 as the untrained
  adapter (a LoRA whose B matrices are zero: the base model itself);
* **seeds**: where the study compares arms seed by seed (``analysis.seed_comparisons``, its
  primary family), which pairs survive Holm's correction under the headline reward, the
  largest difference, and the smallest one the pooled episodes could detect: what a null
  result rules out.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import polars as pl

from coordgap.analysis.monitors import MONITORS
from coordgap.analysis.stats import SMALL_CELL, reward_columns

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from coordgap.env.variants import RewardVariant

# The suffix of the comparison families that set a selected checkpoint against its base model
# (coordgap.config.training.checkpoint_families).
_VERSUS_BASE = ": selected vs base"
# Checkpoint 0 is saved before the first update: a LoRA whose B matrices are zero.
_UNTRAINED = " (the untrained adapter: this policy's model is the base model)"


def _names(models: Sequence[str]) -> str:
    return ", ".join(f"`{model}`" for model in models)


def _range(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    low, high = min(values), max(values)
    return fmt(low) if fmt(low) == fmt(high) else f"{fmt(low)} to {fmt(high)}"


def _rate(value: float) -> str:
    return f"{value:.2f}"


def _cell_sizes(summary: pl.DataFrame, power: pl.DataFrame) -> str:
    played = summary.filter(pl.col("episodes") > 0)
    if played.is_empty():
        return "**Cell sizes.** No cell has an episode that ended without an error."
    smallest = int(played["episodes"].min())
    text = f"**Cell sizes.** Cells hold {_range(played['episodes'].to_list(), str)} episodes."
    design = power.filter(pl.col("design") == "ours", pl.col("episodes_per_cell") == smallest)
    if not design.is_empty():
        row = design.row(0, named=True)
        text += (
            f" At {smallest} episodes per cell a two-sample comparison detects only "
            f"|g| ≥ {row['detectable_effect']:.2f} with power {row['target_power']:g} "
            f"(alpha {row['alpha']:g}); smaller effects are indistinguishable from noise here."
        )
    small = played.filter(pl.col("episodes") < SMALL_CELL)["model"].unique(maintain_order=True)
    if small.len():
        text += (
            f" Cells below {SMALL_CELL} episodes ({_names(small.to_list())}) are a smoke run of "
            "the machinery: read their numbers as a check that the pipeline runs, not as "
            "estimates."
        )
    return text


def _deadlock(summary: pl.DataFrame) -> str:
    rates = (
        summary.filter(pl.col("episodes") > 0)
        .group_by("model", maintain_order=True)
        .agg(pl.col("deadlock_rate"))
    )
    always, sometimes, never = [], [], []
    for model, values in rates.iter_rows():
        if min(values) == 1.0:
            always.append(f"`{model}`")
        elif max(values) == 0.0:
            never.append(f"`{model}`")
        else:
            sometimes.append(f"`{model}` ({_range(values, _rate)})")
    parts = [
        f"{label}: {', '.join(models)}"
        for label, models in (
            ("in every episode at every N", always),
            ("in some episodes (rate over N)", sometimes),
            ("never", never),
        )
        if models
    ]
    if not parts:
        return "**Deadlock.** No cell has an ok episode."
    text = "; ".join(parts)
    return f"**Deadlock.** {text[0].upper()}{text[1:]}."


def _errors(summary: pl.DataFrame) -> str | None:
    cells = summary.filter(pl.col("errors") > 0)
    if cells.is_empty():
        return None
    counts = "; ".join(
        f"`{row['model']}` N={row['n']}: {row['errors']} of {row['errors'] + row['episodes']}"
        for row in cells.iter_rows(named=True)
    )
    return f"**Errors.** Episodes that ended in an error, left out of every statistic: {counts}."


def _degenerate(monitors: pl.DataFrame, degenerate_reward: float) -> str:
    flagged = monitors.filter(pl.col("degenerate"))["model"].unique(maintain_order=True)
    if not flagged.len():
        return (
            "**Degenerate maximum.** No model's cells score at least "
            f"{degenerate_reward:g} under the paper reward without a meal."
        )
    return (
        f"**Degenerate maximum.** {_names(flagged.to_list())} score at least "
        f"{degenerate_reward:g} under the paper reward in episodes without a single meal (the "
        "`degenerate` monitor): there, that reward cannot tell idling from coordination."
    )


def _chosen_steps(selections: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Each selected checkpoint's model name (``<run>@<policy>``) and the step it chose."""
    return {
        f"{selection['run']}@{policy}": choice["step"]
        for selection in selections
        for policy, choice in selection["choices"].items()
    }


def _training(
    comparisons: pl.DataFrame,
    variant: RewardVariant,
    alpha: float,
    steps: dict[str, int],
) -> str:
    rows = comparisons.filter(
        pl.col("family").str.ends_with(_VERSUS_BASE), pl.col("variant") == str(variant)
    )
    if rows.is_empty():
        return "**Training.** No trained checkpoint was compared with its base model."
    effects = []
    distinguishable = []
    for row in rows.iter_rows(named=True):
        if row["diff"] is None or math.isnan(row["diff"]):
            continue
        holm = "n/a" if row["p_holm"] is None else f"{row['p_holm']:.2g}"
        effect = f"`{row['model_a']}` N={row['n']}: {row['diff']:+.3f} (Holm p {holm})"
        if steps.get(row["model_a"]) == 0:
            effect += ", the untrained adapter"
        effects.append(effect)
        if row["p_holm"] is not None and row["p_holm"] < alpha:
            distinguishable.append(effect)
    verdict = (
        f"Differences that survive Holm's correction at alpha {alpha:g}: "
        + "; ".join(distinguishable)
        if distinguishable
        else f"None survives Holm's correction at alpha {alpha:g}: at these cell sizes training "
        "is not distinguishable from noise."
    )
    return (
        f"**Training.** Each selected checkpoint minus its base model, `{variant}` reward: "
        + "; ".join(effects)
        + f". {verdict}"
    )


def _gain(row: dict[str, Any]) -> str:
    """A seed's gain, or why it has none."""
    if row["step"] is None:
        return "no test episode to name its checkpoint"
    return "not measured" if row["gain"] is None else f"{row['gain']:+.2f}"


def _control(control: pl.DataFrame) -> str:
    seeds = control.filter(pl.col("level") == "seed")
    arm = control.filter(pl.col("level") == "arm").row(0, named=True)
    base = "value (not measured)" if arm["model_exact"] is None else f"{arm['model_exact']:.2f}"
    share = (
        f"at N={arm['n']} the expected share of seats whose round-1 decision reaches for the "
        f"right fork under `{arm['name']}`, computed exactly from each seed's adapter, gained"
    )
    threshold = f"threshold +{arm['min_gain']:.2f}, stated before the run"
    if arm["passed"]:
        gains = _range(seeds["gain"].to_list(), lambda v: f"{v:+.2f}")
        return (
            f"**Positive control.** The positive control moved: {share} {gains} over "
            f"`{arm['model']}`'s {base} in all {seeds.height} seeds ({threshold}). The study's "
            "training budget can move the model, so a null result below is about what its arms "
            "reward, not a budget too small to move anything."
        )
    failed = [row for row in seeds.iter_rows(named=True) if not row["passed"]]
    missed = "; ".join(f"`{row['name']}` {_gain(row)}" for row in failed)
    return (
        f"**Positive control.** The positive control did not move: {share} less than the "
        f"threshold over `{arm['model']}`'s {base} in {len(failed)} of {seeds.height} seeds "
        f"({missed}; {threshold}). The study's training could not move the model the way its "
        "reward asks (it may have moved it elsewhere: the runs' probe KL says how far), so its "
        "null results read as 'not trained enough', not as 'GRPO cannot'."
    )


def _checkpoints(selections: Sequence[dict[str, Any]]) -> str:
    parts = []
    for selection in selections:
        chosen = [
            f"`{policy}` step {choice['step']}" + (_UNTRAINED if choice["step"] == 0 else "")
            for policy, choice in selection["choices"].items()
        ]
        parts.append(f"`{selection['run']}`: " + ", ".join(chosen))
    return "**Checkpoints chosen.** " + "; ".join(parts) + "."


def _seeds(seed_comparisons: pl.DataFrame, variant: RewardVariant, alpha: float) -> str | None:
    rows = seed_comparisons.filter(pl.col("variant") == str(variant), pl.col("diff").is_not_nan())
    if rows.is_empty():
        return None
    survivors = [
        f"{row['a']} vs {row['b']} N={row['n']}: {row['diff']:+.3f} (Holm p {row['p_holm']:.2g})"
        for row in rows.iter_rows(named=True)
        if row["p_holm"] is not None and row["p_holm"] < alpha
    ]
    largest = rows.sort(pl.col("diff").abs(), descending=True).row(0, named=True)
    verdict = (
        f"Pairs that survive Holm's correction at alpha {alpha:g}: " + "; ".join(survivors)
        if survivors
        else f"No pair survives Holm's correction at alpha {alpha:g}"
    )
    detectable = rows["pooled_detectable_diff"].drop_nans().drop_nulls()
    bound = (
        "; a two-sample t-test of the pooled episodes (at `analysis.power`'s alpha and power) "
        f"detects differences of {_range(detectable.to_list(), lambda v: f'{v:.2f}')} or more, "
        "so smaller effects could go unseen"
        if not detectable.is_empty()
        else ""
    )
    return (
        f"**Seeds.** The study's primary family (seeds as the unit, `{variant}` reward, "
        f"{rows.height} pairs). {verdict}. The largest difference is {largest['a']} vs "
        f"{largest['b']} at N={largest['n']}: {largest['diff']:+.3f}{bound}."
    )


def _by_n(rows: pl.DataFrame, sizes: Sequence[int], column: str) -> str:
    values = dict(zip(rows["n"], rows[column], strict=True))
    return " / ".join(
        "—" if values.get(n) is None or math.isnan(values[n]) else f"{values[n]:.2f}" for n in sizes
    )


def _table(summary: pl.DataFrame, monitors: pl.DataFrame, variant: RewardVariant) -> str:
    sizes = sorted(summary["n"].unique().to_list())
    columns = " / ".join(str(n) for n in sizes)
    mean = reward_columns(variant)[0]
    flags = monitors.group_by("model", maintain_order=True).agg(
        [pl.col(name).any() for name in MONITORS]
    )
    flagged = {row["model"]: [m for m in MONITORS if row[m]] for row in flags.iter_rows(named=True)}
    lines = [
        f"| Model | Episodes per cell | Deadlock rate (N = {columns}) | `{variant}` reward "
        f"(N = {columns}) | Flagged |",
        "| --- | --- | --- | --- | --- |",
    ]
    for (model,), rows in summary.group_by("model", maintain_order=True):
        episodes = rows["episodes"]
        count = _range(episodes.to_list(), str)
        if int(episodes.max()) == 0:
            count += " (errors only)"
        elif int(episodes.min()) < SMALL_CELL:
            count += " (smoke)"
        lines.append(
            f"| {model} | {count} | {_by_n(rows, sizes, 'deadlock_rate')} | "
            f"{_by_n(rows, sizes, mean)} | {', '.join(flagged.get(model, []))} |"
        )
    return "\n".join(lines)


def findings_section(
    summary: pl.DataFrame,
    comparisons: pl.DataFrame,
    monitors: pl.DataFrame,
    power: pl.DataFrame,
    selections: Sequence[dict[str, Any]],
    *,
    variant: RewardVariant,
    alpha: float,
    degenerate_reward: float,
    seed_comparisons: pl.DataFrame | None = None,
    control: pl.DataFrame | None = None,
) -> str:
    """The report's Findings: a few generated sentences and a per-model table.

    Args:
        summary: The summary table (:func:`coordgap.analysis.stats.summarize`).
        comparisons: The comparisons table, with the checkpoint families.
        monitors: The monitors table.
        power: The power table (its ``ours`` rows give each cell size's detectable effect).
        selections: Every training run's selection, in config order.
        variant: The headline reward variant (the first configured; never ``control``).
        alpha: The comparisons' significance level.
        degenerate_reward: The ``degenerate`` monitor's reward threshold.
        seed_comparisons: The seed-level comparisons, where the study trains several seeds.
        control: The positive control's check (``coordgap.analysis.control``), where the study
            has one: its outcome is the first finding.

    Returns:
        Markdown, starting with its heading.
    """
    findings = [
        *([_control(control)] if control is not None else []),
        _cell_sizes(summary, power),
        *filter(None, [_errors(summary)]),
        _deadlock(summary),
        _degenerate(monitors, degenerate_reward),
    ]
    if selections:
        findings += [
            _training(comparisons, variant, alpha, _chosen_steps(selections)),
            _checkpoints(selections),
        ]
    if seed_comparisons is not None:
        findings += filter(None, [_seeds(seed_comparisons, variant, alpha)])
    return (
        "## Findings\n\nGenerated from the tables below; the method and setup are at the end.\n\n"
        + "\n".join(f"- {finding}" for finding in findings)
        + "\n\n"
        + _table(summary, monitors, variant)
    )
