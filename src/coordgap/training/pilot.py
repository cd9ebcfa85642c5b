"""The learning-rate pilot: an arm's recipe briefly trained at each rate, and the rule that picks.

The rule (``apply_rule``) is stated before the pilot runs. Each rate's run is the recipe with
only ``learning_rate`` and ``steps`` replaced. Its name and seed stay the recipe's: a run's
rollouts and the order of its update's rows derive from (seed, run name, step), so every rate
plays the same step-0 rollouts from the same untrained adapter, and the rates differ by the
learning rate alone. Its outputs, in ``coordgap.training.loop``'s layout, go to
``<root>/pilot-<arm>-lr<rate>/``; a killed pilot resumes the rate it was training and keeps the
rates it had finished (README.md: Choosing the learning rate: the pilot).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from coordgap.resume import write_text_atomic
from coordgap.training.loop import RunOutputs, run_fingerprint, train_run

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from coordgap.config.play import EnvironmentConfig, ModelSpec
    from coordgap.config.training import PilotConfig, TrainingRunConfig
    from coordgap.env.observation import PromptTemplates
    from coordgap.env.protocols import Tool

logger = logging.getLogger(__name__)

# Beside a finished rate's outputs: the fingerprint it was trained with (``run_fingerprint``),
# so that a rerun keeps the rate only if nothing its outputs depend on has changed.
TRAINED_WITH = "trained_with.json"
# What the rule reads of each step, and what shows how the step went.
MEASURES = ("probe_kl", "probe_kl_acting", "ratio_log_mean", "clipped_share")


@dataclass(frozen=True, slots=True)
class PilotChoice:
    """The pilot's verdict.

    Attributes:
        learning_rate: The rate the study should train at.
        passed: Whether it kept the rule; False when no rate did and the smallest is chosen.
    """

    learning_rate: float
    passed: bool


def pilot_run_folder(arm: str, learning_rate: float) -> str:
    """The folder of one rate's run: ``pilot-<arm>-lr<rate>`` (``pilot-paper-lr5e-06``)."""
    return f"pilot-{arm}-lr{learning_rate:g}"


def pilot_runs(pilot: PilotConfig, recipe: TrainingRunConfig) -> dict[str, TrainingRunConfig]:
    """Each rate's run by its folder, in ascending rate order (see the module docstring)."""
    return {
        pilot_run_folder(pilot.arm, rate): dataclasses.replace(
            recipe, learning_rate=rate, steps=pilot.steps
        )
        for rate in pilot.learning_rates
    }


def train_pilot(
    pilot: PilotConfig,
    recipe: TrainingRunConfig,
    base: ModelSpec,
    weights: Path,
    env: EnvironmentConfig,
    templates: PromptTemplates,
    base_seed: int,
    first_scenario: int,
    root: Path,
    max_error_share: float = 0.0,
) -> dict[float, pl.DataFrame]:
    """Train the recipe at each rate in turn, skipping rates already trained as they are now.

    Args:
        pilot: The pilot.
        recipe: The arm's run whose recipe each rate trains.
        base: The base model's entry.
        weights: Its prepared weights folder.
        env: The table rules.
        templates: Prompt templates.
        base_seed: The config's seed.
        first_scenario: The first training scenario id (``scenarios.train``).
        root: The folder of the rates' runs.
        max_error_share: As for ``train_run``.

    Returns:
        Each rate's history table, by rate.
    """
    histories = {}
    for folder, run in pilot_runs(pilot, recipe).items():
        outputs = RunOutputs(root / folder, run.steps)
        fingerprint = run_fingerprint(run, base, env, base_seed, first_scenario)
        marker = outputs.root / TRAINED_WITH
        if marker.exists() and marker.read_text() == fingerprint:
            logger.info("%s: trained already", folder)
        else:
            # Gone before the outputs change, so that a run killed while it publishes is
            # never taken for the finished one.
            marker.unlink(missing_ok=True)
            logger.info("%s: learning rate %g, %d steps", folder, run.learning_rate, run.steps)
            train_run(
                run,
                base,
                weights,
                env,
                templates,
                base_seed,
                first_scenario,
                outputs,
                max_error_share=max_error_share,
            )
            write_text_atomic(marker, fingerprint)
        histories[run.learning_rate] = pl.read_parquet(outputs.history)
    return histories


def pilot_table(histories: Mapping[float, pl.DataFrame], tools: Sequence[Tool]) -> pl.DataFrame:
    """One row per rate and step: what the rule reads and what shows how the step went.

    Args:
        histories: Each rate's history table (``HISTORY_SCHEMA``), by rate.
        tools: The protocol's tools, whose shares of the step's rollout decisions are shown.

    Returns:
        ``learning_rate``, ``step`` (0-based: the update after it is update ``step + 1``),
        ``MEASURES``, ``actions_<tool>``, ``seconds_update`` and ``rows``, by rate and step.
    """
    columns = ["step", *MEASURES, *(f"actions_{tool}" for tool in tools), "seconds_update", "rows"]
    return pl.concat(
        [
            history.select(pl.lit(rate).alias("learning_rate"), *columns)
            for rate, history in histories.items()
        ]
    ).sort("learning_rate", "step")


def apply_rule(table: pl.DataFrame, pilot: PilotConfig) -> tuple[pl.DataFrame, PilotChoice]:
    """The pilot's rule, fixed before it runs, applied to its table.

    A step passes when both hold for it:

    * its rows' mean |log importance ratio| (``ratio_log_mean``, each row's ratio taken when
      that row is trained) is at most ``max_ratio_log``: the step's later rows stay near the
      policy that sampled them (log(1.2), PPO's clip). A step that trained no rows (no group
      with differing rewards) moved nothing and keeps this bound;
    * the probe set's KL(mu || mu_0) in float32 after its update (``probe_kl``) is at most
      ``k * max_probe_kl_per_step``, where k = ``step + 1`` is the number of updates so far:
      the policy moves no faster than that, so it does not collapse. A missing KL fails.

    A rate passes when every one of its steps passes. The choice is the largest rate that
    passes, whatever the rates below it did; if none passes, the smallest rate, marked as not
    passed. A value equal to its bound keeps it.

    Args:
        table: ``pilot_table``'s rows.
        pilot: The pilot, with its bounds.

    Returns:
        The table with ``probe_kl_limit`` (the step's KL bound), ``step_passes`` and
        ``rate_passes`` added, and the choice.
    """
    ratio_kept = (pl.col("rows") == 0) | (pl.col("ratio_log_mean") <= pilot.max_ratio_log)
    judged = (
        table.with_columns(
            probe_kl_limit=(pl.col("step") + 1) * pilot.max_probe_kl_per_step,
        )
        .with_columns(
            step_passes=(ratio_kept & (pl.col("probe_kl") <= pl.col("probe_kl_limit"))).fill_null(
                False
            )
        )
        .with_columns(rate_passes=pl.col("step_passes").all().over("learning_rate"))
    )
    passing = judged.filter("rate_passes")["learning_rate"]
    if passing.is_empty():
        return judged, PilotChoice(min(pilot.learning_rates), passed=False)
    return judged, PilotChoice(passing.max(), passed=True)


def choice_record(choice: PilotChoice, pilot: PilotConfig, recipe: str) -> dict[str, Any]:
    """The choice as ``choice.json`` holds it, with the pilot it came from."""
    return {
        "learning_rate": choice.learning_rate,
        "passed": choice.passed,
        "arm": pilot.arm,
        "recipe": recipe,
        "pilot": dataclasses.asdict(pilot),
    }


def _cell(value: Any) -> str:
    """A table value as the markdown shows it: 3 significant digits, yes/no, - for missing."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def pilot_markdown(judged: pl.DataFrame, choice: PilotChoice, pilot: PilotConfig) -> str:
    """The pilot's table and choice as markdown, for README.md and the study's config comment.

    Args:
        judged: ``apply_rule``'s table.
        choice: Its choice.
        pilot: The pilot.
    """
    header = "| " + " | ".join(judged.columns) + " |"
    rule = "| " + " | ".join("---" for _ in judged.columns) + " |"
    rows = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in judged.iter_rows()]
    verdict = (
        f"**Chosen: {choice.learning_rate:g}**, the largest rate that kept the rule."
        if choice.passed
        else f"**No rate kept the rule**: the smallest, {choice.learning_rate:g}, is the choice."
    )
    return "\n".join(
        [
            f"# Learning-rate pilot: arm `{pilot.arm}`, steps per rate: {pilot.steps}",
            "",
            "The rule, fixed before the pilot ran (coordgap.training.pilot.apply_rule): the "
            "largest rate whose every step kept its rows' mean |log importance ratio| at most "
            f"{pilot.max_ratio_log:g} and, after its update k = step + 1, the probe set's "
            f"KL(mu || mu_0) at most k x {pilot.max_probe_kl_per_step:g} (probe_kl_limit); "
            "the smallest rate if none did.",
            "",
            header,
            rule,
            *rows,
            "",
            verdict,
            "",
        ]
    )
