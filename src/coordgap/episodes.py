"""Play episodes and write a model x N cell as the episode and step tables of DESIGN.md §5."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from coordgap.data import (
    CALL_COLUMNS,
    EPISODE_SCHEMA,
    STEP_SCHEMA,
    derive_seed,
    write_parquet_atomic,
)
from coordgap.env.observation import PastTurn, observe
from coordgap.env.protocols import IDLE_TOOL
from coordgap.env.reward import components
from coordgap.env.table import Outcome, Table, TurnOrder
from coordgap.policies.scripted import make_scripted_policy

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from coordgap.config import EnvironmentConfig, ModelSpec
    from coordgap.policies.base import Decision, Policy


@dataclass
class EpisodeLog:
    """What one episode produced: its row of the episode table and its step rows."""

    row: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)


def episode_generators(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """The table's and the policy's generators of one episode, independent streams."""
    table_seq, policy_seq = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(table_seq), np.random.default_rng(policy_seq)


def play_episode(
    env: EnvironmentConfig,
    n: int,
    policy: Policy,
    table_rng: np.random.Generator,
) -> EpisodeLog:
    """Play one episode of ``env.rounds`` rounds (fewer after a terminal deadlock).

    Args:
        env: The table rules.
        n: Number of philosophers.
        policy: Decides for every philosopher; fresh per episode.
        table_rng: The table's generator (tie-breaks, sequential order).

    Returns:
        The episode's counts and step rows; the caller adds identity columns.
    """
    table = Table(n, env.protocol, env.tie_break, table_rng)
    history: list[deque[PastTurn]] = [deque(maxlen=env.history) for _ in range(n)]
    idle_tool = IDLE_TOOL[env.protocol]
    log = EpisodeLog(row={})
    calls: Counter[str] = Counter()
    outcomes: Counter[Outcome] = Counter()
    tokens_in = tokens_out = 0
    latency = 0.0
    deadlock_round = None
    deadlocks = 0
    rounds_run = 0

    def record(round_: int, turn: int, seat: int, decision: Decision, outcome, reason) -> None:
        nonlocal tokens_in, tokens_out, latency
        tool = None if decision.tool is None else decision.tool.value
        if tool is not None:
            calls[tool] += 1
        outcomes[outcome] += 1
        tokens_in += decision.tokens_in
        tokens_out += decision.tokens_out
        latency += decision.latency_s
        log.steps.append(
            {
                "round": round_,
                "turn": turn,
                "philosopher": seat,
                "tool": tool,
                "outcome": outcome.value,
                "reason": None if reason is None else str(reason),
                "raw": decision.raw,
            }
        )
        if env.history:
            history[seat].append(PastTurn(round_, tool, outcome.value, reason))

    def look(seat: int, round_: int):
        return observe(table, seat, round_, env.rounds, tuple(history[seat]))

    for round_ in range(1, env.rounds + 1):
        rounds_run = round_
        if env.turn_order is TurnOrder.SIMULTANEOUS:
            decisions = policy.decide([look(seat, round_) for seat in range(n)])
            results = table.resolve_simultaneous([d.tool for d in decisions])
            for seat, (decision, result) in enumerate(zip(decisions, results, strict=True)):
                reason = decision.no_call_reason if decision.tool is None else result.reason
                record(round_, seat, seat, decision, result.outcome, reason)
        else:
            for turn, seat in enumerate(table.seat_order()):
                (decision,) = policy.decide([look(seat, round_)])
                result = table.act(seat, decision.tool)
                reason = decision.no_call_reason if decision.tool is None else result.reason
                record(round_, turn, seat, decision, result.outcome, reason)
        if table.is_deadlocked():
            deadlocks += 1
            deadlock_round = deadlock_round or round_
            if env.deadlock_terminal:
                break
            table.release_all()

    think = calls[idle_tool.value]
    actions = outcomes[Outcome.OK] + outcomes[Outcome.FAILED]
    reward = components(
        n=n,
        rounds=env.rounds,
        meals=table.meals,
        deadlock=deadlocks > 0,
        actions=actions,
        think=think,
    )
    log.row = {
        "protocol": env.protocol.value,
        "turn_order": env.turn_order.value,
        "tie_break": env.tie_break.value,
        "rounds": env.rounds,
        "rounds_run": rounds_run,
        "status": "ok",
        "deadlock": deadlocks > 0,
        "deadlock_round": deadlock_round,
        "deadlocks": deadlocks,
        "meals_total": sum(table.meals),
        "meals_per_philosopher": list(table.meals),
        **{column: calls[column.removeprefix("calls_")] for column in CALL_COLUMNS},
        "decisions": sum(outcomes.values()),
        "actions": actions,
        "think": think,
        "failed": outcomes[Outcome.FAILED],
        "no_call": outcomes[Outcome.NO_CALL],
        "r_nd": reward.r_nd,
        "r_thru": reward.r_thru,
        "r_fair": reward.r_fair,
        "r_idle": reward.r_idle,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "latency_s": latency,
    }
    return log


def generate_cell(
    model: ModelSpec,
    n: int,
    env: EnvironmentConfig,
    episodes: int,
    base_seed: int,
    episodes_path: Path,
    steps_path: Path,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Play one model x N cell and write its episode and step tables atomically.

    Args:
        model: The model to play (scripted policies so far).
        n: Number of philosophers.
        env: The table rules.
        episodes: Episodes in the cell.
        base_seed: The config's seed; episode seeds derive from (seed, model, n, index).
        episodes_path: Destination of the episode table.
        steps_path: Destination of the step table.
        progress: Called with the number of episodes done after each episode.
    """
    rows: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for index in range(episodes):
        seed = derive_seed(base_seed, model.name, n, index)
        table_rng, policy_rng = episode_generators(seed)
        policy = make_scripted_policy(model.policy, n, env.protocol, policy_rng)
        log = play_episode(env, n, policy, table_rng)
        identity = {"model": model.name, "checkpoint": "base", "n": n, "episode": index}
        rows.append({**identity, "seed": seed, **log.row})
        steps.extend({"episode": index, **step} for step in log.steps)
        if progress is not None:
            progress(index + 1)
    write_parquet_atomic(pl.DataFrame(rows, schema=EPISODE_SCHEMA), episodes_path)
    write_parquet_atomic(pl.DataFrame(steps, schema=STEP_SCHEMA), steps_path)
