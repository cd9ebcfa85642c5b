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
from coordgap.data import CALL_COLUMNS, EPISODE_SCHEMA, STEP_SCHEMA, EpisodeSeeds, step_label
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
        "round1_right": 0,
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
# against the base model at N = 5, whose exact E[r1] must rise by 0.10 in every seed.
CONTROL = ControlConfig(run="control", model="base", policy="last", n=5, min_gain=0.10)
CONTROL_RUNS = ("control-s1", "control-s2", "control-s3")
# The control runs' steps, and the untrained model's exact E[r1] in their histories.
CONTROL_STEPS = 3
CONTROL_BASE = 0.2


def control_history(last: float | None) -> pl.DataFrame:
    """A control run's history: E[r1] after each update rising by 0.01 a step from the
    untrained model's ``CONTROL_BASE``, and ``last`` after the final one (None: a run that
    measured nothing, as under trainer art)."""
    exact = [CONTROL_BASE + 0.01 * (step + 1) for step in range(CONTROL_STEPS - 1)] + [last]
    return pl.DataFrame(
        {
            "step": range(CONTROL_STEPS),
            "r1_exact": exact if last is not None else [None] * CONTROL_STEPS,
            "r1_exact_base": [CONTROL_BASE if last is not None else None] * CONTROL_STEPS,
        },
        schema={"step": pl.Int64(), "r1_exact": pl.Float64(), "r1_exact_base": pl.Float64()},
    )


def reaching(
    model: str, rights: list[int], *, status: str = "ok", step: int | None = None
) -> list[dict[str, Any]]:
    """A cell of N = 5 episodes in which ``rights[i]`` seats reach for the right fork in
    round 1, played by checkpoint ``step`` (None: the base model)."""
    checkpoint = "base" if step is None else step_label(step)
    return [
        episode(model, 5, i, status=status) | {"round1_right": right, "checkpoint": checkpoint}
        for i, right in enumerate(rights)
    ]


def control_check(
    lasts: list[float | None],
    tests: list[list[int] | None] | None = None,
    step: int = CONTROL_STEPS,
) -> pl.DataFrame:
    """The control check of each seed's checkpoint ``step``, its run's final E[r1] ``lasts[i]``
    (``control_history``), beside its test cell ``tests[i]`` of round-1 right reaches (default
    2 of 5 in two episodes; [] only error episodes; None no episode) and the base model's cell
    (1 of 5 in three episodes)."""
    rows = reaching("base", [1, 1, 1])
    for run, test in zip(CONTROL_RUNS, tests or [[2, 2]] * len(CONTROL_RUNS), strict=True):
        if test is not None:
            cell = reaching(f"{run}@last", test, step=step)
            rows += cell or reaching(f"{run}@last", [0], status="error", step=step)
    histories = {run: control_history(last) for run, last in zip(CONTROL_RUNS, lasts, strict=True)}
    return control_table(frame(rows), histories, CONTROL)


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
