"""GRPO training with ART's math: interop with our transcripts, advantage semantics, learning.

These run the real SmolLM2-135M and ART 0.5.18's own preprocessing and loss on the CPU.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
import yaml

from coordgap.config import EnvironmentConfig, TrainingRunConfig
from coordgap.env.observation import PromptTemplates
from coordgap.env.protocols import TOOLS, Protocol, Tool
from coordgap.training._art import art
from coordgap.training.grpo import TorchGRPOTrainer
from coordgap.training.loop import play_rollouts, rollout_rewards
from coordgap.training.trajectories import philosopher_trajectory, trajectory_groups
from tests.unit.test_local_model import BFLOAT16_BOUND, table_conversations

if TYPE_CHECKING:
    import polars as pl

    from coordgap.policies.base import Decision

pytestmark = [pytest.mark.unit]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
BASE = CONFIG["models"]["smollm2-135m"]
RUN = CONFIG["training"]["runs"]["smollm2-grpo"]
TEMPLATES = PromptTemplates.load(ROOT / "config" / "prompts")
SIX = TOOLS[Protocol.TOOLS6]


def tiny_run(**changes: object) -> TrainingRunConfig:
    """The default run's recipe, shrunk: 1 group of 2 episodes at N = 3 unless changed."""
    entry = copy.deepcopy(RUN)
    entry.update(steps=2, groups_per_step=1, episodes_per_group=2, n=3, max_in_flight=2)
    entry.update(changes)
    return TrainingRunConfig.from_dict("tiny", entry)


def tiny_env(rounds: int = 2) -> EnvironmentConfig:
    return EnvironmentConfig.from_dict({**CONFIG["environment"], "rounds": rounds})


def forced(trainer: TorchGRPOTrainer, chat: list[dict[str, str]], tool: Tool) -> Decision:
    """The decision that calls ``tool``, with its sampler log-probs (the only tool allowed)."""
    return asyncio.run(trainer.sampler().decide(chat, [tool], 0))


def trajectory_of(decision: Decision, reward: float) -> art.Trajectory:
    transcript = decision.transcript
    assert transcript is not None
    call = {
        "messages": json.dumps(list(transcript.messages)),
        "completion": transcript.completion,
        "token_ids": list(transcript.token_ids),
        "logprobs": list(transcript.logprobs),
    }
    return philosopher_trajectory([call], reward, {"tool": str(decision.tool)})


def choice_log_probs(trainer: TorchGRPOTrainer, chat: list[dict[str, str]]) -> dict[Tool, float]:
    """log P(call) of each tool under the constrained policy: a softmax over the six calls."""
    totals = []
    for tool in SIX:
        transcript = forced(trainer, chat, tool).transcript
        assert transcript is not None
        totals.append(sum(transcript.logprobs))
    return dict(zip(SIX, torch.log_softmax(torch.tensor(totals), 0).tolist(), strict=True))


@pytest.fixture(scope="module")
def trainer(smollm2_dir: Path) -> TorchGRPOTrainer:
    return TorchGRPOTrainer(smollm2_dir, tiny_run(), BASE)


@pytest.fixture(scope="module")
def rollouts(trainer: TorchGRPOTrainer) -> dict[str, pl.DataFrame]:
    """One step's rollout tables, played by the untrained adapter."""
    run = tiny_run()
    return asyncio.run(play_rollouts(trainer.sampler(), run, tiny_env(), TEMPLATES, 11, 0, 0))


def test_art_advantages_on_hand_made_groups(trainer: TorchGRPOTrainer) -> None:
    chat = table_conversations(3)[0]
    decision = forced(trainer, chat, Tool.THINK)
    varied = art.TrajectoryGroup([trajectory_of(decision, r) for r in (1.0, 0.0, 0.5)])
    equal = art.TrajectoryGroup([trajectory_of(decision, 0.5) for _ in range(3)])
    random.seed(0)
    packed, results = trainer.rows([varied, equal])
    # Population std 0.408: advantages +-1.2247; the one at the mean and the whole
    # all-equal group are dropped.
    assert sorted(round(r.advantage, 4) for r in results) == [-1.2247, 1.2247]
    assert {id(r.trajectory) for r in results} <= {id(t) for t in varied.trajectories}
    assert packed is not None
    assert packed["tokens"].shape[0] == 2
    assert trainer.rows([equal]) == (None, [])


def test_a_step_with_nothing_trainable_changes_nothing(smollm2_dir: Path) -> None:
    trainer = TorchGRPOTrainer(smollm2_dir, tiny_run(), BASE)
    decision = forced(trainer, table_conversations(3)[0], Tool.EAT)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items() if "lora" in k}
    stats = trainer.update([art.TrajectoryGroup([trajectory_of(decision, 1.0) for _ in range(2)])])
    assert (stats.groups, stats.groups_trainable, stats.rows, stats.trajectories) == (1, 0, 0, 0)
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_trainable_tokens_are_the_sampled_ones_and_the_ratio_starts_at_one(
    trainer: TorchGRPOTrainer, rollouts: dict[str, pl.DataFrame]
) -> None:
    run = tiny_run()
    groups = trajectory_groups(rollouts["episodes"], rollouts["transcripts"], run)
    # Distinct rewards per episode, so every trajectory is trainable whatever happened.
    for group in groups:
        for trajectory in group.trajectories:
            trajectory.reward = float(trajectory.metadata["episode"])
    random.seed(0)
    packed, results = trainer.rows(groups)
    assert packed is not None
    sampled = sorted(tuple(ids) for ids in rollouts["transcripts"]["token_ids"].to_list())
    trained = sorted(
        tuple(t for t, m in zip(r.token_ids, r.assistant_mask, strict=True) if m) for r in results
    )
    assert trained == sampled
    # The prompts the trainer renders are the ones the sampler saw, token for token.
    tokenizer = trainer.tokenizer
    seen = []
    for messages in rollouts["transcripts"]["messages"]:
        text = tokenizer.apply_chat_template(
            json.loads(messages), tokenize=False, add_generation_prompt=True
        )
        seen.append(tuple(tokenizer(text, add_special_tokens=False).input_ids))
    rendered = [tuple(r.token_ids[: r.assistant_mask.index(1)]) for r in results]
    assert sorted(rendered) == sorted(seen)
    # The unchanged policy: the trainer's log-probs are the sampler's (ratio 1) within bf16.
    differences = trainer.sampler_gaps(packed)
    largest, mean = BFLOAT16_BOUND
    assert max(differences) <= largest
    assert sum(differences) / len(differences) <= mean


def test_rollout_tables_rebuild_the_history_rewards(rollouts: dict[str, pl.DataFrame]) -> None:
    episodes = rollouts["episodes"]
    assert episodes["checkpoint"].unique().to_list() == ["step_0000"]
    assert episodes["episode"].to_list() == [0, 1]
    # Both episodes of the group play one scenario: the same table (its seed), each with its
    # own sampling.
    assert episodes["scenario"].n_unique() == 1
    assert episodes["seed"].n_unique() == 1
    row = rollout_rewards(episodes, tiny_run())
    assert row["episodes"] == 2
    assert row["reward_mean"] == pytest.approx(row["reward_paper_mean"])
    shaped = rollout_rewards(episodes, tiny_run(reward={**RUN["reward"], "variant": "shaped"}))
    assert shaped["reward_mean"] == pytest.approx(row["reward_shaped_mean"])


@pytest.mark.slow
def test_training_raises_the_probability_of_the_rewarded_call(smollm2_dir: Path) -> None:
    """A toy reward with a known answer: thinking earns 1, eating 0, on four tables.

    Three GRPO steps at learning rate 1e-4 must raise the log-probability that the
    constrained policy chooses think by at least 2 nats (from about 0.001 to over 0.007) on
    every table and lower eat's, and move the adapter. (The whole call's own probability
    need not rise: the eat rows push down the tokens every call shares.)
    """
    trainer = TorchGRPOTrainer(smollm2_dir, tiny_run(learning_rate=1e-4), BASE)
    chats = table_conversations(4)
    initial = {k: v.clone() for k, v in trainer.model.state_dict().items() if "lora_B" in k}
    before = [choice_log_probs(trainer, chat) for chat in chats]
    for step in range(3):
        groups = [
            art.TrajectoryGroup(
                [
                    trajectory_of(forced(trainer, chat, Tool.THINK), 1.0),
                    trajectory_of(forced(trainer, chat, Tool.EAT), 0.0),
                ]
            )
            for chat in chats
        ]
        random.seed(step)
        stats = trainer.update(groups)
        assert stats.rows == 8
    after = [choice_log_probs(trainer, chat) for chat in chats]
    for old, new in zip(before, after, strict=True):
        assert new[Tool.THINK] - old[Tool.THINK] >= 2.0
        assert new[Tool.EAT] < old[Tool.EAT]
    state = trainer.model.state_dict()
    assert any(not torch.equal(initial[k], state[k]) for k in initial)
