"""Episode reward components, computed during play from an episode's counts.

Per episode, with N philosophers, R configured rounds, M total meals, m_i the meals of
philosopher i, A the number of actions taken (think plus successful and failed tool calls;
``no_call`` decisions are not actions) and T the number of think (or wait) actions:

* ``r_nd   = 1`` if the episode never deadlocked, else ``0``
* ``r_thru = min(1, M / (floor(N/2) * R))`` — at most floor(N/2) philosophers eat in a round
* ``r_fair = var(m) / var_max`` with population variance and ``var_max = M^2 (N-1) / N^2``
  (every meal to one philosopher); ``0`` when ``M = 0``. 0 is fair, 1 is one philosopher eating.
* ``r_idle = T / A``, and ``0`` when ``A = 0``

Episodes store these components and the counts; ``coordgap.env.variants`` combines them into
rewards at analysis (and training) time, so a new weight set or variant never replays episodes,
and play-time code never imports it. These normalisations are ours: the paper names the terms
and weights but not how each is scaled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


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
