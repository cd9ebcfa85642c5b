"""A checkpoint as a model: its adapter on the base model, playing cells like any model.

A checkpoint plays through ``coordgap.agents.runner.generate_cell``, so its episodes are
resumable and journalled, and written in the episode-table contract with ``checkpoint`` set
to its step. Validation episodes play the validation scenarios at the run's final training N;
a selected checkpoint plays the test scenarios at every N, as model ``<run>@<policy>``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from coordgap.agents.runner import CellOutputs, generate_cell
from coordgap.analysis.provenance import write_record
from coordgap.config import EnvironmentConfig, ModelSpec, accepted_error_share
from coordgap.data import TABLE_SCHEMAS
from coordgap.env.observation import PromptTemplates
from coordgap.evaluation.selection import (
    SelectionPolicy,
    estimates,
    select,
    step_rewards,
    summary,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from coordgap.config import TrainingRunConfig


def step_label(step: int) -> str:
    """The name of a checkpoint's folder and its ``checkpoint`` column value."""
    return f"step_{step:04d}"


def checkpoint_model(name: str, base: dict[str, Any], checkpoints: Path, step: int) -> ModelSpec:
    """The base model (its ``models:`` entry) with a checkpoint's LoRA adapter, renamed."""
    return ModelSpec.from_dict(name, {**base, "adapter": str(checkpoints / step_label(step))})


def play_checkpoint(
    name: str,
    base: dict[str, Any],
    checkpoints: Path,
    step: int,
    n: int,
    env: EnvironmentConfig,
    episodes: int,
    base_seed: int,
    first_scenario: int,
    weights: Path,
    templates: PromptTemplates,
    outputs: CellOutputs,
    serve_host: str = "loopback",
    max_error_share: float = 0.0,
) -> None:
    """Play one cell with a checkpoint (resuming a killed job) and write its three tables.

    Args:
        name: The model name the episodes carry: the run (validation) or ``<run>@<policy>``.
        base: The run's base model's ``models:`` entry.
        checkpoints: The run's checkpoints folder.
        step: The checkpoint.
        n: Number of philosophers.
        env: The table rules.
        episodes: Episodes to play.
        base_seed: The config's seed.
        first_scenario: Episode ``k`` plays scenario ``first_scenario + k``.
        weights: The base model's prepared weights.
        templates: Prompt templates.
        outputs: Where the tables go.
        serve_host: Where a served base model's server listens (``loopback`` or ``node``).
        max_error_share: The largest share of ``error`` episodes the cell may have.
    """
    generate_cell(
        model=checkpoint_model(name, base, checkpoints, step),
        n=n,
        env=env,
        episodes=episodes,
        base_seed=base_seed,
        first_scenario=first_scenario,
        outputs=outputs,
        templates=templates,
        weights=weights,
        checkpoint=step_label(step),
        serve_host=serve_host,
        max_error_share=max_error_share,
    )


def play_checkpoint_job(job: Any, name: str, step: int, n: int, episodes: int) -> None:
    """Play a checkpoint's cell as a job of rule evaluate_checkpoint or test_checkpoint.

    The two rules declare the same inputs, params, outputs and resources (rules/evaluate.smk);
    they differ in the model name, the checkpoint, N and the episode count, which the adapter
    works out. The job's provenance record is written last, beside the episodes.

    Args:
        job: The ``snakemake`` object of the job's script.
        name: The model name the episodes carry.
        step: The checkpoint.
        n: Number of philosophers.
        episodes: Episodes to play.
    """
    play_checkpoint(
        name=name,
        base=job.params.base,
        checkpoints=Path(job.input.checkpoints),
        step=step,
        n=n,
        env=EnvironmentConfig.from_dict(job.params.environment),
        episodes=episodes,
        base_seed=job.params.seed,
        first_scenario=job.params.first_scenario,
        weights=Path(job.input.weights),
        templates=PromptTemplates.load(job.input.prompts),
        outputs=CellOutputs(
            episodes=Path(job.output.episodes),
            steps=Path(job.output.steps),
            transcripts=Path(job.output.transcripts),
        ),
        serve_host=job.resources.serve_host,
        max_error_share=accepted_error_share(job.config),
    )
    write_record(job.output.provenance, job.params.provenance, root=Path.cwd())


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
