"""Episode tables for the analysis tests: hand-made rows, and real scripted episodes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from coordgap.analysis.comparisons import write_comparisons, write_power
from coordgap.analysis.control import control_table
from coordgap.analysis.monitors import write_monitors
from coordgap.analysis.stats import StatsOutputs, write_stats
from coordgap.config.analysis import (
    AnalysisConfig,
    ComparisonConfig,
    ControlConfig,
    MonitorConfig,
    PowerConfig,
)
from coordgap.config.play import EnvironmentConfig, ScriptedPolicy
from coordgap.data import CALL_COLUMNS, EPISODE_SCHEMA, STEP_SCHEMA, EpisodeSeeds
from coordgap.env.protocols import Protocol
from coordgap.env.reward import components
from coordgap.env.table import TieBreak, TurnOrder
from coordgap.env.variants import RewardVariant, RewardWeights
from coordgap.episodes import play_episode
from coordgap.policies.scripted import make_scripted_policy

ROUNDS = 5
PAPER_REFERENCE = Path(__file__).resolve().parents[2] / "config" / "paper_reference.yaml"

CONFIG = AnalysisConfig(
    weights=RewardWeights(),
    variants=(RewardVariant.PAPER, RewardVariant.SHAPED),
    confidence=0.95,
    bootstrap_resamples=2000,
    seed=11,
)

POWER = PowerConfig(effect_size=0.5, alpha=0.05, power=0.8)

COMPARE = ComparisonConfig(
    analysis=CONFIG,
    comparisons=(("hierarchy", "left_first"), ("hierarchy", "silent"), ("silent", "idle")),
    power=POWER,
)

MONITORS = MonitorConfig(
    weights=RewardWeights(),
    degenerate_reward=0.8,
    thresholds={
        "degenerate_share": 0.5,
        "all_think_share": 0.5,
        "no_call_rate": 0.5,
        "truncated_rate": 0.01,
        "starvation_share": 0.5,
    },
)

ENV = EnvironmentConfig(
    protocol=Protocol.TOOLS6,
    turn_order=TurnOrder.SIMULTANEOUS,
    tie_break=TieBreak.RANDOM,
    rounds=ROUNDS,
    deadlock_terminal=True,
    history=0,
)


def episode(
    model: str,
    n: int,
    index: int,
    *,
    meals: list[int] | None = None,
    deadlock: bool = False,
    think: int = 0,
    failed: int = 0,
    no_call: int = 0,
    truncated: int = 0,
    status: str = "ok",
    tokens: tuple[int, int, float] = (0, 0, 0.0),
) -> dict[str, Any]:
    """Make one episode row whose reward components follow from its counts.

    ``truncated`` of the ``no_call`` decisions were cut off by the token limit.
    """
    meals = meals if meals is not None else [0] * n
    eaten = sum(meals)
    actions = think + eaten + failed  # every meal is one successful eat call
    parts = components(
        n=n, rounds=ROUNDS, meals=meals, deadlock=deadlock, actions=actions, think=think
    )
    calls = dict.fromkeys(CALL_COLUMNS, 0)
    calls |= {"calls_eat": eaten, "calls_think": think, "calls_pick_up_left": failed}
    tokens_in, tokens_out, latency = tokens
    return {
        "model": model,
        "checkpoint": "base",
        "n": n,
        "episode": index,
        "seed": 1000 + index,
        "protocol": "tools6",
        "turn_order": "simultaneous",
        "tie_break": "random",
        "rounds": ROUNDS,
        "rounds_run": 2 if deadlock else ROUNDS,
        "status": status,
        "deadlock": deadlock,
        "deadlock_round": 2 if deadlock else None,
        "deadlocks": int(deadlock),
        "meals_total": eaten,
        "meals_per_philosopher": meals,
        "both_forks": eaten,  # each meal's round ends with the eater holding both forks
        **calls,
        "decisions": actions + no_call,
        "actions": actions,
        "think": think,
        "failed": failed,
        "no_call": no_call,
        "truncated": truncated,
        "r_nd": parts.r_nd,
        "r_thru": parts.r_thru,
        "r_fair": parts.r_fair,
        "r_idle": parts.r_idle,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "latency_s": latency,
    }


def frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Build an episode table with the contract's dtypes."""
    return pl.DataFrame(rows, schema=EPISODE_SCHEMA)


# The positive control of the control tests: arm `control`, its seeds' `last` checkpoints
# against the base model at N = 5, which must rise by 0.10 in every seed.
CONTROL = ControlConfig(run="control", model="base", policy="last", n=5, min_gain=0.10)
CONTROL_RUNS = ("control-s1", "control-s2", "control-s3")
# Decisions of each control episode: 5 seats x 5 rounds x 2, so that shares are fiftieths.
CONTROL_DECISIONS = 50


def reaching(model: str, rights: list[int], *, status: str = "ok") -> list[dict[str, Any]]:
    """A cell of N = 5 episodes whose decisions reach for the right fork ``rights[i]`` times of
    ``CONTROL_DECISIONS`` each, the rest for the left fork, and no meal or deadlock."""
    return [
        episode(model, 5, i, status=status)
        | {
            "calls_pick_up_right": right,
            "calls_pick_up_left": CONTROL_DECISIONS - right,
            "decisions": CONTROL_DECISIONS,
        }
        for i, right in enumerate(rights)
    ]


def control_check(seeds: list[list[int]], base: list[int]) -> pl.DataFrame:
    """The control check of the base model's cell ``base`` and each seed's ``last`` cell,
    their episodes' right-fork reaches out of ``CONTROL_DECISIONS`` (an empty seed: only
    error episodes)."""
    rows = reaching("base", base)
    for run, rights in zip(CONTROL_RUNS, seeds, strict=True):
        rows += reaching(f"{run}@last", rights) or reaching(f"{run}@last", [0], status="error")
    return control_table(frame(rows), CONTROL_RUNS, CONTROL)


def table(sizes: tuple[int, ...] = (5,)) -> pl.DataFrame:
    """Four models with distinct behaviour: varied, deadlocking, silent and idle."""
    rows = []
    for n in sizes:
        for i in range(6):
            rows.append(episode("hierarchy", n, i, meals=[1 + i % 3] + [1] * (n - 1), think=i))
            rows.append(
                episode(
                    "left_first",
                    n,
                    i,
                    meals=[i % 2] + [0] * (n - 1),
                    deadlock=i % 3 != 0,
                    failed=i,
                )
            )
            rows.append(episode("silent", n, i, no_call=n * ROUNDS))
            rows.append(episode("idle", n, i, think=n * ROUNDS))
    return frame(rows)


def scripted(
    policy: str, n: int, episodes: int, env: EnvironmentConfig = ENV, model: str | None = None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Play real episodes of a scripted policy, as the runner would record them.

    Returns:
        The episode table and the steps table.
    """
    name = model or policy
    rows, steps = [], []
    for index in range(episodes):
        seeds = EpisodeSeeds.derive(7, index, n, name)
        table_rng, policy_rng = seeds.generators()
        log = play_episode(
            env,
            n,
            make_scripted_policy(ScriptedPolicy(policy), n, env.protocol, policy_rng),
            table_rng,
        )
        tables = log.tables(model=name, checkpoint="base", n=n, episode=index, seeds=seeds)
        rows += tables["episodes"]
        steps += tables["steps"]
    return pl.DataFrame(rows, schema=EPISODE_SCHEMA), pl.DataFrame(steps, schema=STEP_SCHEMA)


@dataclass(frozen=True)
class Written:
    """Every statistics table of an episode table, written as by the workflow."""

    stats: StatsOutputs
    comparisons: Path
    power: Path
    monitors: Path


def write_tables(
    episodes: pl.DataFrame, folder: Path, compare: ComparisonConfig = COMPARE
) -> Written:
    """Write an episode table and every statistics table of it into ``folder``."""
    folder.mkdir(parents=True)
    path = folder / "episodes.parquet"
    episodes.write_parquet(path)
    names = ("summary", "components", "seats", "episode_rewards")
    metrics = {model: folder / "metrics" / f"{model}.json" for model in episodes["model"].unique()}
    stats = StatsOutputs(*(folder / f"{name}.csv" for name in names), metrics)
    write_stats([path], compare.analysis, stats)
    written = Written(
        stats, folder / "comparisons.csv", folder / "power.csv", folder / "monitors.csv"
    )
    write_comparisons([path], compare, written.comparisons)
    write_power(stats.summary, PAPER_REFERENCE, compare.power, written.power)
    write_monitors([path], MONITORS, written.monitors)
    return written
