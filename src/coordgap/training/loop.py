"""A training run, step by step: rollouts with the current adapter, one update, one checkpoint.

Step ``k`` (0-based) plays ``groups_per_step`` groups of ``episodes_per_group`` episodes with
checkpoint ``k`` (checkpoint 0 is the untrained adapter), at the curriculum's table size, as one
cell of ``coordgap.agents.runner``: the same service, agents and episode recorder as every other
episode. Group ``g`` plays training scenario ``first_scenario + k * groups_per_step + g``: all
its episodes face the same table randomness and differ only in their own sampling. The update
then turns the rollouts into ART trajectory groups (``trajectories``) and trains on them, which
gives checkpoint ``k + 1``.

Outputs, written when the run is complete:

* ``checkpoints/step_<kkkk>/``: the PEFT adapter of every checkpoint, 0 to ``steps``;
* ``history.parquet``: one row per step (``coordgap.training.history.HISTORY_SCHEMA``);
* ``rollouts/step_<kkkk>.{parquet,steps.parquet,transcripts.parquet}``: every rollout
  episode in the episode-table contract, so the training curve can be rebuilt from data.

Resume: a run works in ``.resume/`` beside its outputs, a ``coordgap.resume.ResumeFolder``
(fingerprinted by the run's settings, as a cell's journal is). Each finished step is committed
there atomically: its rollouts, its history row, the next checkpoint and the optimizer state
are written first, and ``state.json`` last, so a run killed at any moment restarts from its last
committed step. Within a step, the rollouts are journalled episode by episode as any cell's
are, so a run killed during its rollouts, or during the update that follows them, plays only
the rollouts it had not finished. Every step's randomness derives from (seed, run, step) - the
scenarios, the sampling and the generators ART's preprocessing shuffles with - so no generator
state needs saving: a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import polars as pl
import torch
from tqdm import tqdm

from coordgap import preemption
from coordgap.agents.runner import Cell, CellOutputs, publish_journal, read_journal, run_cell
from coordgap.config.training import Trainer
from coordgap.data import derive_seed, step_label, write_parquet_atomic
from coordgap.env.protocols import TOOLS
from coordgap.policies.adapters import prompted_policies
from coordgap.preemption import preemptible
from coordgap.resume import ResumeFolder, replace_path, share_as_umask, write_text_atomic
from coordgap.training.history import HISTORY_SCHEMA, rollout_rewards
from coordgap.training.probe import (
    first_round_conversations,
    probe_conversations,
    rollout_choices,
)
from coordgap.training.trajectories import trajectory_groups

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from coordgap.config.play import EnvironmentConfig, ModelSpec
    from coordgap.config.training import TrainingRunConfig
    from coordgap.env.observation import PromptTemplates
    from coordgap.env.protocols import Tool
    from coordgap.policies.adapters import ChatBackend
    from coordgap.training._art import art
    from coordgap.training.grpo import UpdateStats

logger = logging.getLogger(__name__)


class StepTrainer(Protocol):
    """What the loop needs of a trainer (``torch`` or ``art``)."""

    def start(self) -> None:
        """Get ready to sample and train (ART starts its servers)."""
        ...

    def sampler(self) -> ChatBackend:
        """The current policy as a chat backend for this step's rollouts."""
        ...

    def update(self, groups: list[art.TrajectoryGroup]) -> UpdateStats:
        """Train on one step's groups (one new checkpoint's worth)."""
        ...

    def probe(
        self, conversations: Sequence[list[dict[str, str]]], tools: Sequence[Tool]
    ) -> dict[str, float]:
        """The current policy on the probe set (``probe_*`` columns; empty if it can't)."""
        ...

    def first_round_right(
        self, conversations: Sequence[list[dict[str, str]]], tools: Sequence[Tool]
    ) -> dict[str, float]:
        """The control reward's exact expectation (``r1_exact*`` columns; empty if it can't)."""
        ...

    def save(self, folder: Path) -> None:
        """Write the current adapter into ``folder`` (PEFT layout)."""
        ...

    def save_optimizer(self, path: Path) -> None:
        """Write the optimizer's state (what a resumed run continues from)."""
        ...


@dataclass(frozen=True)
class RunOutputs:
    """Where a run's outputs go (``results/train/<run>/``).

    Attributes:
        root: The run's folder.
        steps: The run's steps: checkpoints 0 to ``steps`` exist when it is done.
    """

    root: Path
    steps: int

    def checkpoint(self, step: int, root: Path | None = None) -> Path:
        """The adapter folder of checkpoint ``step`` (under ``root``, default the outputs)."""
        return (root or self.root) / "checkpoints" / step_label(step)

    def rollouts(self, root: Path | None = None) -> Path:
        """The folder of rollout episode tables (under ``root``, default the outputs)."""
        return (root or self.root) / "rollouts"

    @property
    def history(self) -> Path:
        """The history table."""
        return self.root / "history.parquet"

    @property
    def work(self) -> Path:
        """The resume folder: undeclared, beside the outputs."""
        return self.root / ".resume"


def rollout_outputs(folder: Path, step: int) -> CellOutputs:
    """The rollout tables of ``step`` in ``folder``: ``step_<kkkk>.parquet`` and the others."""
    return CellOutputs.at(folder / step_label(step))


def training_scenario(run: TrainingRunConfig, first_scenario: int, step: int, group: int) -> int:
    """The scenario id group ``group`` of step ``step`` plays."""
    return first_scenario + step * run.groups_per_step + group


def rollout_cell(
    run: TrainingRunConfig, env: EnvironmentConfig, base_seed: int, first_scenario: int, step: int
) -> Cell:
    """Step ``step``'s rollouts as a cell: episode ``g * E + e`` is member ``e`` of group ``g``.

    Args:
        run: The training run.
        env: The table rules.
        base_seed: The config's seed.
        first_scenario: The first training scenario id (``scenarios.train``).
        step: The step; checkpoint ``step`` plays it.

    Returns:
        The cell, with the run's name as its model and the checkpoint's label.
    """
    return Cell(
        model=run.name,
        n=run.n_at(step),
        env=env,
        episodes=run.groups_per_step * run.episodes_per_group,
        base_seed=base_seed,
        first_scenario=training_scenario(run, first_scenario, step, 0),
        model_settings=run.settings(),
        checkpoint=step_label(step),
        group_size=run.episodes_per_group,
    )


async def play_rollouts(
    sampler: ChatBackend,
    cell: Cell,
    outputs: CellOutputs,
    templates: PromptTemplates,
    max_in_flight: int,
    max_error_share: float = 0.0,
) -> dict[str, pl.DataFrame]:
    """Play one step's rollouts with the current policy, resuming its journal.

    The journal is left complete, not merged: the step's commit writes the tables returned
    here and removes it (``publish_journal``), so a run killed before then (during the
    update, say) replays none of the step's finished rollouts.

    Args:
        sampler: The current policy.
        cell: The step's rollouts (``rollout_cell``).
        outputs: Where its tables will go; the journal sits beside them.
        templates: Prompt templates.
        max_in_flight: Episodes played at once.
        max_error_share: The largest share of ``error`` rollouts the step may have.

    Returns:
        The step's episode, step and transcript tables, in episode order.

    Raises:
        CellErrors: More than ``max_error_share`` of the rollouts ended in ``error``.
    """
    policies = prompted_policies(sampler, cell.env, templates)
    await run_cell(
        cell,
        outputs,
        policies,
        max_in_flight,
        progress=False,
        max_error_share=max_error_share,
        merge=False,
    )
    return read_journal(cell, outputs)


class _WorkDir:
    """The resume folder of a run: committed steps, and the fingerprint they belong to."""

    def __init__(self, outputs: RunOutputs, fingerprint: str) -> None:
        self.outputs = outputs
        self.folder = ResumeFolder(outputs.work, fingerprint)
        self.root = self.folder.root

    @property
    def step(self) -> int | None:
        """The last committed checkpoint, or None before checkpoint 0 exists."""
        state = self.root / "state.json"
        return json.loads(state.read_text())["step"] if state.exists() else None

    def checkpoint(self, step: int) -> Path:
        return self.outputs.checkpoint(step, self.root)

    def optimizer(self, step: int) -> Path:
        return self.root / "optimizer" / f"{step_label(step)}.pt"

    def history(self, step: int) -> Path:
        return self.root / "history" / f"{step_label(step)}.parquet"

    def rollouts(self, step: int) -> CellOutputs:
        """Step ``step``'s rollout tables, and beside them its journal while it plays."""
        return rollout_outputs(self.outputs.rollouts(self.root), step)

    def save_checkpoint(self, trainer: StepTrainer, step: int) -> None:
        """Write checkpoint ``step`` and the optimizer state through temporary names."""
        folder = self.checkpoint(step)
        staging = folder.with_name(f".{folder.name}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        trainer.save(staging)
        _sort_target_modules(staging / "adapter_config.json")
        share_as_umask(staging)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
        path = self.optimizer(step)
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.tmp")
        trainer.save_optimizer(staged)
        os.replace(staged, path)

    def commit(self, step: int) -> None:
        """Mark checkpoint ``step`` and everything before it as done."""
        write_text_atomic(self.root / "state.json", json.dumps({"step": step}))
        for old in self.optimizer(step).parent.glob("step_*.pt"):
            if old != self.optimizer(step):
                old.unlink()

    def publish(self) -> None:
        """Move the finished run into its declared outputs and remove the resume folder."""
        for step in range(self.outputs.steps + 1):
            replace_path(self.checkpoint(step), self.outputs.checkpoint(step))
        replace_path(self.outputs.rollouts(self.root), self.outputs.rollouts())
        history = [pl.read_parquet(self.history(step)) for step in range(self.outputs.steps)]
        write_parquet_atomic(pl.concat(history), self.outputs.history)
        self.folder.remove()


def _sort_target_modules(config: Path) -> None:
    """Write an adapter config's ``target_modules`` sorted, in PEFT's own JSON layout.

    PEFT writes the list from a set, whose order follows the process's salted string hashes:
    unsorted, one adapter would be different bytes (and a different DVC hash) in every run.
    """
    settings = json.loads(config.read_text())
    settings["target_modules"] = sorted(settings["target_modules"])
    config.write_text(json.dumps(settings, indent=2, sort_keys=True))


def train(
    run: TrainingRunConfig,
    trainer: StepTrainer,
    work: _WorkDir,
    env: EnvironmentConfig,
    templates: PromptTemplates,
    base_seed: int,
    first_scenario: int,
    progress: bool,
    max_error_share: float,
    on_step: Callable[[int, dict[str, Any]], None],
) -> None:
    """Run the steps after the last committed one, committing each (see the module docstring).

    ``on_step(step, row)`` sees every committed history row in step order: those of an earlier
    attempt first, then each new one once its commit is done.

    SIGTERM and SIGINT abandon the step in progress at once (``coordgap.preemption``), but
    never a commit or an ``on_step`` call, so the rerun continues from the last whole step and
    the step's journalled rollouts.

    Raises:
        Preempted: A signal stopped the run.
        CellErrors: More than ``max_error_share`` of a step's rollouts ended in ``error``.
    """
    trainer.start()
    bar = tqdm(
        total=run.steps,
        initial=work.step or 0,
        desc=run.name,
        unit="step",
        file=sys.stderr,
        disable=not progress,
    )
    probes = probe_conversations(env, templates, run.n)
    tools = TOOLS[env.protocol]
    with preemptible() as guard:
        if work.step is None:
            with guard.deferred():
                work.save_checkpoint(trainer, 0)
                work.commit(0)
        # A tracker's write (a database transaction) is deferred like a commit: a signal that
        # cut it could leave the tracker's store locked or half-written.
        with guard.deferred():
            for step in range(work.step):
                on_step(step, pl.read_parquet(work.history(step)).row(0, named=True))
        for step in range(work.step, run.steps):
            begin = time.perf_counter()
            cell = rollout_cell(run, env, base_seed, first_scenario, step)
            rollouts = work.rollouts(step)
            tables = preemption.run(
                play_rollouts(
                    trainer.sampler(), cell, rollouts, templates, run.max_in_flight, max_error_share
                )
            )
            rolled = time.perf_counter()
            # ART's preprocessing shuffles with Python's global generator; dropout (if any)
            # draws from torch's.
            random.seed(derive_seed(run.seed, run.name, "update", step))
            torch.manual_seed(derive_seed(run.seed, run.name, "dropout", step))
            stats = trainer.update(
                trajectory_groups(tables["episodes"], tables["transcripts"], run)
            )
            first_round = first_round_conversations(env, templates, run.n_at(step))
            row = {
                "run": run.name,
                "step": step,
                "n": run.n_at(step),
                **rollout_rewards(tables["episodes"], run),
                **{k: v for k, v in dataclasses.asdict(stats).items() if k != "seconds"},
                **rollout_choices(tables["episodes"], tables["transcripts"]),
                **trainer.probe(probes, tools),
                **({} if first_round is None else trainer.first_round_right(first_round, tools)),
                "seconds_rollout": rolled - begin,
                "seconds_update": stats.seconds,
                "seconds": time.perf_counter() - begin,
            }
            with guard.deferred():
                publish_journal(tables, rollouts, rollouts)
                write_parquet_atomic(pl.DataFrame([row], schema=HISTORY_SCHEMA), work.history(step))
                work.save_checkpoint(trainer, step + 1)
                work.commit(step + 1)
                on_step(step, row)
            loss = "-" if math.isnan(stats.loss) else f"{stats.loss:.4f}"
            logger.info(
                "step %d: n=%d reward %.3f, %d rows (%.0f%% clipped), loss %s, "
                "probe KL(mu || mu_0) %s, %.1f s",
                step,
                row["n"],
                row["reward_mean"],
                stats.rows,
                100 * (0.0 if math.isnan(stats.clipped_share) else stats.clipped_share),
                loss,
                "-" if row.get("probe_kl") is None else f"{row['probe_kl']:.2e}",
                row["seconds"],
            )
            bar.set_postfix(
                reward=f"{row['reward_mean']:.3f}",
                loss=loss,
                s_per_step=f"{row['seconds']:.0f}",
                refresh=False,
            )
            bar.update(1)
    bar.close()


def open_trainer(
    run: TrainingRunConfig, base: ModelSpec, weights: Path, work: _WorkDir
) -> StepTrainer:
    """The run's trainer, continuing from the last committed checkpoint if there is one."""
    step = work.step
    if run.trainer is Trainer.ART:
        from coordgap.training.art_trainer import ArtTrainer

        return ArtTrainer(run, base, weights, work.root / "art", step or 0)
    from coordgap.training.grpo import TorchGRPOTrainer

    if step is None:
        return TorchGRPOTrainer(weights, run, base.entry)
    return TorchGRPOTrainer(weights, run, base.entry, work.checkpoint(step), work.optimizer(step))


def run_fingerprint(
    run: TrainingRunConfig,
    base: ModelSpec,
    env: EnvironmentConfig,
    base_seed: int,
    first_scenario: int,
) -> str:
    """Everything a run's outputs depend on, as text: a resume folder continues only its own.

    Args:
        run: The training run.
        base: The base model's entry.
        env: The table rules.
        base_seed: The config's seed.
        first_scenario: The first training scenario id (``scenarios.train``).
    """
    return json.dumps(
        {
            "run": run.settings(),
            "base": base.settings(),
            "env": dataclasses.asdict(env),
            "seed": base_seed,
            "first_scenario": first_scenario,
        },
        sort_keys=True,
        default=str,
    )


def train_run(
    run: TrainingRunConfig,
    base: ModelSpec,
    weights: Path,
    env: EnvironmentConfig,
    templates: PromptTemplates,
    base_seed: int,
    first_scenario: int,
    outputs: RunOutputs,
    progress: bool = True,
    max_error_share: float = 0.0,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
) -> None:
    """Train a run to its last step (resuming a killed one) and write its outputs.

    Raises:
        Preempted: A signal stopped the run; its committed steps are kept for the rerun.
        CellErrors: More than ``max_error_share`` of a step's rollouts ended in ``error``;
            the step's other rollouts stay journalled for the rerun.

    Args:
        run: The training run.
        base: The base model's entry.
        weights: Its prepared weights folder.
        env: The table rules.
        templates: Prompt templates.
        base_seed: The config's seed.
        first_scenario: The first training scenario id (``scenarios.train``).
        outputs: Where the run's outputs go.
        progress: Show a progress bar on stderr.
        max_error_share: The largest share of ``error`` rollouts a step may have
            (``experiment.max_error_share``): a step trained on fewer episodes than its groups
            hold must not pass for a full one.
        on_step: Called with each step and its history row once the step is committed; a
            resumed run first calls it with the steps committed before (a tracker's curve,
            ``coordgap.tracking``).
    """
    work = _WorkDir(outputs, run_fingerprint(run, base, env, base_seed, first_scenario))
    if work.step is not None:
        logger.info("%s: resuming at step %d of %d", run.name, work.step, run.steps)
    trainer = open_trainer(run, base, weights, work)
    train(
        run,
        trainer,
        work,
        env,
        templates,
        base_seed,
        first_scenario,
        progress,
        max_error_share,
        on_step or (lambda step, row: None),
    )
    work.publish()
