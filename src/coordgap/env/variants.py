"""Reward variants: one reward per episode from its stored components and counts.

The components (``coordgap.env.reward``) are computed during play; the variants combine them
later, in the analysis and in training, so that this module's formulas never replay an
episode. With weights ``w`` (the paper's: nd 1.0, thru 0.5, fair 0.3, idle 0.1) and C the number
of ``no_call`` decisions of an episode:

* ``paper``:  ``r = w_nd r_nd + w_thru r_thru - w_fair r_fair - w_idle r_idle``. An episode with
  no action and no deadlock scores exactly ``w_nd`` = 1.0: the degenerate maximum.
* ``shaped`` (intervention 1): the no-deadlock bonus counts only if ``M >= 1``, and ``no_call``
  counts as idle: ``r_idle' = (T + C) / (A + C)``, 0 when ``A + C = 0``.
* ``progress`` (intervention 1 for a model that never eats): ``shaped``, with partial credit
  for getting ready to eat, and fairness judged against what the meals allow. With B the rounds
  that ended with a philosopher holding both its forks (summed over philosophers; a meal needs
  one), the no-deadlock bonus counts if ``M + B >= 1``, throughput credits each such round as
  half a meal, ``r_thru' = min(1, (M + B / 2) / (floor(N/2) R))``, and unfairness counts only
  beyond the most even split of M meals: with ``v`` the meals' variance, ``v_max`` its maximum
  (every meal to one philosopher) and ``v_min = r (N - r) / N^2`` for ``r = M mod N`` (the
  most even split), ``r_fair' = (v - v_min) / (v_max - v_min)``, 0 when ``v_max = v_min`` (as
  for ``M <= 1``). Under ``paper`` and ``shaped`` an episode's first meal costs more in
  fairness (``w_fair``, 0.3: one philosopher ate every meal) than it adds in throughput (0.05 at
  N = 5), and a policy that never eats earns only the idle penalty under ``shaped``, so if it
  never thinks either GRPO has nothing to compare; ``progress`` ranks such episodes by how
  close they came to a meal, and a meal pays more than readiness alone.

One variant is no coordination reward at all:

* ``control``, the **positive control**: the share of the N seats whose round-1 decision
  reaches for the right fork, ``r = round1_right / N`` (``pick_up_right``, or the dpbench4
  protocol's ``grab_right``). It ignores the weights and has no components. Under simultaneous
  turns every seat decides round 1 from the table's initial state (no fork held, every fork
  free, no meal, no history), the same whatever the policy, so the reward's expectation is the
  mean over seats of mu(right | the seat's round-1 prompt): linear in the policy it trains, and
  computed exactly by N forward passes (``coordgap.training.probe``), which the training
  history records after every update and ``analysis.control`` checks. The untrained
  SmolLM2-135M reaches right in 0.24 of its round-1 decisions at N = 5 (left in 0.76), so GRPO
  samples the behaviour it rewards: a run trained on it measures whether a study's training
  budget can move the policy at all.
  It replaced a share of all the episode's decisions that reach right, whose later rounds
  depend on the policy's earlier ones and on its neighbours': that reward's expectation had no
  closed form, its test-episode estimate was noisy, and the study of 2026-12-06 failed on it.
  It says nothing about coordination, so no coordination statistic or finding uses it
  (``coordgap.config.checks`` refuses it in ``reward.variants``, whose first entry is the
  report's headline).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from enum import StrEnum
from functools import reduce
from typing import Any

import polars as pl


class RewardVariant(StrEnum):
    """A way to combine the stored components into one reward."""

    PAPER = "paper"
    SHAPED = "shaped"
    PROGRESS = "progress"
    CONTROL = "control"


@dataclass(frozen=True, slots=True)
class RewardWeights:
    """Weights of the four components; the defaults are the paper's."""

    nd: float = 1.0
    thru: float = 0.5
    fair: float = 0.3
    idle: float = 0.1

    @classmethod
    def from_dict(cls, reward: dict[str, Any]) -> RewardWeights:
        """Build from a validated ``reward`` section (the study's or a run's): its weights."""
        return cls(**{name: float(value) for name, value in reward["weights"].items()})


# Rewards are rounded to this many places: two episodes with the same outcome whose weighted
# sums differ by floating-point noise (~1e-16) must get the same reward, or GRPO's advantages,
# a rank test's ties and a sample's "zero variance" would tell them apart.
REWARD_DECIMALS = 9

# Rewards that differ by less than this are equal. Two rewards rounded to REWARD_DECIMALS places
# are the same float or at least one unit of the last place (1e-9) apart, so half a unit tells
# the two cases apart whatever float error the arithmetic on them adds (a sum of three 0.2s is
# 0.6000000000000001).
REWARD_TOLERANCE = 0.5 * 10.0**-REWARD_DECIMALS

# Each weighted component enters the reward with this sign: two rewards, then two penalties.
# The keys are the fields of RewardWeights.
SIGNS: dict[str, float] = {"nd": 1.0, "thru": 1.0, "fair": -1.0, "idle": -1.0}


def _paper_components() -> dict[str, pl.Expr]:
    """The stored components as they are."""
    return {
        "nd": pl.col("r_nd"),
        "thru": pl.col("r_thru"),
        "fair": pl.col("r_fair"),
        "idle": pl.col("r_idle"),
    }


def _shaped_components() -> dict[str, pl.Expr]:
    """No no-deadlock bonus without a meal; ``no_call`` decisions count as idle."""
    idle = pl.col("think") + pl.col("no_call")
    decided = pl.col("actions") + pl.col("no_call")
    return {
        "nd": pl.when(pl.col("meals_total") >= 1).then(pl.col("r_nd")).otherwise(0.0),
        "thru": pl.col("r_thru"),
        "fair": pl.col("r_fair"),
        "idle": pl.when(decided > 0).then(idle / decided).otherwise(0.0),
    }


def _progress_components() -> dict[str, pl.Expr]:
    """``shaped``, with readiness to eat as progress and fairness against the most even split."""
    n, meals = pl.col("n"), pl.col("meals_total")
    spread = meals % n
    most_even = spread * (n - spread) / n**2
    all_to_one = meals**2 * (n - 1) / n**2
    unfair = pl.col("r_fair") * all_to_one - most_even
    return _shaped_components() | {
        "nd": pl.when(meals + pl.col("both_forks") >= 1).then(pl.col("r_nd")).otherwise(0.0),
        "thru": pl.min_horizontal(
            (meals + pl.col("both_forks") / 2) / ((n // 2) * pl.col("rounds")), pl.lit(1.0)
        ),
        "fair": pl.when(all_to_one > most_even)
        .then((unfair / (all_to_one - most_even)).clip(0.0, 1.0))
        .otherwise(0.0),
    }


def _round1_right_share() -> pl.Expr:
    """The ``control`` reward: the share of seats whose round-1 decision reaches right."""
    return pl.col("round1_right") / pl.col("n")


# Every coordination variant's components, one entry each; a variant without an entry raises
# rather than falling through to another. The positive control has none (reward_expr).
VARIANT_COMPONENTS = {
    RewardVariant.PAPER: _paper_components,
    RewardVariant.SHAPED: _shaped_components,
    RewardVariant.PROGRESS: _progress_components,
}


def component_exprs(variant: RewardVariant) -> dict[str, pl.Expr]:
    """Polars expressions for a variant's four components, each in [0, 1], before weighting.

    The table needs the columns ``r_nd``, ``r_thru``, ``r_fair``, ``r_idle``, ``meals_total``,
    ``actions``, ``think``, ``no_call``, and for ``progress`` ``n``, ``rounds`` and
    ``both_forks`` (the episode contract of ``coordgap.data``).

    Args:
        variant: Which reward's components.

    Returns:
        One expression per key of ``SIGNS``, in its order.

    Raises:
        KeyError: For a variant without components (``control``).
    """
    return VARIANT_COMPONENTS[variant]()


def reward_expr(variant: RewardVariant, weights: RewardWeights) -> pl.Expr:
    """A polars expression for the reward of each row of an episode table.

    Args:
        variant: Which reward to compute.
        weights: The component weights.

    Returns:
        A float expression named ``reward``, rounded to ``REWARD_DECIMALS`` places: the signed,
        weighted sum of :func:`component_exprs`, or for ``control`` the share of seats whose
        round-1 decision reaches for the right fork (the weights unused). The table needs the
        columns of :func:`component_exprs`, or for ``control`` ``round1_right`` and ``n``.
    """
    if variant == RewardVariant.CONTROL:
        reward = _round1_right_share()
    else:
        reward = reduce(
            operator.add,
            [
                SIGNS[name] * getattr(weights, name) * expr
                for name, expr in component_exprs(variant).items()
            ],
        )
    return reward.round(REWARD_DECIMALS).alias("reward")
