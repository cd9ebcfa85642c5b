"""A checkpoint as a model: its adapter on the base model, playing cells like any model.

A checkpoint plays through ``coordgap.agents.generate.generate_cell``, so its episodes are
resumable and journalled, and written in the episode-table contract with ``checkpoint`` set
to its step. Validation episodes play the validation scenarios at the run's final training N,
every evaluated checkpoint of a run in one job (one table, one server for a served base
model); a selected checkpoint plays the test scenarios at every N, as model
``<run>@<policy>``.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from coordgap.agents.generate import generate_cell
from coordgap.agents.runner import Cell, CellOutputs, merge_journal
from coordgap.config.play import EnvironmentConfig, ModelSpec
from coordgap.data import TABLE_SCHEMAS, step_label
from coordgap.env.observation import PromptTemplates
from coordgap.evaluation.selection import (
    SelectionPolicy,
    estimates,
    select,
    step_rewards,
    summary,
)
from coordgap.policies.serving import serve_models

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from coordgap.config.training import TrainingRunConfig


def checkpoint_model(name: str, base: dict[str, Any], checkpoints: Path, step: int) -> ModelSpec:
    """The base model (its ``models:`` entry) with a checkpoint's LoRA adapter, renamed."""
    return ModelSpec.from_dict(name, {**base, "adapter": str(checkpoints / step_label(step))})


@dataclass(frozen=True)
class CheckpointJob:
    """What the checkpoint jobs of a run play with: rules evaluate_checkpoints, test_checkpoint.

    The two rules declare the same inputs, params and resources (rules/evaluate.smk); they
    differ in the model name, the checkpoints, N and the episode count, which their adapters
    work out.

    Attributes:
        base: The run's base model's ``models:`` entry.
        checkpoints: The run's checkpoints folder.
        env: The table rules.
        base_seed: The config's seed.
        first_scenario: Episode ``k`` plays scenario ``first_scenario + k``.
        weights: The base model's prepared weights.
        templates: Prompt templates.
        serve_host: Where a served base model's server listens (``loopback`` or ``node``).
        max_error_share: The largest share of ``error`` episodes a cell may have.
    """

    base: dict[str, Any]
    checkpoints: Path
    env: EnvironmentConfig
    base_seed: int
    first_scenario: int
    weights: Path
    templates: PromptTemplates
    serve_host: str = "loopback"
    max_error_share: float = 0.0

    @classmethod
    def of(
        cls,
        params: Mapping[str, Any],
        inputs: Mapping[str, str],
        serve_host: str,
        max_error_share: float,
    ) -> CheckpointJob:
        """The settings of a job from what both rules declare alike.

        Args:
            params: The rule's ``base``, ``environment``, ``seed`` and ``first_scenario``.
            inputs: The rule's ``checkpoints``, ``weights`` and ``prompts`` paths.
            serve_host: Its ``serve_host`` resource.
            max_error_share: The largest share of ``error`` episodes a cell may have.

        Returns:
            The job's settings.
        """
        return cls(
            base=params["base"],
            checkpoints=Path(inputs["checkpoints"]),
            env=EnvironmentConfig.from_dict(params["environment"]),
            base_seed=params["seed"],
            first_scenario=params["first_scenario"],
            weights=Path(inputs["weights"]),
            templates=PromptTemplates.load(inputs["prompts"]),
            serve_host=serve_host,
            max_error_share=max_error_share,
        )

    def play(
        self,
        name: str,
        step: int,
        n: int,
        episodes: int,
        outputs: CellOutputs,
        played_as: ModelSpec | None = None,
        merge: bool = True,
    ) -> Cell:
        """Play one cell with a checkpoint (resuming a killed job) and write its three tables.

        Args:
            name: The model name the episodes carry: the run (validation) or ``<run>@<policy>``.
            step: The checkpoint.
            n: Number of philosophers.
            episodes: Episodes to play.
            outputs: Where the tables go.
            played_as: The checkpoint on a server the caller started (``validate``).
            merge: Write the tables; if False, leave the complete journal.

        Returns:
            The cell played.
        """
        return generate_cell(
            model=checkpoint_model(name, self.base, self.checkpoints, step),
            n=n,
            env=self.env,
            episodes=episodes,
            base_seed=self.base_seed,
            first_scenario=self.first_scenario,
            outputs=outputs,
            templates=self.templates,
            weights=self.weights,
            checkpoint=step_label(step),
            serve_host=self.serve_host,
            max_error_share=self.max_error_share,
            played_as=played_as,
            merge=merge,
        )

    def validate(
        self, name: str, steps: Sequence[int], n: int, episodes: int, folder: Path
    ) -> None:
        """Play every evaluated checkpoint's validation cell; write each one's tables in ``folder``.

        A served base model starts one server for the whole job, every checkpoint a LoRA
        module of it (``coordgap.policies.serving.serve_models``): the server's start, minutes
        for a large model, is paid once per run instead of once per checkpoint. An in-process
        base model loads each checkpoint's adapter in turn.

        Each checkpoint's cell journals into ``<folder>.partial/`` (outside the job's output,
        which Snakemake clears before a rerun), so a killed job resumes where it stopped, the
        finished checkpoints kept; the tables, ``step_<kkkk>.parquet`` and its steps and
        transcripts, are written once every cell is complete.

        Args:
            name: The run: the model name the episodes carry.
            steps: The evaluated checkpoints.
            n: Number of philosophers.
            episodes: Episodes per checkpoint.
            folder: Where the tables go.
        """
        journal = folder.with_name(f"{folder.name}.partial")
        models = [checkpoint_model(name, self.base, self.checkpoints, step) for step in steps]
        played = []
        with ExitStack() as stack:
            served = (
                stack.enter_context(serve_models(models, self.weights, self.serve_host))
                if ModelSpec.from_dict(name, self.base).is_served
                else [None] * len(steps)
            )
            for step, server_side in zip(steps, served, strict=True):
                part = CellOutputs.at(journal / step_label(step))
                cell = self.play(name, step, n, episodes, part, server_side, merge=False)
                played.append((cell, part))
        folder.mkdir(parents=True, exist_ok=True)
        for cell, part in played:
            merge_journal(cell, CellOutputs.at(folder / cell.checkpoint), journal=part)
        journal.rmdir()


def chosen_step(choice_json: Path) -> int:
    """The step a selection policy's own file names."""
    return int(json.loads(choice_json.read_text())["step"])


def selection(
    run: TrainingRunConfig,
    policies: Sequence[str],
    rollouts: Sequence[Path],
    validation: Sequence[Path],
    intervals: Mapping[str, Any],
) -> dict[str, Any]:
    """Estimate every step from its rollouts and validation episodes; apply the policies.

    Args:
        run: The training run.
        policies: The selection policies.
        rollouts: The run's rollout episode tables (one per step).
        validation: The evaluated checkpoints' validation episode tables.
        intervals: ``confidence``, ``bootstrap_resamples`` and ``seed`` of the intervals
            (the ``analysis:`` settings the statistics use).

    Returns:
        The selection (``coordgap.evaluation.selection.summary``).
    """
    settings = (intervals["confidence"], intervals["bootstrap_resamples"], intervals["seed"])
    training = estimates(step_rewards(_concat(rollouts), run), *settings)
    validated = estimates(step_rewards(_concat(validation), run), *settings)
    choices = select([SelectionPolicy(p) for p in policies], run.steps, training, validated)
    return summary(choices, run, training, validated)


def write_json(value: Any, path: Path) -> None:
    """Write ``value`` as indented JSON."""
    path.write_text(json.dumps(value, indent=2) + "\n")


def _concat(paths: Sequence[Path]) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(path) for path in paths], how="vertical").cast(
        TABLE_SCHEMAS["episodes"]
    )
