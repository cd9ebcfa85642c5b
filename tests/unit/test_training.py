"""GRPO training with ART's math on the policy that acted: interop, objective, fidelity, learning.

These run the real SmolLM2-135M and ART 0.5.18's own preprocessing and loss on the CPU. Under
constrained decoding the policy is mu = softmax(S / T) over the six tool calls, so the tests
measure mu on the real six-tool prompt (``choice_log_probs``), never a call's raw token
log-probs.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
import yaml
from torch._dynamo.eval_frame import OptimizedModule
from torch._dynamo.utils import counters

from coordgap.agents.runner import CellErrors
from coordgap.config.play import EnvironmentConfig
from coordgap.config.training import TrainingRunConfig
from coordgap.env.observation import PromptTemplates
from coordgap.env.protocols import TOOLS, Protocol, Tool
from coordgap.env.table import TurnOrder
from coordgap.episodes import transcript_row
from coordgap.policies import local
from coordgap.policies.base import Decision, NoCallReason
from coordgap.policies.local import DTYPES, compute_dtype, matmul_dtype, template_kwargs
from coordgap.training._art import art
from coordgap.training.grpo import TorchGRPOTrainer
from coordgap.training.history import rollout_rewards
from coordgap.training.loop import play_rollouts, rollout_cell, rollout_outputs
from coordgap.training.probe import (
    first_round_conversations,
    probe_conversations,
    rollout_choices,
)
from coordgap.training.trajectories import (
    DecisionChoice,
    philosopher_trajectory,
    sampled_choice,
    trajectory_groups,
)
from tests.unit.test_local_model import reference_log_probs, table_conversations

pytestmark = [
    pytest.mark.unit,
    # ART's loss correlates old and new probabilities (a metric only), which warns over the
    # one trained position of a constrained decision; the trainer silences it the same way.
    pytest.mark.filterwarnings("ignore:cov:UserWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
BASE = CONFIG["models"]["smollm2-135m"]
RUN = CONFIG["training"]["runs"]["smollm2-grpo"]
TEMPLATES = PromptTemplates.load(ROOT / "config" / "prompts")
SIX = TOOLS[Protocol.TOOLS6]
# The decision-level ratio mu_theta(k) / mu_old(k) on the unchanged policy: |log ratio| at most
# (largest, mean), about twice the worst measured over the oneDNN kernel paths
# (benchmarks/README.md, "Numerics": bf16 0.26 / 0.06, float32 2e-5 / 5e-6 on these tests'
# decisions, 3.9e-5 largest on 30 real step-0 decisions). The sampler
# scores after a cached prefix and the trainer in one pass, which bf16 rounds differently.
DECISION_BOUNDS = {"float32": (1e-4, 1e-5), "bfloat16": (0.5, 0.15)}


def tiny_run(**changes: object) -> TrainingRunConfig:
    """The default run's recipe, shrunk: 1 group of 2 episodes at N = 3 unless changed."""
    entry = copy.deepcopy(RUN)
    entry.update(steps=2, groups_per_step=1, episodes_per_group=2, n=3, max_in_flight=2)
    entry.update(changes)
    return TrainingRunConfig.from_dict("tiny", entry)


def tiny_env(rounds: int = 2) -> EnvironmentConfig:
    return EnvironmentConfig.from_dict({**CONFIG["environment"], "rounds": rounds})


def decide(trainer: TorchGRPOTrainer, chat: list[dict[str, str]], seed: int = 0) -> Decision:
    """One constrained decision over the six tools, as a rollout makes it."""
    return asyncio.run(trainer.sampler().decide(chat, SIX, seed))


def choosing(
    trainer: TorchGRPOTrainer, decision: Decision, tool: Tool, run: TrainingRunConfig
) -> dict[str, Any]:
    """The transcript row of ``decision`` had the sampler drawn ``tool`` from the same mu."""
    transcript = decision.transcript
    assert transcript is not None
    k = SIX.index(tool)
    scores = torch.tensor(transcript.scores, dtype=torch.float64)
    drawn = dataclasses.replace(
        transcript,
        token_ids=transcript.candidates[k],
        choice=k,
        choice_logprob=float(torch.log_softmax(scores / run.temperature, 0)[k]),
    )
    own = reference_log_probs(trainer.sampler(), drawn)
    return transcript_row(dataclasses.replace(drawn, logprobs=tuple(own)))


def as_free(call: dict[str, Any]) -> dict[str, Any]:
    """The same call without its constrained record: trained token by token (the old way)."""
    return {**call, "candidates": None, "scores": None, "choice": None, "choice_logprob": None}


def group_of(calls_and_rewards: list[tuple[dict[str, Any], float]], run) -> art.TrajectoryGroup:
    return art.TrajectoryGroup(
        [
            philosopher_trajectory([call], reward, {"i": i}, run.temperature)
            for i, (call, reward) in enumerate(calls_and_rewards)
        ]
    )


def choice_log_probs(trainer: TorchGRPOTrainer, chats: list[list[dict[str, str]]]) -> torch.Tensor:
    """log mu over the six tools on each real six-tool prompt, ``[chats, 6]``."""
    return trainer.choice_log_probs(chats, SIX)


def lora_grads(trainer: TorchGRPOTrainer) -> list[torch.Tensor]:
    return [p.grad.clone() for p in trainer.model.parameters() if p.requires_grad]


@pytest.fixture(scope="module")
def trainer(smollm2_dir: Path) -> TorchGRPOTrainer:
    return TorchGRPOTrainer(smollm2_dir, tiny_run(), BASE)


def test_the_trainer_loads_no_hub_kernels(trainer: TorchGRPOTrainer) -> None:
    # As the sampler (test_local_model): the `kernels` package is installed with ART.
    assert not trainer.model.get_base_model().use_kernels


def play_step(trainer: TorchGRPOTrainer, folder: Path) -> dict[str, pl.DataFrame]:
    """Step 0's rollout tables under the trainer's current policy, journalled in ``folder``."""
    run = tiny_run()
    # One round: 6 decisions, enough for every update test and half the cost of two rounds.
    cell = rollout_cell(run, tiny_env(rounds=1), 11, 0, 0)
    outputs = rollout_outputs(folder, 0)
    return asyncio.run(
        play_rollouts(trainer.sampler(), cell, outputs, TEMPLATES, run.max_in_flight)
    )


@pytest.fixture(scope="module")
def rollouts(
    trainer: TorchGRPOTrainer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, pl.DataFrame]:
    """One step's rollout tables, played by the untrained adapter."""
    return play_step(trainer, tmp_path_factory.mktemp("rollouts"))


def trainable_groups(rollouts: dict[str, pl.DataFrame], run) -> list[art.TrajectoryGroup]:
    """The rollouts' groups with distinct rewards per episode: every trajectory trainable."""
    episodes = rollouts["episodes"]["episode"].to_list()
    rewards = {episode: float(episode) for episode in episodes}
    return trajectory_groups(rollouts["episodes"], rollouts["transcripts"], run, rewards)


def two_rows(rollouts: dict[str, pl.DataFrame], run) -> list[art.TrajectoryGroup]:
    """Seat 0's trajectory of each of the two episodes, as one group: 2 rows, not 6.

    For the update tests, whose assertions hold for any number of rows: each row is a
    forward and backward pass of a whole prompt, the bulk of an update's cost.
    """
    (group,) = trainable_groups(rollouts, run)
    return [art.TrajectoryGroup([t for t in group.trajectories if t.metadata["philosopher"] == 0])]


# --- transcripts as ART trajectories -----------------------------------------------------


def test_a_constrained_call_is_one_trained_position_with_its_choice(
    trainer: TorchGRPOTrainer,
) -> None:
    run = tiny_run()
    call = choosing(trainer, decide(trainer, table_conversations(3)[0]), Tool.THINK, run)
    choice = sampled_choice(call, run.temperature)
    assert isinstance(choice, DecisionChoice)
    assert choice.chosen == SIX.index(Tool.THINK)
    assert choice.candidates == [list(c) for c in call["candidates"]]
    (entry,) = choice.logprobs.content
    assert entry.logprob == call["choice_logprob"]
    free = sampled_choice(as_free(call), run.temperature)
    assert not isinstance(free, DecisionChoice)
    assert len(free.logprobs.content) == len(call["token_ids"])
    with pytest.raises(ValueError, match=r"temperature 1\.0 cannot train a run at 0\.7"):
        sampled_choice(call, 0.7)


def test_art_advantages_on_hand_made_groups(trainer: TorchGRPOTrainer) -> None:
    run = tiny_run()
    call = choosing(trainer, decide(trainer, table_conversations(3)[0]), Tool.THINK, run)
    varied = group_of([(call, r) for r in (1.0, 0.0, 0.5)], run)
    equal = group_of([(call, 0.5) for _ in range(3)], run)
    random.seed(0)
    rows = trainer.rows([varied, equal])
    # Population std 0.408: advantages +-1.2247; the one at the mean and the whole
    # all-equal group are dropped.
    assert sorted(round(r.advantage, 4) for r in rows.results) == [-1.2247, 1.2247]
    assert {id(r.trajectory) for r in rows.results} <= {id(t) for t in varied.trajectories}
    assert rows.packed is not None
    assert rows.packed["tokens"].shape[0] == len(rows.choices) == 2
    # One trained position per decision: ART's weights and advantages are per decision.
    assert rows.packed["assistant_mask"].sum(dim=1).tolist() == [1, 1]
    assert trainer.rows([equal]) == (None, [], [])


def test_a_group_of_equal_rewards_contributes_no_rows(trainer: TorchGRPOTrainer) -> None:
    """Paper rewards (0.2, 0.2, 0.2) next to (0.0, 0.2, 0.5): only the second group reaches
    ART's tokenizer with trajectories."""
    run = tiny_run(episodes_per_group=3)
    call = choosing(trainer, decide(trainer, table_conversations(3)[0]), Tool.THINK, run)
    # Deadlocked, so only throughput pays: 0.5 r_thru.
    episodes = pl.DataFrame(
        {"episode": range(6), "status": "ok", "r_thru": [0.4, 0.4, 0.4, 0.0, 0.4, 1.0]}
    ).with_columns(r_nd=0.0, r_fair=0.0, r_idle=0.0)
    transcripts = pl.DataFrame(
        [{"episode": e, "round": 1, "philosopher": 0} | call for e in range(6)]
    )
    equal, varied = trajectory_groups(episodes, transcripts, run)
    assert equal.trajectories == []
    assert [t.reward for t in varied.trajectories] == [0.0, 0.2, 0.5]
    # Given to ART whole, the equal group would train: its mean is rounded
    # (0.20000000000000004), so every trajectory keeps an advantage of about -3e-11.
    random.seed(0)
    unfiltered = trainer.rows([group_of([(call, 0.2)] * 3, run)])
    assert len(unfiltered.results) == 3
    assert all(0 < abs(r.advantage) < 1e-9 for r in unfiltered.results)
    random.seed(0)
    rows = trainer.rows([equal, varied])
    assert {id(r.trajectory) for r in rows.results} == {id(t) for t in varied.trajectories}
    # The step played the group: the history counts it, as given and not trainable.
    stats = trainer.update([equal])
    assert (stats.groups, stats.groups_trainable, stats.rows) == (1, 0, 0)


def test_a_step_with_nothing_trainable_changes_nothing(smollm2_dir: Path) -> None:
    run = tiny_run()
    trainer = TorchGRPOTrainer(smollm2_dir, run, BASE)
    call = choosing(trainer, decide(trainer, table_conversations(3)[0]), Tool.EAT, run)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items() if "lora" in k}
    stats = trainer.update([group_of([(call, 1.0), (call, 1.0)], run)])
    assert (stats.groups, stats.groups_trainable, stats.rows, stats.trajectories) == (1, 0, 0, 0)
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.numerics
def test_rows_train_the_sampled_decisions_and_the_ratio_starts_at_one(
    trainer: TorchGRPOTrainer, rollouts: dict[str, pl.DataFrame]
) -> None:
    """On every ISA path (``test_numerics_isa.py``): mu_theta / mu_old is 1 within its bound."""
    run = tiny_run()
    random.seed(0)
    rows = trainer.rows(trainable_groups(rollouts, run))
    assert rows.packed is not None
    transcripts = rollouts["transcripts"]
    assert len(rows.choices) == transcripts.height
    assert all(isinstance(choice, DecisionChoice) for choice in rows.choices)
    # Each row is its own history: the prompt the sampler saw, then the choice's one
    # position, with the candidates and the choice the sampler recorded.
    tokenizer = trainer.tokenizer
    sampled = []
    for row in transcripts.iter_rows(named=True):
        text = tokenizer.apply_chat_template(
            json.loads(row["messages"]), tokenize=False, add_generation_prompt=True
        )
        prompt = tokenizer(text, add_special_tokens=False).input_ids
        sampled.append((prompt, row["candidates"], row["choice"], round(row["choice_logprob"], 5)))
    trained = []
    for index, choice in enumerate(rows.choices):
        tokens = rows.packed["tokens"][index].tolist()
        (action,) = rows.packed["assistant_mask"][index].nonzero()[:, 0].tolist()
        logprob = rows.packed["logprobs"][index, action].item()
        trained.append((tokens[:action], choice.candidates, choice.chosen, round(logprob, 5)))
    assert sorted(trained) == sorted(sampled)
    dtype = BASE["dtype"]
    largest, mean = DECISION_BOUNDS[dtype]
    gaps = trainer.sampler_gaps(rows)
    assert len(gaps) == transcripts.height
    assert max(gaps) <= largest
    assert sum(gaps) / len(gaps) <= mean


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
    assert row["both_forks_mean"] == pytest.approx(episodes["both_forks"].mean())
    choices = rollout_choices(episodes, rollouts["transcripts"])
    assert sum(choices[f"actions_{tool}"] for tool in SIX) == pytest.approx(1.0)
    assert 0 < choices["entropy_mean"] < torch.log(torch.tensor(6.0)).item()


def test_a_steps_rollouts_resume_from_their_journal(
    trainer: TorchGRPOTrainer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run killed mid-rollouts keeps the episodes it finished and replays the others alone."""
    whole = play_step(trainer, tmp_path / "whole")
    journal = rollout_outputs(tmp_path / "whole", 0).journal
    killed = rollout_outputs(tmp_path / "killed", 0).journal
    shutil.copytree(journal, killed)
    for part in killed.glob("e000001.*"):
        part.unlink()
    with caplog.at_level(logging.INFO, logger="coordgap.agents.runner"):
        resumed = play_step(trainer, tmp_path / "killed")
    assert "tiny n=3 step_0000: 1 journalled, 1 to play" in caplog.text
    for table, frame in whole.items():
        # Episode 1 played again from its own seeds; only call latencies differ.
        assert (
            resumed[table]
            .drop("latency_s", strict=False)
            .equals(frame.drop("latency_s", strict=False))
        ), table


class _UnreachableBackend:
    """Every call fails in transport, as a policy server that went away would."""

    async def decide(self, messages, tools, seed, batch=None) -> Decision:
        return Decision(
            tool=None, no_call_reason=NoCallReason.TRANSPORT_ERROR, raw="APIConnectionError"
        )


def test_a_step_of_error_rollouts_fails_rather_than_training_on_what_is_left(
    tmp_path: Path,
) -> None:
    run = tiny_run()
    # One round: 6 decisions, enough for every update test and half the cost of two rounds.
    cell = rollout_cell(run, tiny_env(rounds=1), 11, 0, 0)
    outputs = rollout_outputs(tmp_path, 0)
    rollouts = play_rollouts(_UnreachableBackend(), cell, outputs, TEMPLATES, run.max_in_flight)
    with pytest.raises(CellErrors, match=r"tiny n=3 step_0000: 2 of 2 episodes ended in error"):
        asyncio.run(rollouts)
    # The error episodes leave the journal, so the rerun plays them again.
    assert not list(outputs.journal.glob("e*.episodes.parquet"))


# --- the objective ------------------------------------------------------------------------


def test_the_gradient_is_that_of_the_six_way_log_probability(smollm2_dir: Path) -> None:
    """Independently: autograd of A * w * log mu(k) from plain forward passes, one per call.

    float32, at T = 0.7, with a non-zero adapter (B != 0), on a group of two decisions with
    rewards 1 and 0: A = +-1 and w = 1 after ART's normalisation, and the ratio is 1, so
    CISPO's row loss is -A * log mu_theta(k).
    """
    run = tiny_run(temperature=0.7)
    trainer = TorchGRPOTrainer(smollm2_dir, run, {**BASE, "dtype": "float32"})
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in trainer.model.named_parameters():
            if "lora_B" in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.01)
    chat = table_conversations(3)[1]
    decision = decide(trainer, chat)
    calls = [
        choosing(trainer, decision, Tool.PICK_UP_RIGHT, run),
        choosing(trainer, decision, Tool.THINK, run),
    ]
    random.seed(0)
    rows = trainer.rows([group_of([(calls[0], 1.0), (calls[1], 0.0)], run)])
    tokenizer = trainer.tokenizer
    text = tokenizer.apply_chat_template(
        chat_with_tools(decision), tokenize=False, add_generation_prompt=True
    )
    prompt = tokenizer(text, add_special_tokens=False).input_ids
    trainer.model.train()
    # Both rows are calls of one decision: one prompt and the same six candidates, so one set
    # of passes scores them for both (its graph kept for the second row's backward).
    candidates = rows.choices[0].candidates
    assert all(choice.candidates == candidates for choice in rows.choices)
    scores = []
    for candidate in candidates:
        ids = torch.tensor([prompt + candidate])
        logits = trainer.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        picked = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])
        scores.append(picked.sum())
    log_mus = torch.log_softmax(torch.stack(scores) / run.temperature, 0)
    for index, choice in enumerate(rows.choices):
        inputs = trainer.row(rows.packed, index)
        new, _ = trainer.log_probs(inputs, choice)
        art.loss.loss_fn(inputs, new, None, None, {}).policy_loss.backward()
        ours = lora_grads(trainer)
        trainer.model.zero_grad()
        advantage = 1.0 if choice.chosen == SIX.index(Tool.PICK_UP_RIGHT) else -1.0
        (-advantage * log_mus[choice.chosen]).backward(retain_graph=True)
        theirs = lora_grads(trainer)
        trainer.model.zero_grad()
        # float32: the two sum the same products in other orders, so compare the whole
        # gradient (the token-level objective's is at a cosine of 0.1 to 0.9 from this one).
        a, b = torch.cat([g.flatten() for g in ours]), torch.cat([g.flatten() for g in theirs])
        assert b.norm() > 0
        assert (a - b).norm() <= 1e-4 * b.norm()


def chat_with_tools(decision: Decision) -> list[dict[str, str]]:
    assert decision.transcript is not None
    return list(decision.transcript.messages)


@pytest.mark.slow
def test_training_moves_the_six_way_policy_toward_the_rewarded_call(smollm2_dir: Path) -> None:
    """A toy reward with a known answer: thinking (which mu gives ~1e-4) earns 1, the call mu
    favours earns 0, on two tables; three GRPO steps at learning rate 1e-4.

    The decision-level objective must raise log mu(think) on the real six-tool prompts by at
    least 3 nats and lower the favoured call's; training the same decisions' raw token
    log-probs (the former objective) must raise it at least 1.5 nats less: with the paired +-1
    advantages, the tokens every call shares cancel, and the rest of its step still goes to the
    tokens of the calls rather than to mu. Measured, decision against token: 3.84 and 3.85
    against 1.83 and 2.04 computing in bf16 (AVX-512 and AMX machines); 6.36 and 6.24 against
    4.53 and 4.57 computing in float32 (an AVX2 machine, coordgap.policies.local.compute_dtype),
    where bf16's rounding no longer damps the small steps of either objective.
    """
    chats = table_conversations(2)
    think = SIX.index(Tool.THINK)
    gains = {}
    for objective in ("decision", "token"):
        run = tiny_run(learning_rate=1e-4)
        trainer = TorchGRPOTrainer(smollm2_dir, run, BASE)
        before = choice_log_probs(trainer, chats)
        favoured = [SIX[int(k)] for k in before.argmax(dim=1)]
        for step in range(3):
            calls = []
            for chat, top in zip(chats, favoured, strict=True):
                decision = decide(trainer, chat, seed=step)
                calls += [(choosing(trainer, decision, Tool.THINK, run), 1.0)]
                calls += [(choosing(trainer, decision, top, run), 0.0)]
            if objective == "token":
                calls = [(as_free(call), reward) for call, reward in calls]
            groups = [group_of(calls[i : i + 2], run) for i in range(0, len(calls), 2)]
            random.seed(step)
            assert trainer.update(groups).rows == 4
        after = choice_log_probs(trainer, chats)
        gains[objective] = (after - before)[:, think]
        if objective == "decision":
            for row, top in enumerate(favoured):
                assert after[row, SIX.index(top)] < before[row, SIX.index(top)]
    assert (gains["decision"] >= 3.0).all(), gains
    assert (gains["decision"] - gains["token"] >= 1.5).all(), gains


# --- ART fidelity ---------------------------------------------------------------------------


def test_the_warm_up_is_arts_step_at_learning_rate_1e_9(
    smollm2_dir: Path, rollouts: dict[str, pl.DataFrame], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ART's first row, twice: first ``create_train_inputs(..., warmup=True)`` at lr 1e-9."""
    run = tiny_run()
    trainer = TorchGRPOTrainer(smollm2_dir, run, BASE)
    calls: list[tuple[int, bool]] = []
    create = art.preprocessing.inputs.create_train_inputs

    def recorded(packed, offset, config, _config, warmup):
        calls.append((offset, warmup))
        return create(packed, offset, config, _config, warmup)

    monkeypatch.setattr(art.preprocessing.inputs, "create_train_inputs", recorded)
    rates = learning_rates(trainer, monkeypatch)
    groups = two_rows(rollouts, run)
    random.seed(0)
    rows = trainer.rows(groups)
    # The warm-up alone: Adam's moments hold the first row's clipped gradient.
    trainer.model.train()
    inputs = trainer.row(rows.packed, 0, warmup=True)
    assert inputs["config"].learning_rate == 1e-9
    new, _ = trainer.log_probs(inputs, rows.choices[0])
    art.loss.loss_fn(inputs, new, None, None, {}).policy_loss.backward()
    torch.nn.utils.clip_grad_norm_(trainer._parameters, run.optimizer.max_grad_norm)
    expected = [(1 - run.optimizer.beta1) * g for g in lora_grads(trainer)]
    trainer.model.zero_grad()
    calls.clear()
    trainer._warm_up(rows)
    assert calls == [(0, True)]
    assert rates == [1e-9]
    moments = [trainer.optimizer.state[p]["exp_avg"] for p in trainer._parameters]
    for got, want in zip(moments, expected, strict=True):
        torch.testing.assert_close(got, want)
    # In an update: the warm-up comes first, once per fresh optimizer, then every row.
    fresh = TorchGRPOTrainer(smollm2_dir, run, BASE)
    rates = learning_rates(fresh, monkeypatch)
    calls.clear()
    random.seed(0)
    stats = fresh.update(groups)
    assert calls[0] == (0, True)
    # Then every row twice: the pass that measures ascent_cosine, and the update's steps.
    assert [warmup for _, warmup in calls[1:]] == [False] * 2 * stats.rows
    assert rates == [1e-9] + [run.learning_rate] * stats.rows
    calls.clear()
    random.seed(1)
    fresh.update(groups)
    assert not any(warmup for _, warmup in calls)


def learning_rates(trainer: TorchGRPOTrainer, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The learning rate of every optimizer step the trainer takes from now on."""
    rates: list[float] = []
    step = trainer.optimizer.step

    def recorded() -> None:
        rates.append(trainer.optimizer.param_groups[0]["lr"])
        step()

    monkeypatch.setattr(trainer.optimizer, "step", recorded)
    return rates


def test_a_restored_optimizer_gives_the_same_next_update(
    smollm2_dir: Path, rollouts: dict[str, pl.DataFrame], tmp_path: Path
) -> None:
    run = tiny_run()
    groups = two_rows(rollouts, run)
    trainer = TorchGRPOTrainer(smollm2_dir, run, BASE)
    random.seed(0)
    trainer.update(groups)
    trainer.save(tmp_path / "adapter")
    trainer.save_optimizer(tmp_path / "optimizer.pt")
    resumed = TorchGRPOTrainer(
        smollm2_dir, run, BASE, tmp_path / "adapter", tmp_path / "optimizer.pt"
    )
    for each in (trainer, resumed):
        random.seed(1)
        each.update(groups)
    ours = {k: v for k, v in trainer.model.state_dict().items() if "lora" in k}
    theirs = {k: v for k, v in resumed.model.state_dict().items() if "lora" in k}
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def compiled_layers(trainer: TorchGRPOTrainer) -> int:
    """How many of the trainer's decoder layers are compiled wrappers right now."""
    return sum(isinstance(layer, OptimizedModule) for layer in trainer._decoder.layers)


# float32, where the trainer's rounding bound is tight (DECISION_BOUNDS).
FLOAT32 = {**BASE, "dtype": "float32"}


def rows_log_probs(trainer: TorchGRPOTrainer, groups: list[art.TrajectoryGroup]) -> torch.Tensor:
    """Every row's log-probs of its trained position, without gradients."""
    random.seed(0)
    rows = trainer.rows(groups)
    with torch.no_grad():
        return torch.cat(
            [
                trainer.log_probs(trainer.row(rows.packed, index), choice)[0]
                for index, choice in enumerate(rows.choices)
            ]
        )


# A compiled update of the module's rollouts in its own process, so that it can run twice on
# one inductor cache folder (the second run loads what the first compiled): the rows'
# log-probs, the update's loss and norm, the graphs compiled, the layers left compiled
# afterwards, and the adapter's hash.
_COMPILED_UPDATE = """
import hashlib, json, random, sys
import polars as pl
from torch._dynamo.utils import counters
from coordgap.training.grpo import TorchGRPOTrainer
from tests.unit.test_training import FLOAT32, compiled_layers, rows_log_probs, tiny_run
from tests.unit.test_training import two_rows
folder = sys.argv[1]
names = ("episodes", "transcripts")
rollouts = {name: pl.read_parquet(f"{folder}/{name}.parquet") for name in names}
run = tiny_run(compile_update=True)
trainer = TorchGRPOTrainer(sys.argv[2], run, FLOAT32)
groups = two_rows(rollouts, run)
log_probs = rows_log_probs(trainer, groups).tolist()
random.seed(0)
stats = trainer.update(groups)
digest = hashlib.sha256()
for parameter in trainer._parameters:
    digest.update(parameter.detach().numpy().tobytes())
print(json.dumps({
    "log_probs": log_probs, "loss": stats.loss, "grad_norm": stats.grad_norm,
    "graphs": counters["stats"]["unique_graphs"], "layers_left": compiled_layers(trainer),
    "adapter": digest.hexdigest(),
}))
"""


@pytest.fixture(scope="module")
def compiled_runs(
    smollm2_dir: Path, rollouts: dict[str, pl.DataFrame], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """The compiled update, cold then warm on one inductor cache folder (which the cold run
    must leave compiled kernels in)."""
    folder = tmp_path_factory.mktemp("compiled")
    for name in ("episodes", "transcripts"):
        rollouts[name].write_parquet(folder / f"{name}.parquet")
    cache = folder / "inductor"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    command = [sys.executable, "-c", _COMPILED_UPDATE, str(folder), str(smollm2_dir)]
    runs = []
    for _ in ("cold", "warm"):
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.splitlines()[-1]))
        assert any(cache.rglob("*.py")), "the first run left no compiled kernels in the cache"
    return runs


@pytest.mark.numerics
@pytest.mark.float32
def test_a_compiled_update_is_the_eager_update_up_to_rounding(
    smollm2_dir: Path, rollouts: dict[str, pl.DataFrame], compiled_runs: list[dict[str, Any]]
) -> None:
    run = tiny_run()
    trainer = TorchGRPOTrainer(smollm2_dir, run, FLOAT32)
    groups = two_rows(rollouts, run)
    graphs = counters["stats"]["unique_graphs"]
    eager_log_probs = rows_log_probs(trainer, groups)
    random.seed(0)
    eager = trainer.update(groups)
    # Eager compiles nothing. Compiled, the update compiled a few graphs, one per kind of call
    # (with gradients or not; the first layer, whose input needs none, or a later one) rather
    # than one per layer, which dynamo stops at 8 and then runs eagerly; neither left a
    # compiled layer behind.
    assert (counters["stats"]["unique_graphs"] - graphs, compiled_layers(trainer)) == (0, 0)
    cold = compiled_runs[0]
    assert 0 < cold["graphs"] <= 4
    assert cold["layers_left"] == 0
    gap = (torch.tensor(cold["log_probs"]) - eager_log_probs).abs()
    assert gap.max() <= DECISION_BOUNDS["float32"][0]
    # The loss is a mean of advantage-weighted ratios near 0, so its gap is bounded absolutely
    # by the ratios' (advantages within +-2 here), not relative to its own small size.
    assert cold["loss"] == pytest.approx(eager.loss, abs=2 * DECISION_BOUNDS["float32"][0])
    assert cold["grad_norm"] == pytest.approx(eager.grad_norm, rel=1e-3)


@pytest.mark.slow
def test_a_compiled_update_does_not_depend_on_whether_the_cache_was_warm(
    compiled_runs: list[dict[str, Any]],
) -> None:
    cold, warm = compiled_runs
    assert {key: cold[key] for key in ("loss", "grad_norm", "adapter")} == {
        key: warm[key] for key in ("loss", "grad_norm", "adapter")
    }


def test_max_grad_norm_is_an_option_and_its_clipping_is_recorded(
    smollm2_dir: Path, rollouts: dict[str, pl.DataFrame]
) -> None:
    updates, adapters = {}, {}
    for limit in (0.1, 1e6):
        run = tiny_run(optimizer={**RUN["optimizer"], "max_grad_norm": limit})
        trainer = TorchGRPOTrainer(smollm2_dir, run, BASE)
        random.seed(0)
        updates[limit] = trainer.update(two_rows(rollouts, run))
        adapters[limit] = [p.detach().clone() for p in trainer._parameters]
    # ART's 0.1 cuts every row of this step (norms about 1 to 3); a loose limit cuts none.
    assert updates[0.1].clipped_share == 1.0
    assert updates[1e6].clipped_share == 0.0
    # The norms are measured before the clip, and the first row's is the same either way.
    assert updates[0.1].grad_norm > 0.1
    # Adam normalises each step, so the clip changes how the rows weigh in its moments.
    assert not all(torch.equal(a, b) for a, b in zip(adapters[0.1], adapters[1e6], strict=True))


def flat(gradients: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten() for g in gradients])


def row_gradients(
    trainer: TorchGRPOTrainer, groups: list[art.TrajectoryGroup]
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The rows' summed-loss gradient, each row run whole and one by one, and batched after
    their shared prefix (``accumulate``); and the share of the tokens the latter ran."""
    random.seed(0)
    rows = trainer.rows(groups)
    inputs = [trainer.row(rows.packed, index) for index in range(len(rows.choices))]
    # Three seats' prompts: they share the system turn, and each has a user turn of its own.
    assert len({tuple(row["tokens"][0].tolist()) for row in inputs}) > 1
    trainer.model.train()
    whole = 0
    for row, choice in zip(inputs, rows.choices, strict=True):
        new, ran = trainer.log_probs(row, choice)
        trainer._loss(row, new).policy_loss_sum.backward()
        whole += ran
    one_by_one = flat(lora_grads(trainer))
    trainer.model.zero_grad()
    shared = trainer.accumulate(inputs, rows.choices, 1.0)
    batched = flat(lora_grads(trainer))
    trainer.model.zero_grad()
    return one_by_one, batched, shared.tokens / whole


@pytest.mark.numerics
@pytest.mark.float32
def test_accumulated_rows_step_once_on_the_mean_of_their_gradients_with_the_prefix_shared(
    smollm2_dir: Path, rollouts: dict[str, pl.DataFrame]
) -> None:
    """A non-zero adapter: the batched pass after the shared prefix against each row run
    whole, one by one (what ART's one-step-per-row loop differentiates)."""
    run = tiny_run(grad_accumulation_sequences="all", warmup=False)
    run = dataclasses.replace(run, optimizer=dataclasses.replace(run.optimizer, max_grad_norm=1e6))
    trainer = TorchGRPOTrainer(smollm2_dir, run, FLOAT32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in trainer.model.named_parameters():
            if "lora_B" in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.01)
    groups = trainable_groups(rollouts, run)
    # Rewards by seat too: the two episodes' round-1 prompts are the same, and with rewards by
    # episode only a seat's two rows could cancel out.
    for trajectory in groups[0].trajectories:
        trajectory.reward += 3 * trajectory.metadata["philosopher"]
    one_by_one, batched, tokens = row_gradients(trainer, groups)
    assert one_by_one.norm() > 0
    # float32: the prefix's products run at another shape than in the whole row, so they
    # round differently: 1.5e-5 of one row's gradient, and 1e-4 of this sum of six, where
    # rows of opposite advantage cancel (measured on an AMX Xeon). Rounding, not a different
    # sum: with the model in float64 (attention's softmax stays float32 in transformers) the
    # gap fell to 5e-7 of the sum, and batching rows without the split leaves 2e-6.
    assert (batched - one_by_one).norm() <= 5e-4 * one_by_one.norm()
    # The prefix ran once: well under the tokens of running every row whole.
    assert tokens < 0.6
    # The update takes one AdamW step, on the mean over the rows' trained positions.
    stepped: list[torch.Tensor] = []
    original = trainer.optimizer.step
    trainer.optimizer.step = lambda: (stepped.append(flat(lora_grads(trainer))), original())
    random.seed(0)
    stats = trainer.update(groups)
    (gradient,) = stepped
    assert (stats.rows, stats.optimizer_steps) == (6, 1)
    mean = batched / 6
    assert (gradient - mean).norm() <= 1e-3 * mean.norm()
    # Adam's first step moves each weight by about lr * sign(gradient), so the change is at a
    # cosine of ||g||_1 / (sqrt(n) ||g||_2) to the policy gradient -g (n its non-zero entries).
    expected = mean.abs().sum() / (torch.count_nonzero(mean) ** 0.5 * mean.norm())
    assert stats.ascent_cosine == pytest.approx(float(expected), abs=0.02)


def test_grad_accumulation_sequences_rows_share_each_optimizer_step(
    trainer: TorchGRPOTrainer, smollm2_dir: Path, rollouts: dict[str, pl.DataFrame]
) -> None:
    run = tiny_run(grad_accumulation_sequences=4, warmup=False)
    stats = TorchGRPOTrainer(smollm2_dir, run, BASE).update(trainable_groups(rollouts, run))
    # 6 rows in steps of 4: a step of 4 and a step of the 2 left.
    assert (stats.rows, stats.optimizer_steps) == (6, 2)
    assert stats.clipped_share in (0.0, 0.5, 1.0)
    # Measured by a pass of its own over all six rows, which the update's time leaves out.
    assert -1 <= stats.ascent_cosine <= 1


def test_the_trainer_renders_prompts_as_the_sampler_and_art_do(
    smollm2_dir: Path,
) -> None:
    """A template with Qwen3's thinking switch: sampler and ART's tokenizer render alike."""
    run = tiny_run()
    trainer = TorchGRPOTrainer(smollm2_dir, run, BASE)
    tokenizer = trainer.tokenizer
    tokenizer.chat_template = THINKING_TEMPLATE
    assert "enable_thinking" in tokenizer.chat_template
    for configured in (None, {"enable_thinking": True}):
        assert template_kwargs(tokenizer, configured) == (
            art.preprocessing.tokenize._chat_template_kwargs(tokenizer, configured)
        )
    prompts = {}
    for configured in (None, {"enable_thinking": True}):
        trainer._base = {**BASE, "chat_template_kwargs": configured}
        call = choosing(trainer, decide(trainer, table_conversations(3)[0]), Tool.THINK, run)
        rows = trainer.rows([group_of([(call, 1.0), (call, 0.0)], run)])
        (action,) = rows.packed["assistant_mask"][0].nonzero()[:, 0].tolist()
        trained = rows.packed["tokens"][0, :action].tolist()
        sampler = trainer.sampler()
        assert trained == sampler._prompt(json.loads(call["messages"]))
        prompts[str(configured)] = trained
    # Thinking off (ART's default) renders an empty thought; on, none.
    assert prompts["None"] != prompts[str({"enable_thinking": True})]


# Qwen3's shape: the generation prompt and the last assistant turn carry an empty thought
# when thinking is off.
THINKING_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{%- if m['role'] == 'assistant' and enable_thinking is defined and not enable_thinking %}"
    "<think></think>{%- endif %}{{ m['content'] }}"
    "{%- if not (loop.last and m['role'] == 'assistant') %}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think></think>"
    "{%- endif %}{%- endif %}"
)


# --- what the update did to the policy --------------------------------------------------------


def test_the_control_rewards_expectation_is_exact_from_round_1s_prompts(
    trainer: TorchGRPOTrainer, rollouts: dict[str, pl.DataFrame]
) -> None:
    """E[r1] is the mean over the seats of mu(right | the seat's round-1 prompt): the prompts
    are those every rollout's round 1 sent, and r1_exact the mean mu(right) its seats drew from."""
    run = tiny_run()
    prompts = first_round_conversations(tiny_env(rounds=1), TEMPLATES, run.n)
    assert prompts is not None
    assert len(prompts) == run.n
    sent = rollouts["transcripts"].filter(pl.col("round") == 1)
    assert sent.height == 2 * run.n
    right = SIX.index(Tool.PICK_UP_RIGHT)
    drawn = []
    for call in sent.iter_rows(named=True):
        # As the sampler sends them: the tools described in the system message.
        assert json.loads(call["messages"]) == local.with_tools(prompts[call["philosopher"]], SIX)
        scores = torch.tensor(call["scores"]) / call["temperature"]
        drawn.append(torch.softmax(scores, dim=0)[right].item())
    exact = trainer.first_round_right(prompts, SIX)
    # The rollouts' policy is the untrained one: the adapter (B = 0) is the base model.
    assert exact["r1_exact"] == exact["r1_exact_base"]
    assert exact["r1_exact"] == pytest.approx(sum(drawn) / len(drawn), abs=1e-6)
    # Under sequential turns a later seat's round-1 prompt depends on the earlier ones' choices.
    sequential = dataclasses.replace(tiny_env(rounds=1), turn_order=TurnOrder.SEQUENTIAL)
    assert first_round_conversations(sequential, TEMPLATES, run.n) is None


def test_the_probe_measures_how_far_the_policy_moved(
    smollm2_dir: Path, rollouts: dict[str, pl.DataFrame]
) -> None:
    run = tiny_run()
    trainer = TorchGRPOTrainer(smollm2_dir, run, BASE)
    probes = probe_conversations(tiny_env(), TEMPLATES, 5)
    assert len(probes) == 9
    assert len({json.dumps(chat) for chat in probes}) == 9
    first_round = first_round_conversations(tiny_env(), TEMPLATES, run.n)
    untrained = trainer.probe(probes, SIX)
    untrained_r1 = trainer.first_round_right(first_round, SIX)
    # The untrained adapter (B = 0) is the base model exactly, in either dtype.
    assert untrained["probe_kl"] == untrained["probe_kl_acting"] == 0.0
    assert sum(untrained[f"probe_{tool}"] for tool in SIX) == pytest.approx(1.0)
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    random.seed(0)
    trainer.update(two_rows(rollouts, run))
    trained = trainer.probe(probes, SIX)
    assert trained["probe_kl"] > 1e-6
    assert trained["probe_kl_acting"] > 1e-6
    # The control's exact expectation moves with the policy; the untrained model's stays.
    moved = trainer.first_round_right(first_round, SIX)
    assert moved["r1_exact"] != moved["r1_exact_base"] == untrained_r1["r1_exact_base"]
    # The float32 probe leaves the base model's weights as they were, bit for bit, its
    # matrices in the dtype they multiply in.
    assert matmul_dtype(trainer.model) == compute_dtype(BASE["dtype"], "cpu")
    after = dict(zip([id(p) for p in trainer.model.parameters()], weights, strict=True))
    for parameter in trainer.model.parameters():
        if not parameter.requires_grad:
            assert parameter.dtype == after[id(parameter)].dtype
            assert torch.equal(parameter, after[id(parameter)])


@pytest.mark.slow
def test_bf16_acts_on_what_the_adapter_learnt(
    smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small update (the control's kind: pick_up_right rewarded over pick_up_left, one step
    at learning rate 2e-5, probe KL about 0.007) shows in bf16 as the policy acts: its probe KL
    at least 0.9 of the float32 one. Before bf16 was mixed precision (the LoRA's contribution
    added to bf16 layer outputs and rounded with them) this update's ratio was 0.63.

    The adapter is trained in float32 and loaded as a checkpoint is, into a model whose
    matrices are multiplied in bf16 on every CPU: where oneDNN has no bf16 kernels (AVX2 only),
    ``compute_dtype`` would compute in float32 and the ratio would be 1 by construction, so the
    test asks for bf16 products there too (torch's fallback, slow: three probes only).
    """
    run = tiny_run(learning_rate=2e-5)
    learner = TorchGRPOTrainer(smollm2_dir, run, {**BASE, "dtype": "float32"})
    chats = table_conversations(2)
    calls = []
    for chat in chats:
        decision = decide(learner, chat)
        calls += [(choosing(learner, decision, Tool.PICK_UP_RIGHT, run), 1.0)]
        calls += [(choosing(learner, decision, Tool.PICK_UP_LEFT, run), 0.0)]
    random.seed(0)
    assert learner.update([group_of(calls[:2], run), group_of(calls[2:], run)]).rows == 4
    learner.save(tmp_path / "adapter")
    probes = probe_conversations(tiny_env(), TEMPLATES, 5)[:3]
    learnt = learner.probe(probes, SIX)

    monkeypatch.setattr(local, "compute_dtype", lambda dtype, device: DTYPES[dtype])
    acting = TorchGRPOTrainer(
        smollm2_dir, run, {**BASE, "dtype": "bfloat16"}, adapter=tmp_path / "adapter"
    )
    assert matmul_dtype(acting.model) == torch.bfloat16
    probe = acting.probe(probes, SIX)
    # The same adapter in float32, whichever model holds it.
    assert probe["probe_kl"] == pytest.approx(learnt["probe_kl"], rel=1e-3)
    assert probe["probe_kl"] > 1e-3
    assert probe["probe_kl_acting"] >= 0.9 * probe["probe_kl"], probe
