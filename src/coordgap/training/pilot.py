"""The pilot: an arm's recipe briefly trained with each candidate update, and the rule that picks.

A candidate update is a learning rate, the rows per optimizer step
(``grad_accumulation_sequences``) and a gradient clip (``optimizer.max_grad_norm``). The rule
(``apply_rule``) is stated before the pilot runs. Each candidate's run is the recipe with only
those, ``steps`` and ART's warm-up replaced (the warm-up belongs to ART's one-row loop: it is
kept where the recipe has it and the candidate takes one row per step). Its name and seed stay
the recipe's: a run's rollouts and the order of its update's rows derive from (seed, run name,
step), so every candidate plays the same step-0 rollouts from the same untrained adapter and
the candidates differ by their update alone. Its outputs, in ``coordgap.training.loop``'s
layout, go to ``<root>/pilot-<arm>-lr<rate>-rows<rows>-clip<clip>/``; a killed pilot resumes
the candidate it was training and keeps those it had finished
(README.md: Choosing the update: the pilot).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from coordgap.config.training import ALL_ROWS, rows_label, rows_per_step
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
# What the rule reads of each step, and what shows how the step went: the exact expected
# control reward after the update (``r1_exact``) and the cosine of the update's change of the
# weights with its policy-gradient estimate (``ascent_cosine``: reported, not judged).
MEASURES = (
    "probe_kl",
    "probe_kl_acting",
    "ratio_log_mean",
    "clipped_share",
    "r1_exact",
    "ascent_cosine",
)
# The columns that name a candidate update in the pilot's table.
CANDIDATE = ("learning_rate", "grad_accumulation_sequences", "max_grad_norm")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One candidate update of the pilot.

    Attributes:
        learning_rate: AdamW's learning rate.
        grad_accumulation_sequences: Rows per optimizer step (None: all of the update's).
        max_grad_norm: The gradient-norm clip of each optimizer step.
    """

    learning_rate: float
    grad_accumulation_sequences: int | None
    max_grad_norm: float

    @property
    def rows(self) -> str:
        """Rows per optimizer step as the config writes them (``1``, ``8``, ``all``)."""
        return rows_label(self.grad_accumulation_sequences)

    def of(self, recipe: TrainingRunConfig, steps: int) -> TrainingRunConfig:
        """The recipe trained with this update for ``steps`` steps (see the module docstring)."""
        return dataclasses.replace(
            recipe,
            learning_rate=self.learning_rate,
            steps=steps,
            grad_accumulation_sequences=self.grad_accumulation_sequences,
            optimizer=dataclasses.replace(recipe.optimizer, max_grad_norm=self.max_grad_norm),
            warmup=recipe.warmup and self.grad_accumulation_sequences == 1,
        )


@dataclass(frozen=True, slots=True)
class PilotChoice:
    """The pilot's verdict.

    Attributes:
        update: The update the study should train with.
        passed: Whether it kept the rule; False when no candidate did and the first is chosen.
    """

    update: Candidate
    passed: bool


def candidates(pilot: PilotConfig) -> list[Candidate]:
    """Every candidate update, in ``PilotConfig.updates`` order."""
    return [Candidate(*update) for update in pilot.updates()]


def pilot_run_folder(arm: str, update: Candidate) -> str:
    """A candidate's folder: ``pilot-<arm>-lr<rate>-rows<rows>-clip<clip>``."""
    return f"pilot-{arm}-lr{update.learning_rate:g}-rows{update.rows}-clip{update.max_grad_norm:g}"


def pilot_runs(
    pilot: PilotConfig, recipe: TrainingRunConfig
) -> dict[str, tuple[Candidate, TrainingRunConfig]]:
    """Each candidate and its run, by folder, in ``candidates`` order."""
    return {
        pilot_run_folder(pilot.arm, update): (update, update.of(recipe, pilot.steps))
        for update in candidates(pilot)
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
) -> dict[Candidate, pl.DataFrame]:
    """Train the recipe with each candidate in turn, skipping those trained as they are now.

    Args:
        pilot: The pilot.
        recipe: The arm's run whose recipe each rate trains.
        base: The base model's entry.
        weights: Its prepared weights folder.
        env: The table rules.
        templates: Prompt templates.
        base_seed: The config's seed.
        first_scenario: The first training scenario id (``scenarios.train``).
        root: The folder of the candidates' runs.
        max_error_share: As for ``train_run``.

    Returns:
        Each candidate's history table.
    """
    histories = {}
    for folder, (update, run) in pilot_runs(pilot, recipe).items():
        outputs = RunOutputs(root / folder, run.steps)
        fingerprint = run_fingerprint(run, base, env, base_seed, first_scenario)
        marker = outputs.root / TRAINED_WITH
        if marker.exists() and marker.read_text() == fingerprint:
            logger.info("%s: trained already", folder)
        else:
            # Gone before the outputs change, so that a run killed while it publishes is
            # never taken for the finished one.
            marker.unlink(missing_ok=True)
            logger.info("%s: %d steps", folder, run.steps)
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
        histories[update] = pl.read_parquet(outputs.history)
    return histories


def pilot_table(histories: Mapping[Candidate, pl.DataFrame], tools: Sequence[Tool]) -> pl.DataFrame:
    """One row per candidate and step: what the rule reads and what shows how the step went.

    Args:
        histories: Each candidate's history table (``HISTORY_SCHEMA``).
        tools: The protocol's tools, whose shares of the step's rollout decisions are shown.

    Returns:
        ``CANDIDATE``, ``step`` (0-based: the update after it is update ``step + 1``),
        ``MEASURES``, ``r1_exact_base`` (the untrained model's), ``actions_<tool>``,
        ``seconds_update``, ``rows`` and ``optimizer_steps``, candidates in their order.
    """
    columns = [
        "step",
        *MEASURES,
        "r1_exact_base",
        *(f"actions_{tool}" for tool in tools),
        "seconds_update",
        "rows",
        "optimizer_steps",
    ]
    return pl.concat(
        [
            history.sort("step").select(
                pl.lit(update.learning_rate).alias("learning_rate"),
                pl.lit(update.rows).alias("grad_accumulation_sequences"),
                pl.lit(update.max_grad_norm).alias("max_grad_norm"),
                *columns,
            )
            for update, history in histories.items()
        ]
    )


def apply_rule(table: pl.DataFrame, pilot: PilotConfig) -> tuple[pl.DataFrame, PilotChoice]:
    """The pilot's rule, fixed before it runs, applied to its table.

    A step passes when all three hold for it:

    * its rows' mean |log importance ratio| (``ratio_log_mean``, each row's ratio taken when
      its optimizer step is computed) is at most ``max_ratio_log``: the step's later rows stay
      near the policy that sampled them (log(1.2), PPO's clip). A step that trained no rows
      (no group with differing rewards) moved nothing and keeps this bound;
    * the probe set's KL(mu || mu_0) in float32 after its update (``probe_kl``) is at most
      ``k * max_probe_kl_per_step``, where k = ``step + 1`` is the number of updates so far:
      the policy moves, but does not collapse;
    * the control's exact expected reward rises with the update: ``r1_exact`` after it above
      its value before (``r1_before``: the untrained model's ``r1_exact_base`` for step 0).
      The update follows the reward it was given.

    A missing value fails its step. A candidate passes when every one of its steps passes.
    The choice is the passing candidate whose control rose most (the largest ``r1_exact``
    after its last step; on a tie, the earlier candidate); if none passes, the first candidate,
    marked as not passed. A value equal to its bound keeps it.

    Args:
        table: ``pilot_table``'s rows.
        pilot: The pilot, with its bounds.

    Returns:
        The table with ``r1_before``, ``probe_kl_limit`` (the step's KL bound),
        ``step_passes`` and ``candidate_passes`` added, and the choice.
    """
    ratio_kept = (pl.col("rows") == 0) | (pl.col("ratio_log_mean") <= pilot.max_ratio_log)
    judged = (
        table.with_columns(
            probe_kl_limit=(pl.col("step") + 1) * pilot.max_probe_kl_per_step,
            r1_before=pl.col("r1_exact")
            .shift(1)
            .over(CANDIDATE, order_by="step")
            .fill_null(pl.col("r1_exact_base")),
        )
        .with_columns(
            step_passes=(
                ratio_kept
                & (pl.col("probe_kl") <= pl.col("probe_kl_limit"))
                & (pl.col("r1_exact") > pl.col("r1_before"))
            ).fill_null(False)
        )
        .with_columns(candidate_passes=pl.col("step_passes").all().over(CANDIDATE))
    )
    last = judged.filter(pl.col("step") == pl.col("step").max().over(CANDIDATE))
    passing = last.filter("candidate_passes")
    chosen = (passing if passing.height else last).row(
        int(passing["r1_exact"].arg_max()) if passing.height else 0, named=True
    )
    update = Candidate(
        chosen["learning_rate"],
        rows_per_step(chosen["grad_accumulation_sequences"]),
        chosen["max_grad_norm"],
    )
    return judged, PilotChoice(update, passed=passing.height > 0)


def choice_record(choice: PilotChoice, pilot: PilotConfig, recipe: str) -> dict[str, Any]:
    """The choice as ``choice.json`` holds it (the runs' keys), with the pilot it came from."""
    update = choice.update
    return {
        "learning_rate": update.learning_rate,
        "grad_accumulation_sequences": update.rows,
        "max_grad_norm": update.max_grad_norm,
        "passed": choice.passed,
        "arm": pilot.arm,
        "recipe": recipe,
        # The config's own spelling of every row count (``all``, not None).
        "pilot": dataclasses.asdict(pilot)
        | {
            "grad_accumulation_sequences": [
                ALL_ROWS if rows is None else rows for rows in pilot.grad_accumulation_sequences
            ]
        },
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
    update = choice.update
    named = (
        f"learning rate {update.learning_rate:g}, grad_accumulation_sequences {update.rows}, "
        f"max_grad_norm {update.max_grad_norm:g}"
    )
    verdict = (
        f"**Chosen: {named}**, the candidate that kept the rule and raised the control most."
        if choice.passed
        else f"**No candidate kept the rule**: the first, {named}, is the choice."
    )
    return "\n".join(
        [
            f"# The pilot: arm `{pilot.arm}`, steps per candidate update: {pilot.steps}",
            "",
            "The rule, fixed before the pilot ran (coordgap.training.pilot.apply_rule): every "
            "step of a candidate keeps its rows' mean |log importance ratio| at most "
            f"{pilot.max_ratio_log:g}, after its update k = step + 1 the probe set's "
            f"KL(mu || mu_0) at most k x {pilot.max_probe_kl_per_step:g} (probe_kl_limit), and "
            "raises the control's exact expected reward r1_exact above its value before the "
            "update (r1_before); of the candidates that kept it, the one whose r1_exact ended "
            "highest; the first candidate if none did. ascent_cosine is reported, not judged.",
            "",
            header,
            rule,
            *rows,
            "",
            verdict,
            "",
        ]
    )
