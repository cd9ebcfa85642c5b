"""Checkpoint selection on hand-made training curves and validation tables with known answers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pytest
import yaml

from coordgap.config.training import TrainingRunConfig
from coordgap.data import EPISODE_SCHEMA
from coordgap.evaluation.checkpoints import selection
from coordgap.evaluation.selection import (
    Estimate,
    SelectionPolicy,
    choose,
    estimates,
    select,
    step_rewards,
)
from tests.conftest import ROOT

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.unit

CONFIG = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
RUN = TrainingRunConfig.from_dict("run", {**CONFIG["training"]["runs"]["smollm2-grpo"], "steps": 4})
INTERVALS = {key: CONFIG["analysis"][key] for key in ("confidence", "bootstrap_resamples", "seed")}


def est(step: int, mean: float, low: float, high: float) -> Estimate:
    return Estimate(step, mean, low, high, 10)


# Training: steps 1 and 2 tie at the peak. Validation: step 2 has the best mean but a wide
# interval; step 4 a slightly lower mean and the best lower bound; steps 1 and 3 tie.
TRAINING = {0: est(0, 0.2, 0.1, 0.3), 1: est(1, 0.5, 0.4, 0.6), 2: est(2, 0.5, 0.3, 0.7),
            3: est(3, 0.1, 0.0, 0.2)}  # fmt: skip
VALIDATION = {0: est(0, 0.3, 0.2, 0.4), 1: est(1, 0.4, 0.3, 0.5), 2: est(2, 0.6, 0.1, 0.9),
              3: est(3, 0.4, 0.35, 0.45), 4: est(4, 0.55, 0.5, 0.6)}  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "step", "runner_up"),
    [
        (SelectionPolicy.LAST, 4, None),
        (SelectionPolicy.BEST_TRAIN, 1, 2),  # the tie goes to the earlier step
        (SelectionPolicy.BEST_VAL, 2, 4),
        (SelectionPolicy.LCB_VAL, 4, 3),
    ],
)
def test_each_policy_picks_its_known_step(
    policy: SelectionPolicy, step: int, runner_up: int | None
) -> None:
    choice = choose(policy, 4, TRAINING, VALIDATION)
    assert choice.step == step
    assert (None if choice.runner_up is None else choice.runner_up.step) == runner_up
    expected = TRAINING if policy is SelectionPolicy.BEST_TRAIN else VALIDATION
    assert choice.estimate == expected[step]


def test_validation_ties_go_to_the_earlier_step() -> None:
    tied = {step: est(step, 0.5, 0.4, 0.6) for step in (3, 1, 2)}
    for policy in (SelectionPolicy.BEST_VAL, SelectionPolicy.LCB_VAL):
        choice = choose(policy, 3, TRAINING, tied)
        assert (choice.step, choice.runner_up.step) == (1, 2)


def test_a_single_checkpoint_is_every_policy_s_choice() -> None:
    only = {0: est(0, 0.5, 0.4, 0.6)}
    for choice in select(list(SelectionPolicy), 0, only, only):
        assert choice.step == 0
        assert choice.runner_up is None


def test_last_without_its_validation_has_no_estimate_and_missing_estimates_fail() -> None:
    assert choose(SelectionPolicy.LAST, 5, TRAINING, VALIDATION).estimate is None
    with pytest.raises(ValueError, match="best_val has no estimates"):
        choose(SelectionPolicy.BEST_VAL, 4, TRAINING, {})


def test_a_one_episode_step_ranks_by_its_mean_under_lcb() -> None:
    lone = {0: Estimate(0, 0.9, float("nan"), float("nan"), 1), 1: est(1, 0.5, 0.45, 0.55)}
    assert choose(SelectionPolicy.LCB_VAL, 1, TRAINING, lone).step == 0


def _episodes(steps_rewards: dict[int, list[tuple[bool, int]]]) -> pl.DataFrame:
    """Episode rows per step from (deadlock, meals) pairs; the other counts are zero."""
    rows = []
    for step, outcomes in steps_rewards.items():
        for index, (deadlock, meals) in enumerate(outcomes):
            rows.append(
                {
                    "model": "run",
                    "checkpoint": f"step_{step:04d}",
                    "n": 5,
                    "episode": index,
                    "status": "ok",
                    "deadlock": deadlock,
                    "meals_total": meals,
                    "actions": 10,
                    "think": 0,
                    "no_call": 0,
                    "r_nd": 0.0 if deadlock else 1.0,
                    "r_thru": min(1.0, meals / 10),
                    "r_fair": 0.0,
                    "r_idle": 0.0,
                }
            )
    return pl.DataFrame(rows, schema=EPISODE_SCHEMA)


def test_step_rewards_use_the_trained_variant_and_estimates_bootstrap() -> None:
    episodes = _episodes({0: [(True, 0), (False, 0)], 3: [(False, 10), (False, 10)]})
    rewards = step_rewards(episodes, RUN)
    # Paper reward: 1.0 r_nd + 0.5 r_thru.
    np.testing.assert_allclose(rewards[0], [0.0, 1.0])
    np.testing.assert_allclose(rewards[3], [1.5, 1.5])
    found = estimates(rewards, *INTERVALS.values())
    assert (found[3].mean, found[3].ci_low, found[3].ci_high) == (1.5, 1.5, 1.5)
    assert found[0].ci_low < 0.5 < found[0].ci_high


def test_selection_from_episode_tables_has_every_choice_and_estimate(tmp_path: Path) -> None:
    rollouts = _episodes({0: [(True, 0)] * 3, 1: [(False, 4)] * 3, 2: [(False, 2)] * 3,
                          3: [(True, 0)] * 3})  # fmt: skip
    validation = _episodes({0: [(True, 0)] * 4, 2: [(False, 6)] * 4, 4: [(False, 4)] * 4})
    paths = {}
    for name, frame in (("train", rollouts), ("val", validation)):
        paths[name] = []
        for (step,), part in frame.partition_by("checkpoint", as_dict=True).items():
            paths[name].append(tmp_path / f"{name}_{step}.parquet")
            part.write_parquet(paths[name][-1])
    policies = ["last", "best_train", "best_val", "lcb_val"]
    found = selection(RUN, policies, paths["train"], paths["val"], INTERVALS)
    steps = {policy: choice["step"] for policy, choice in found["choices"].items()}
    assert steps == {"last": 4, "best_train": 1, "best_val": 2, "lcb_val": 2}
    assert found["choices"]["best_val"]["runner_up"]["step"] == 4
    assert [e["step"] for e in found["training"]] == [0, 1, 2, 3]
    assert [e["step"] for e in found["validation"]] == [0, 2, 4]
    # One policy alone chooses what it chooses among all.
    alone = selection(RUN, ["lcb_val"], paths["train"], paths["val"], INTERVALS)
    assert alone["choices"] == {"lcb_val": found["choices"]["lcb_val"]}
