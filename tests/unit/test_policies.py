"""Scripted reference policies played through ``play_episode`` (no parquet involved)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import polars as pl
import pytest

from coordgap.config.play import EnvironmentConfig, ScriptedPolicy
from coordgap.data import EpisodeSeeds
from coordgap.env.observation import observe
from coordgap.env.protocols import IDLE_TOOL, TOOLS, Protocol
from coordgap.env.table import Table, TieBreak, TurnOrder
from coordgap.env.variants import RewardVariant, RewardWeights, reward_expr
from coordgap.episodes import EpisodeLog, play_episode
from coordgap.policies.scripted import make_scripted_policy

pytestmark = pytest.mark.unit

SIZES = range(2, 21)


def env_config(
    protocol: Protocol = Protocol.TOOLS6,
    turn_order: TurnOrder = TurnOrder.SIMULTANEOUS,
    tie_break: TieBreak = TieBreak.RANDOM,
) -> EnvironmentConfig:
    return EnvironmentConfig(
        protocol=protocol,
        turn_order=turn_order,
        tie_break=tie_break,
        rounds=5,
        deadlock_terminal=True,
        history=0,
    )


def play(env: EnvironmentConfig, n: int, policy: ScriptedPolicy, seed: int = 0) -> EpisodeLog:
    table_rng, policy_rng = EpisodeSeeds.derive(0, seed, 0, "test").generators()
    scripted = make_scripted_policy(policy, n, env.protocol, policy_rng)
    return play_episode(env, n, scripted, table_rng)


def paper_reward(log: EpisodeLog) -> float:
    frame = pl.DataFrame([log.row])
    return frame.select(reward_expr(RewardVariant.PAPER, RewardWeights())).item()


@pytest.mark.slow
@pytest.mark.parametrize("turn_order", list(TurnOrder))
def test_resource_hierarchy_never_deadlocks(turn_order: TurnOrder) -> None:
    """1,000 seeded episodes at every N from 2 to 20. The policy is deterministic; the seeds
    vary the random tie-breaks (simultaneous) and the seat order of each round (sequential)."""
    env = env_config(turn_order=turn_order)
    deadlocks = Counter()
    meals = 0
    for n in SIZES:
        for seed in range(1_000):
            row = play(env, n, ScriptedPolicy.RESOURCE_HIERARCHY, seed).row
            deadlocks[n] += row["deadlock"]
            meals += row["meals_total"]
    assert sum(deadlocks.values()) == 0, deadlocks
    assert meals > 0  # it did play: forks were taken and meals eaten


@pytest.mark.parametrize("protocol", list(Protocol))
@pytest.mark.parametrize("tie_break", list(TieBreak))
def test_left_first_deadlocks_in_round_one_when_simultaneous(protocol, tie_break) -> None:
    env = env_config(protocol=protocol, tie_break=tie_break)
    for n in SIZES:
        row = play(env, n, ScriptedPolicy.LEFT_FIRST).row
        assert row["deadlock_round"] == 1, n
        assert row["rounds_run"] == 1, n


@pytest.mark.parametrize("protocol", list(Protocol))
@pytest.mark.parametrize("turn_order", list(TurnOrder))
def test_silent_scores_exactly_one_with_only_empty_no_calls(protocol, turn_order) -> None:
    log = play(env_config(protocol, turn_order), 5, ScriptedPolicy.SILENT)
    assert paper_reward(log) == 1.0
    assert len(log.steps) == 5 * 5
    assert {(step["tool"], step["outcome"], step["reason"]) for step in log.steps} == {
        (None, "no_call", "empty")
    }
    assert (log.row["actions"], log.row["no_call"], log.row["meals_total"]) == (0, 25, 0)


@pytest.mark.parametrize("protocol", list(Protocol))
def test_think_only_scores_point_nine(protocol: Protocol) -> None:
    log = play(env_config(protocol), 5, ScriptedPolicy.THINK_ONLY)
    assert paper_reward(log) == pytest.approx(0.9)
    assert log.row["think"] == log.row["actions"] == 25
    assert {step["tool"] for step in log.steps} == {IDLE_TOOL[protocol].value}


def random_decisions(protocol: Protocol, seed: int, count: int) -> list:
    policy = make_scripted_policy(ScriptedPolicy.RANDOM, 5, protocol, np.random.default_rng(seed))
    table = Table(5, protocol, TieBreak.LOWEST_ID, np.random.default_rng(0))
    observations = [observe(table, i % 5, 1, 5) for i in range(count)]
    return [decision.tool for decision in policy.decide(observations)]


@pytest.mark.parametrize("protocol", list(Protocol))
def test_random_is_uniform_over_the_protocol_tools(protocol: Protocol) -> None:
    """12,000 draws: each tool's share is within 1.5 points of uniform (about 4 sd)."""
    draws = 12_000
    counts = Counter(random_decisions(protocol, seed=1, count=draws))
    assert set(counts) == set(TOOLS[protocol])
    expected = 1 / len(TOOLS[protocol])
    for tool, count in counts.items():
        assert abs(count / draws - expected) < 0.015, tool


@pytest.mark.parametrize("protocol", list(Protocol))
def test_random_is_seeded(protocol: Protocol) -> None:
    assert random_decisions(protocol, 7, 50) == random_decisions(protocol, 7, 50)
    assert random_decisions(protocol, 7, 50) != random_decisions(protocol, 8, 50)
