"""Episode reward: its four components, and the ``paper`` and ``shaped`` variants.

Per episode, with N philosophers, R configured rounds, M total meals, m_i the meals of
philosopher i, A the number of actions taken (think plus successful and failed tool calls;
``no_call`` decisions are not actions), T the number of think (or wait) actions and C the
number of ``no_call`` decisions:

* ``r_nd   = 1`` if the episode never deadlocked, else ``0``
* ``r_thru = min(1, M / (floor(N/2) * R))`` — at most floor(N/2) philosophers eat in a round
* ``r_fair = var(m) / var_max`` with population variance and ``var_max = M^2 (N-1) / N^2``
  (every meal to one philosopher); ``0`` when ``M = 0``. 0 is fair, 1 is one philosopher eating.
* ``r_idle = T / A``, and ``0`` when ``A = 0``

Variants, with weights ``w`` (the paper's: nd 1.0, thru 0.5, fair 0.3, idle 0.1):

* ``paper``:  ``r = w_nd r_nd + w_thru r_thru - w_fair r_fair - w_idle r_idle``. An episode with
  no action and no deadlock scores exactly ``w_nd`` = 1.0: the degenerate maximum.
* ``shaped`` (intervention 1): the no-deadlock bonus counts only if ``M >= 1``, and ``no_call``
  counts as idle: ``r_idle' = (T + C) / (A + C)``, 0 when ``A + C = 0``.

Episodes store the components and the counts; rewards are derived here at analysis time, so a
new weight set or variant never requires replaying episodes. These normalisations are ours: the
paper names the terms and weights but not how each is scaled.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from enum import StrEnum
from functools import reduce
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from collections.abc import Sequence


class RewardVariant(StrEnum):
    """A way to combine the stored components into one reward."""

    PAPER = "paper"
    SHAPED = "shaped"


@dataclass(frozen=True, slots=True)
class RewardWeights:
    """Weights of the four components; the defaults are the paper's."""

    nd: float = 1.0
    thru: float = 0.5
    fair: float = 0.3
    idle: float = 0.1


@dataclass(frozen=True, slots=True)
class RewardComponents:
    """The four per-episode components, each in [0, 1]."""

    r_nd: float
    r_thru: float
    r_fair: float
    r_idle: float


def components(
    *, n: int, rounds: int, meals: Sequence[int], deadlock: bool, actions: int, think: int
) -> RewardComponents:
    """Compute the paper components of one episode from its counts.

    Args:
        n: Number of philosophers.
        rounds: Configured rounds per episode (R), not the rounds actually played.
        meals: Meals per philosopher.
        deadlock: Whether the episode deadlocked.
        actions: Actions taken (A): think plus successful and failed tool calls.
        think: Think (idle) actions (T).

    Returns:
        The four components.
    """
    total = sum(meals)
    capacity = (n // 2) * rounds
    r_thru = min(1.0, total / capacity)
    if total == 0:
        r_fair = 0.0
    else:
        mean = total / n
        variance = sum((m - mean) ** 2 for m in meals) / n
        r_fair = variance / (total**2 * (n - 1) / n**2)
    return RewardComponents(
        r_nd=0.0 if deadlock else 1.0,
        r_thru=r_thru,
        r_fair=r_fair,
        r_idle=think / actions if actions else 0.0,
    )


# Each weighted component enters the reward with this sign: two rewards, then two penalties.
# The keys are the fields of RewardWeights.
SIGNS: dict[str, float] = {"nd": 1.0, "thru": 1.0, "fair": -1.0, "idle": -1.0}


def component_exprs(variant: RewardVariant) -> dict[str, pl.Expr]:
    """Polars expressions for a variant's four components, each in [0, 1], before weighting.

    The table needs the columns ``r_nd``, ``r_thru``, ``r_fair``, ``r_idle``, ``meals_total``,
    ``actions``, ``think`` and ``no_call`` (the episode contract of ``coordgap.data``).

    Args:
        variant: Which reward's components.

    Returns:
        One expression per key of ``SIGNS``, in its order.
    """
    if variant is RewardVariant.PAPER:
        r_nd = pl.col("r_nd")
        r_idle = pl.col("r_idle")
    else:
        r_nd = pl.when(pl.col("meals_total") >= 1).then(pl.col("r_nd")).otherwise(0.0)
        idle = pl.col("think") + pl.col("no_call")
        decided = pl.col("actions") + pl.col("no_call")
        r_idle = pl.when(decided > 0).then(idle / decided).otherwise(0.0)
    return {"nd": r_nd, "thru": pl.col("r_thru"), "fair": pl.col("r_fair"), "idle": r_idle}


def reward_expr(variant: RewardVariant, weights: RewardWeights) -> pl.Expr:
    """A polars expression for the reward of each row of an episode table.

    Args:
        variant: Which reward to compute.
        weights: The component weights.

    Returns:
        A float expression named ``reward``: the signed, weighted sum of
        :func:`component_exprs`.
    """
    terms = [
        SIGNS[name] * getattr(weights, name) * expr
        for name, expr in component_exprs(variant).items()
    ]
    return reduce(operator.add, terms).alias("reward")
