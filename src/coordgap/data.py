"""Data contracts: table schemas, seeds and generators, atomic parquet writes."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from coordgap.env.protocols import Tool

if TYPE_CHECKING:
    from collections.abc import Sequence

CALL_COLUMNS = tuple(f"calls_{tool.value}" for tool in Tool)

EPISODE_SCHEMA: dict[str, pl.DataType] = {
    "model": pl.String(),
    "checkpoint": pl.String(),
    "n": pl.Int64(),
    "episode": pl.Int64(),
    "seed": pl.Int64(),  # the table's seed: replays the table (see EpisodeSeeds)
    "scenario": pl.Int64(),
    "protocol": pl.String(),
    "turn_order": pl.String(),
    "tie_break": pl.String(),
    "rounds": pl.Int64(),
    "rounds_run": pl.Int64(),
    "status": pl.String(),
    "deadlock": pl.Boolean(),
    "deadlock_round": pl.Int64(),
    "deadlocks": pl.Int64(),
    "meals_total": pl.Int64(),
    "meals_per_philosopher": pl.List(pl.Int64()),
    # Rounds that ended with a philosopher holding both its forks, summed over philosophers:
    # chances to eat (a meal needs one), whether taken or not.
    "both_forks": pl.Int64(),
    **{column: pl.Int64() for column in CALL_COLUMNS},
    # Round-1 decisions that reach for the right fork (RIGHT_REACHES): the positive control's
    # reward reads them (coordgap.env.variants).
    "round1_right": pl.Int64(),
    "decisions": pl.Int64(),
    "actions": pl.Int64(),
    "think": pl.Int64(),
    "failed": pl.Int64(),
    "no_call": pl.Int64(),
    "truncated": pl.Int64(),  # no_call decisions cut off by the completion token limit
    "r_nd": pl.Float64(),
    "r_thru": pl.Float64(),
    "r_fair": pl.Float64(),
    "r_idle": pl.Float64(),
    "tokens_in": pl.Int64(),
    "tokens_out": pl.Int64(),
    "latency_s": pl.Float64(),
}

TRANSCRIPT_SCHEMA: dict[str, pl.DataType] = {
    "episode": pl.Int64(),
    "round": pl.Int64(),
    "philosopher": pl.Int64(),
    "messages": pl.String(),  # JSON list of {"role", "content"}
    "completion": pl.String(),
    "token_ids": pl.List(pl.Int64()),
    "logprobs": pl.List(pl.Float64()),
    "tools": pl.String(),  # JSON list of function schemas the server rendered, or null
    # The sampling policy (coordgap.policies.base.Transcript): its temperature, and for a
    # constrained decision every candidate call, its score, the choice and log mu(choice).
    "temperature": pl.Float64(),
    "candidates": pl.List(pl.List(pl.Int64())),
    "scores": pl.List(pl.Float64()),
    "choice": pl.Int64(),
    "choice_logprob": pl.Float64(),
}

STEP_SCHEMA: dict[str, pl.DataType] = {
    "episode": pl.Int64(),
    "round": pl.Int64(),
    "turn": pl.Int64(),
    "philosopher": pl.Int64(),
    "tool": pl.String(),
    "outcome": pl.String(),
    "reason": pl.String(),
    "raw": pl.String(),
}


# Every file and folder of one training step is named step_<kkkk>: its checkpoint, rollouts,
# history row, optimizer state and validation tables; the name is the checkpoint's value in
# the episode tables' ``checkpoint`` column too.
STEP_GLOB = "step_????"


def step_label(step: int) -> str:
    """The name of a step's checkpoint, tables and ``checkpoint`` column value."""
    return f"step_{step:04d}"


def label_step(label: str) -> int:
    """The step a ``step_label`` names (``step_0003`` -> 3)."""
    return int(label.removeprefix("step_"))


# The tables of a set of episodes by name (``n<N>.parquet``, ``.steps``, ``.transcripts``).
TABLE_SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "episodes": EPISODE_SCHEMA,
    "steps": STEP_SCHEMA,
    "transcripts": TRANSCRIPT_SCHEMA,
}


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from identifying parts, stable across platforms and Python versions.

    Episodes use (base seed, model, N, episode index); an LLM call adds (seat, round). Hashing
    (rather than adding offsets) keeps the streams of neighbouring cells unrelated and lets one
    cell be regenerated alone.

    Args:
        *parts: The identifying values, e.g. ``(seed, model, n, episode)``.

    Returns:
        A non-negative integer below 2**63.
    """
    key = "\x1f".join(str(part) for part in parts).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


@dataclass(frozen=True, slots=True)
class EpisodeSeeds:
    """The seeds of one episode: its scenario's, shared by every player of it, and its own.

    A scenario is the table's randomness (who wins a contested fork, the order of a sequential
    round), identified by an integer id from a configured range (``scenarios:``). The player's
    seed drives the policy's own randomness (a scripted policy's choices, an LLM's sampling).
    Every model at a cell thus plays the same scenarios, each with its own sampling.

    Attributes:
        scenario: The scenario id.
        table: Seeds the table's generator: derived from (base seed, scenario, N).
        policy: Seeds the player's randomness: derived from (table seed, player).
    """

    scenario: int
    table: int
    policy: int

    @classmethod
    def derive(cls, base_seed: int, scenario: int, n: int, player: str) -> EpisodeSeeds:
        """The seeds of ``player`` at scenario ``scenario`` of an ``n``-seat table.

        Args:
            base_seed: The config's ``seed``.
            scenario: The scenario id.
            n: Number of philosophers.
            player: Names whose sampling this is (a model, or a training rollout's member).

        Returns:
            The episode's seeds.
        """
        table = derive_seed(base_seed, "scenario", scenario, n)
        return cls(scenario=scenario, table=table, policy=derive_seed(table, player))

    def generators(self) -> tuple[np.random.Generator, np.random.Generator]:
        """The table's and the policy's generators."""
        return table_generator(self.table), np.random.default_rng(self.policy)


def table_generator(seed: int) -> np.random.Generator:
    """The table's generator of an episode, from its table's ``seed`` column.

    The table's stream alone decides contested forks and sequential turn order, so an episode
    can be replayed from its seed and its recorded decisions (``coordgap.analysis.timeline``).
    """
    return np.random.default_rng(seed)


def write_index(paths: Sequence[str | Path], out: str | Path) -> None:
    """Write a phase folder's table of contents: the sorted paths of its outputs, as JSON.

    DVC tracks each phase's folder as an output, so the folder must exist even when a study
    has nothing for the phase (no training run); the index is always there, and says what the
    phase produced.

    Args:
        paths: The phase's outputs.
        out: The index file.
    """
    Path(out).write_text(json.dumps({"outputs": sorted(map(str, paths))}, indent=2) + "\n")


def write_parquet_atomic(frame: pl.DataFrame, path: str | Path) -> None:
    """Write a parquet file so that readers never see a partial file.

    The frame goes to a temporary file in the destination folder, which then replaces the
    destination in one rename. The temporary name is unique but made by the writer itself, not
    by ``mkstemp``, whose files are private to their owner: a table gets the permissions the
    umask gives any new file, as every other output of ``results/`` does.

    Args:
        frame: The table to write.
        path: The destination.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        frame.write_parquet(tmp, statistics=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
