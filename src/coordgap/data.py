"""Data contracts (DESIGN.md §5): table schemas, seeds and generators, atomic parquet writes."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

from coordgap.env.protocols import Tool

CALL_COLUMNS = tuple(f"calls_{tool.value}" for tool in Tool)

EPISODE_SCHEMA: dict[str, pl.DataType] = {
    "model": pl.String(),
    "checkpoint": pl.String(),
    "n": pl.Int64(),
    "episode": pl.Int64(),
    "seed": pl.Int64(),
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
    **{column: pl.Int64() for column in CALL_COLUMNS},
    "decisions": pl.Int64(),
    "actions": pl.Int64(),
    "think": pl.Int64(),
    "failed": pl.Int64(),
    "no_call": pl.Int64(),
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


def episode_generators(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """The table's and the policy's generators of one episode, independent streams.

    The table's stream alone decides contested forks and sequential turn order, so an episode
    can be replayed from its seed and its recorded decisions (``coordgap.analysis.timeline``).
    """
    table_seq, policy_seq = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(table_seq), np.random.default_rng(policy_seq)


def write_parquet_atomic(frame: pl.DataFrame, path: str | Path) -> None:
    """Write a parquet file so that readers never see a partial file.

    The frame goes to a temporary file in the destination folder, which then replaces the
    destination in one rename.

    Args:
        frame: The table to write.
        path: The destination.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        frame.write_parquet(tmp, statistics=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
