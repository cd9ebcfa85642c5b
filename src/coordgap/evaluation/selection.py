"""Checkpoint selection: which step of a run each policy keeps, and why.

Every estimate is the mean episode reward under the run's trained variant and weights, with the
statistics' interval (``coordgap.intervals.mean_interval``: Wilson's when every reward is 0 or 1,
the percentile bootstrap's otherwise). A step's training
estimate comes from the rollouts it played (checkpoint ``k`` plays step ``k``'s rollouts; the
last checkpoint plays none); its validation estimate from the validation episodes it played.

Policies:

* ``last``: the final checkpoint, as the paper kept it;
* ``best_train``: the highest training estimate (the peak of the training curve);
* ``best_val``: the highest validation mean;
* ``lcb_val``: the highest lower bound of the validation interval, which prefers a step that
  is good on more of its episodes over one that is best by luck.

Ties go to the earlier step. Each choice is recorded with its estimate and the runner-up (the
best other step under the same criterion), so a reader sees how close the choice was.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from coordgap.env.variants import reward_expr
from coordgap.intervals import mean_interval

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from coordgap.config.training import TrainingRunConfig


class SelectionPolicy(StrEnum):
    """How a checkpoint is chosen."""

    LAST = "last"
    BEST_TRAIN = "best_train"
    BEST_VAL = "best_val"
    LCB_VAL = "lcb_val"


@dataclass(frozen=True, slots=True)
class Estimate:
    """A step's mean reward with its interval, over ``episodes`` episodes."""

    step: int
    mean: float
    ci_low: float
    ci_high: float
    episodes: int


@dataclass(frozen=True, slots=True)
class Choice:
    """What one policy chose.

    Attributes:
        policy: The policy.
        step: The chosen checkpoint.
        estimate: The estimate the choice rests on (training for ``best_train``, validation
            otherwise; None when the chosen step has none, e.g. ``last`` without validation).
        runner_up: The best other step under the same criterion, if any.
    """

    policy: SelectionPolicy
    step: int
    estimate: Estimate | None
    runner_up: Estimate | None


def step_rewards(episodes: pl.DataFrame, run: TrainingRunConfig) -> dict[int, np.ndarray]:
    """Each step's episode rewards under the run's trained variant and weights.

    Args:
        episodes: Episode rows whose ``checkpoint`` column names their step (``step_0003``).
        run: The training run.

    Returns:
        Step -> rewards of its ``ok`` episodes.
    """
    rewarded = episodes.filter(pl.col("status") == "ok").select(
        pl.col("checkpoint").str.strip_prefix("step_").cast(pl.Int64).alias("step"),
        reward_expr(run.variant, run.weights),
    )
    return {
        int(step): frame["reward"].to_numpy()
        for (step,), frame in rewarded.partition_by("step", as_dict=True).items()
    }


def estimates(
    rewards: Mapping[int, np.ndarray], confidence: float, resamples: int, seed: int
) -> dict[int, Estimate]:
    """An estimate per step (the statistics' estimator, ``analysis:`` settings).

    Args:
        rewards: Step -> episode rewards.
        confidence: Coverage of the intervals.
        resamples: Bootstrap resamples of a step whose rewards are not all 0 or 1.
        seed: Seed of the resampling.

    Returns:
        Step -> estimate, in step order.
    """
    result = {}
    for step in sorted(rewards):
        mean, low, high = mean_interval(rewards[step], confidence, resamples, seed)
        result[step] = Estimate(step, mean, low, high, int(rewards[step].size))
    return result


def _best(
    candidates: Mapping[int, Estimate], key: Callable[[Estimate], float]
) -> tuple[Estimate, Estimate | None]:
    """The best estimate by ``key`` (ties: the earlier step) and the best of the others."""
    ranked = sorted(candidates.values(), key=lambda e: (-key(e), e.step))
    return ranked[0], ranked[1] if len(ranked) > 1 else None


def _mean(estimate: Estimate) -> float:
    return estimate.mean


def _bound(estimate: Estimate) -> float:
    # A step with a single episode has no interval: its bound counts as its mean.
    return estimate.mean if np.isnan(estimate.ci_low) else estimate.ci_low


# What each policy ranks: the estimates it reads and the score it maximises (``last`` ranks
# nothing). The schema's policies are tested against these keys; a policy without an entry
# raises rather than falling through to another.
RANKINGS: dict[SelectionPolicy, tuple[str, Callable[[Estimate], float]] | None] = {
    SelectionPolicy.LAST: None,
    SelectionPolicy.BEST_TRAIN: ("training", _mean),
    SelectionPolicy.BEST_VAL: ("validation", _mean),
    SelectionPolicy.LCB_VAL: ("validation", _bound),
}


def choose(
    policy: SelectionPolicy,
    last: int,
    training: Mapping[int, Estimate],
    validation: Mapping[int, Estimate],
) -> Choice:
    """Apply one policy.

    Args:
        policy: The policy.
        last: The run's final checkpoint.
        training: Step -> training estimate.
        validation: Step -> validation estimate (the evaluated checkpoints).

    Returns:
        The choice.

    Raises:
        KeyError: A policy without a ranking.
        ValueError: The policy needs estimates that are missing.
    """
    ranking = RANKINGS[policy]
    if ranking is None:
        return Choice(policy, last, validation.get(last), None)
    estimates, score = ranking
    candidates = {"training": training, "validation": validation}[estimates]
    if not candidates:
        raise ValueError(f"selection policy {policy} has no estimates to choose from")
    best, runner_up = _best(candidates, score)
    return Choice(policy, best.step, best, runner_up)


def select(
    policies: list[SelectionPolicy],
    last: int,
    training: Mapping[int, Estimate],
    validation: Mapping[int, Estimate],
) -> list[Choice]:
    """Apply every policy (see ``choose``)."""
    return [choose(policy, last, training, validation) for policy in policies]


def summary(
    choices: list[Choice],
    run: TrainingRunConfig,
    training: Mapping[int, Estimate],
    validation: Mapping[int, Estimate],
) -> dict[str, Any]:
    """Every choice and every estimate of a run, as JSON values (``selection.json``).

    Args:
        choices: The choices.
        run: The training run.
        training: Step -> training estimate.
        validation: Step -> validation estimate.

    Returns:
        ``run``, ``reward``, ``last``, ``choices`` (policy -> step, estimate, runner-up),
        ``training`` and ``validation`` (every step's estimate).
    """
    return {
        "run": run.name,
        "reward": {"variant": str(run.variant), "weights": asdict(run.weights)},
        "last": run.steps,
        "choices": {
            str(c.policy): {
                "step": c.step,
                "estimate": _plain(c.estimate),
                "runner_up": _plain(c.runner_up),
            }
            for c in choices
        },
        "training": [_plain(e) for e in training.values()],
        "validation": [_plain(e) for e in validation.values()],
    }


def _plain(estimate: Estimate | None) -> dict[str, Any] | None:
    """An estimate as JSON values (an undefined bound becomes null, never NaN)."""
    if estimate is None:
        return None
    values = asdict(estimate)
    return {k: None if isinstance(v, float) and np.isnan(v) else v for k, v in values.items()}
