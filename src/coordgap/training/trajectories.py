"""Rollouts as ART trajectories and groups: the interchange format of both trainers.

A trajectory is one philosopher in one episode. Its histories are that philosopher's LLM calls,
one history per call: philosophers are memoryless, so every call is a prompt of its own, and
one history per call is also the layout ART 0.5.18 tokenizes exactly (with several calls in one
history, ART re-renders the earlier tool calls' markup beside the sampled tokens). Its reward is
the episode's reward under the trained variant, shared by all seats (seats are symmetric, so a
group pools every philosopher of its episodes).

Each call becomes the assistant turn ART trains on, an OpenAI ``Choice`` whose log-probs name
its token ids (``token_id:<id>``, as ART's vLLM runtime returns them):

* a free decision: the sampled tokens with their sampler log-probs, which ART trains
  token by token;
* a constrained decision (``DecisionChoice``): a single position whose log-prob is the
  choice's, log mu_old(k), carrying the candidates and the choice. ART's preprocessing then
  computes advantages, weights and normalisation per *decision*, and the trainer puts
  log mu_theta(k) at that position, so ART's loss works on the six-way policy that acted.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import polars as pl
from openai.types.chat import ChatCompletionMessage, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs

from coordgap.env.variants import REWARD_TOLERANCE, reward_expr
from coordgap.training._art import art

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from coordgap.config.training import TrainingRunConfig


class DecisionChoice(Choice):
    """A constrained decision as ART trains it: one position, the six-way choice's log-prob.

    Its one "token" is the chosen call's first token, a placeholder: the trainer scores the
    candidates after the prompt itself (``coordgap.training.grpo``).

    Attributes:
        candidates: The token ids of every candidate call, as the sampler scored them.
        chosen: The index of the chosen candidate.
    """

    candidates: list[list[int]]
    chosen: int


def _choice(
    completion: str, token_ids: Sequence[int], logprobs: Sequence[float], **decision: Any
) -> Choice:
    """A chat-completion choice whose trainable tokens are ``token_ids`` with ``logprobs``."""
    return (DecisionChoice if decision else Choice)(
        finish_reason="stop",
        index=0,
        message=ChatCompletionMessage(role="assistant", content=completion),
        logprobs=ChoiceLogprobs(
            content=[
                ChatCompletionTokenLogprob(
                    token=f"token_id:{token}", logprob=logprob, bytes=None, top_logprobs=[]
                )
                for token, logprob in zip(token_ids, logprobs, strict=True)
            ]
        ),
        **decision,
    )


def sampled_choice(call: dict[str, Any], temperature: float) -> Choice:
    """The assistant turn ART trains on for one transcript row (see the module docstring).

    Args:
        call: A transcript row (``coordgap.data.TRANSCRIPT_SCHEMA``).
        temperature: The run's rollout temperature, which the trainer's log-probs use.

    Returns:
        A ``Choice`` of the sampled tokens (free decoding) or a ``DecisionChoice`` (constrained).

    Raises:
        ValueError: The call was sampled at another temperature: its recorded log-probs are
            not those of the policy the trainer would compare them with.
    """
    recorded = call.get("temperature")
    if recorded is not None and not math.isclose(recorded, temperature):
        raise ValueError(
            f"a transcript sampled at temperature {recorded} cannot train a run at {temperature}"
        )
    if call.get("candidates") is None:
        return _choice(call["completion"], call["token_ids"], call["logprobs"])
    candidates = [list(c) for c in call["candidates"]]
    chosen = call["choice"]
    return _choice(
        call["completion"],
        candidates[chosen][:1],
        [call["choice_logprob"]],
        candidates=candidates,
        chosen=chosen,
    )


def philosopher_trajectory(
    calls: Sequence[dict[str, Any]], reward: float, metadata: dict[str, Any], temperature: float
) -> art.Trajectory:
    """One philosopher's trajectory in one episode.

    Args:
        calls: The philosopher's transcript rows in round order (``messages`` and ``tools``
            as JSON; ``coordgap.data.TRANSCRIPT_SCHEMA``).
        reward: The episode's reward.
        metadata: Scalars identifying the trajectory (episode, seat, ...).
        temperature: The run's rollout temperature.

    Returns:
        A trajectory whose first call is its main history and later calls are
        ``additional_histories``, all sharing its reward and advantage.
    """
    histories = [
        art.trajectories.History(
            messages_and_choices=[*json.loads(call["messages"]), sampled_choice(call, temperature)],
            # A served model's prompt had the tools rendered in by its chat template; ART's
            # tokenizer must render the same ones.
            tools=json.loads(call["tools"]) if call.get("tools") else None,
        )
        for call in calls
    ]
    return art.Trajectory(
        # ART tokenizes the main history from these two fields, the others from their own.
        messages_and_choices=histories[0].messages_and_choices,
        tools=histories[0].tools,
        additional_histories=histories[1:],
        reward=reward,
        metadata=metadata,
    )


def episode_rewards(episodes: pl.DataFrame, run: TrainingRunConfig) -> dict[int, float]:
    """Each episode's reward under the run's trained variant and weights, rounded (``reward_expr``).

    Args:
        episodes: An episode table (``coordgap.data.EPISODE_SCHEMA``).
        run: The training run.

    Returns:
        ``{episode index: reward}`` for the episodes with status ``ok``.
    """
    rewarded = episodes.filter(pl.col("status") == "ok").select(
        "episode", reward_expr(run.variant, run.weights)
    )
    return dict(zip(rewarded["episode"].to_list(), rewarded["reward"].to_list(), strict=True))


def trajectory_groups(
    episodes: pl.DataFrame,
    transcripts: pl.DataFrame,
    run: TrainingRunConfig,
    rewards: Mapping[int, float] | None = None,
) -> list[art.TrajectoryGroup]:
    """The GRPO groups of one step's rollouts, with no trajectory where the rewards are equal.

    Episode ``e`` belongs to group ``e // episodes_per_group`` (one scenario per group), which
    holds every philosopher of its episodes. Episodes that ended in an error are left out.

    A group whose rewards are all equal (their spread below ``REWARD_TOLERANCE``) keeps no
    trajectory. ART 0.5.18 drops a trajectory only when its advantage is exactly 0, and the
    mean of equal rewards is rounded: (0.2, 0.2, 0.2) has the mean 0.20000000000000004, so
    each trajectory would get an advantage of -2.8e-11 after ART's scaling, and each of
    its rows a full-size AdamW step in the direction of that rounding noise. The group itself
    stays, empty, so that both trainers' ``groups`` counts the groups the step played and
    ``groups_trainable`` those with a trajectory left (ART's tokenizer skips an empty group).

    Args:
        episodes: The step's episode table.
        transcripts: The step's transcript table.
        run: The training run.
        rewards: Each episode's reward; None for the run's trained variant
            (``episode_rewards``). Benchmarks give their own, to train every trajectory.

    Returns:
        The groups, in group order.
    """
    if rewards is None:
        rewards = episode_rewards(episodes, run)
    groups: dict[int, list[art.Trajectory]] = {}
    calls = transcripts.sort("episode", "philosopher", "round")
    for (episode, seat), rows in calls.group_by(["episode", "philosopher"], maintain_order=True):
        if episode not in rewards:
            continue
        group = episode // run.episodes_per_group
        metadata = {"episode": episode, "philosopher": seat, "group": group}
        groups.setdefault(group, []).append(
            philosopher_trajectory(rows.to_dicts(), rewards[episode], metadata, run.temperature)
        )
    return [art.TrajectoryGroup(_unless_equal(groups[key])) for key in sorted(groups)]


def _unless_equal(trajectories: list[art.Trajectory]) -> list[art.Trajectory]:
    """The trajectories of a group, or none when their rewards are equal (``REWARD_TOLERANCE``)."""
    rewards = [trajectory.reward for trajectory in trajectories]
    return trajectories if max(rewards) - min(rewards) >= REWARD_TOLERANCE else []
