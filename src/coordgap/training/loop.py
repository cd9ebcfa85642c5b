"""A training run, step by step: rollouts with the current adapter, one update, one checkpoint.

Step ``k`` (0-based) plays ``groups_per_step`` groups of ``episodes_per_group`` episodes with
checkpoint ``k`` (checkpoint 0 is the untrained adapter), through the same LangGraph agents and
episode recorder as every other episode, at the curriculum's table size. Group ``g`` plays
training scenario ``first_scenario + k * groups_per_step + g``: all its episodes face the same
table randomness and differ only in their own sampling. The update then turns the rollouts
into ART trajectory groups (``trajectories``) and trains on them, which gives checkpoint
``k + 1``.

Outputs, written when the run is complete:

* ``checkpoints/step_<kkkk>/``: the PEFT adapter of every checkpoint, 0 to ``steps``;
* ``history.parquet``: one row per step (``coordgap.training.history.HISTORY_SCHEMA``);
* ``rollouts/step_<kkkk>.{parquet,steps.parquet,transcripts.parquet}``: every rollout
  episode in the episode-table contract, so the training curve can be rebuilt from data.

Resume: a run works in ``.resume/`` beside its outputs (Snakemake deletes a failed job's
declared outputs, so resume state must live outside them). Each finished step is committed
there atomically: its rollouts, its history row, the next checkpoint and the optimizer state
are written first, and ``state.json`` last, so a run killed at any moment restarts from its last
committed step. Every step's randomness derives from (seed, run, step) - the scenarios, the
sampling and the generators ART's preprocessing shuffles with - so no generator state needs
saving: a resumed run repeats the uninterrupted one. The folder carries a fingerprint of the
run's settings; one written under other settings is discarded.
"""

from __future__ import annotations

import asyncio
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
from coordgap.agents.graphs import play_episode_graph
from coordgap.config.training import Trainer
from coordgap.data import (
    TABLE_SCHEMAS,
    EpisodeSeeds,
    derive_seed,
    step_label,
    write_parquet_atomic,
)
from coordgap.env.protocols import TOOLS
from coordgap.env.table import TurnOrder
from coordgap.env.variants import RewardVariant, reward_expr
from coordgap.policies.adapters import LLMAgentPolicy
from coordgap.preemption import preemptible
from coordgap.training.history import HISTORY_SCHEMA
from coordgap.training.probe import probe_conversations, rollout_choices
from coordgap.training.trajectories import trajectory_groups

if TYPE_CHECKING:
    from collections.abc import Sequence
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


def rollout_path(folder: Path, step: int, table: str) -> Path:
    """The file of one rollout table of ``step`` (``table``: episodes, steps, transcripts)."""
    suffix = "" if table == "episodes" else f".{table}"
    return folder / f"{step_label(step)}{suffix}.parquet"


def training_scenario(run: TrainingRunConfig, first_scenario: int, step: int, group: int) -> int:
    """The scenario id group ``group`` of step ``step`` plays."""
    return first_scenario + step * run.groups_per_step + group


async def play_rollouts(
    sampler: ChatBackend,
    run: TrainingRunConfig,
    env: EnvironmentConfig,
    templates: PromptTemplates,
    base_seed: int,
    first_scenario: int,
    step: int,
) -> dict[str, pl.DataFrame]:
    """Play one step's rollout episodes with the current policy.

    Args:
        sampler: The current policy.
        run: The training run.
        env: The table rules.
        templates: Prompt templates.
        base_seed: The config's seed.
        first_scenario: The first training scenario id (``scenarios.train``).
        step: The step.

    Returns:
        The step's episode, step and transcript tables (episode ``g * E + e`` is member ``e``
        of group ``g``).
    """
    n = run.n_at(step)
    gate = asyncio.Semaphore(run.max_in_flight)
    simultaneous = env.turn_order is TurnOrder.SIMULTANEOUS

    async def play(group: int, member: int) -> dict[str, list[dict[str, Any]]]:
        scenario = training_scenario(run, first_scenario, step, group)
        seeds = EpisodeSeeds.derive(base_seed, scenario, n, f"{run.name}/{member}")
        table_rng, _ = seeds.generators()
        policy = LLMAgentPolicy(sampler, templates, seeds.policy, simultaneous)
        async with gate:
            log = await play_episode_graph(env, n, policy, table_rng)
        return log.tables(
            model=run.name,
            checkpoint=step_label(step),
            n=n,
            episode=group * run.episodes_per_group + member,
            seeds=seeds,
        )

    played = await asyncio.gather(
        *(
            play(group, member)
            for group in range(run.groups_per_step)
            for member in range(run.episodes_per_group)
        )
    )
    return {
        table: pl.DataFrame([row for parts in played for row in parts[table]], schema=schema)
        for table, schema in TABLE_SCHEMAS.items()
    }


def rollout_rewards(episodes: pl.DataFrame, run: TrainingRunConfig) -> dict[str, Any]:
    """A step's rollout statistics for its history row, from its episode table alone.

    Rewards use the run's weights; ``reward_*`` is the variant trained on, and
    ``reward_<variant>_*`` every variant. Episodes that ended in an error count apart.

    Args:
        episodes: The step's rollout episode table.
        run: The training run.

    Returns:
        The reward, meal and deadlock columns of a history row.
    """
    ok = episodes.filter(pl.col("status") == "ok")
    row: dict[str, Any] = {"episodes": ok.height, "errors": episodes.height - ok.height}
    trained = ok.select(reward_expr(run.variant, run.weights))["reward"]
    row |= {
        "reward_mean": trained.mean(),
        # Population standard deviation, as ART's advantages use.
        "reward_std": trained.std(ddof=0),
        "reward_min": trained.min(),
        "reward_max": trained.max(),
    }
    for variant in RewardVariant:
        rewards = ok.select(reward_expr(variant, run.weights))["reward"]
        row |= {f"reward_{variant}_mean": rewards.mean(), f"reward_{variant}_std": rewards.std(0)}
    row |= {"meals_mean": ok["meals_total"].mean(), "deadlock_rate": ok["deadlock"].mean()}
    return row


class _WorkDir:
    """The resume folder of a run: committed steps, and the fingerprint they belong to."""

    def __init__(self, outputs: RunOutputs, fingerprint: str) -> None:
        self.outputs = outputs
        self.root = outputs.work
        stamp = self.root / "fingerprint.json"
        if self.root.exists() and (not stamp.exists() or stamp.read_text() != fingerprint):
            logger.warning("discarding resume state written with other settings: %s", self.root)
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        _write_atomic(stamp, fingerprint)

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

    def save_checkpoint(self, trainer: StepTrainer, step: int) -> None:
        """Write checkpoint ``step`` and the optimizer state through temporary names."""
        folder = self.checkpoint(step)
        staging = folder.with_name(f".{folder.name}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        trainer.save(staging)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
        path = self.optimizer(step)
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.tmp")
        trainer.save_optimizer(staged)
        os.replace(staged, path)

    def commit(self, step: int) -> None:
        """Mark checkpoint ``step`` and everything before it as done."""
        _write_atomic(self.root / "state.json", json.dumps({"step": step}))
        for old in self.optimizer(step).parent.glob("step_*.pt"):
            if old != self.optimizer(step):
                old.unlink()

    def publish(self) -> None:
        """Move the finished run into its declared outputs and remove the resume folder."""
        for step in range(self.outputs.steps + 1):
            _replace(self.checkpoint(step), self.outputs.checkpoint(step))
        _replace(self.outputs.rollouts(self.root), self.outputs.rollouts())
        history = [pl.read_parquet(self.history(step)) for step in range(self.outputs.steps)]
        write_parquet_atomic(pl.concat(history), self.outputs.history)
        shutil.rmtree(self.root)


def _write_atomic(path: Path, text: str) -> None:
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(text)
    os.replace(staged, path)


def _replace(source: Path, dest: Path) -> None:
    """Move ``source`` to ``dest``, replacing whatever is there."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(source, dest)


def train(
    run: TrainingRunConfig,
    trainer: StepTrainer,
    work: _WorkDir,
    env: EnvironmentConfig,
    templates: PromptTemplates,
    base_seed: int,
    first_scenario: int,
    progress: bool,
) -> None:
    """Run the steps after the last committed one, committing each (see the module docstring).

    SIGTERM and SIGINT abandon the step in progress at once (``coordgap.preemption``), but
    never a commit, so the rerun continues from the last whole step.

    Raises:
        Preempted: A signal stopped the run.
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
        for step in range(work.step, run.steps):
            begin = time.perf_counter()
            tables = preemption.run(
                play_rollouts(
                    trainer.sampler(), run, env, templates, base_seed, first_scenario, step
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
            row = {
                "run": run.name,
                "step": step,
                "n": run.n_at(step),
                **rollout_rewards(tables["episodes"], run),
                **{k: v for k, v in dataclasses.asdict(stats).items() if k != "seconds"},
                **rollout_choices(tables["episodes"], tables["transcripts"]),
                **trainer.probe(probes, tools),
                "seconds_rollout": rolled - begin,
                "seconds_update": stats.seconds,
                "seconds": time.perf_counter() - begin,
            }
            with guard.deferred():
                for table, frame in tables.items():
                    write_parquet_atomic(
                        frame, rollout_path(work.outputs.rollouts(work.root), step, table)
                    )
                write_parquet_atomic(pl.DataFrame([row], schema=HISTORY_SCHEMA), work.history(step))
                work.save_checkpoint(trainer, step + 1)
                work.commit(step + 1)
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
) -> None:
    """Train a run to its last step (resuming a killed one) and write its outputs.

    Raises:
        Preempted: A signal stopped the run; its committed steps are kept for the rerun.

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
    """
    fingerprint = json.dumps(
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
    work = _WorkDir(outputs, fingerprint)
    if work.step is not None:
        logger.info("%s: resuming at step %d of %d", run.name, work.step, run.steps)
    trainer = open_trainer(run, base, weights, work)
    train(run, trainer, work, env, templates, base_seed, first_scenario, progress)
    work.publish()
