"""Rollouts as ART trajectories and groups: the interchange format of both trainers.

A trajectory is one philosopher in one episode (DESIGN.md §6). Its histories are that
philosopher's LLM calls, one history per call: philosophers are memoryless, so every call is
a prompt of its own, and one history per call is also the layout ART tokenizes exactly
(reference/art-grpo.md §8.6). Each call's sampled tokens become an OpenAI ``Choice`` whose
log-probs name the token ids (``token_id:<id>``, as ART's vLLM runtime returns them), so ART's
tokenizer trains on exactly the sampled ids and takes their sampler log-probs as the old
policy's. Its reward is the episode's reward under the trained variant, shared by all seats.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import polars as pl
from openai.types.chat import ChatCompletionMessage, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs

from coordgap.env.reward import reward_expr
from coordgap.training._art import art

if TYPE_CHECKING:
    from collections.abc import Sequence

    from coordgap.config import TrainingRunConfig

# Rewards are rounded before ART computes advantages: rewards equal but for floating-point
# noise would otherwise get a standard deviation of ~1e-17 and full-size advantages.
REWARD_DECIMALS = 9


def sampled_choice(completion: str, token_ids: Sequence[int], logprobs: Sequence[float]) -> Choice:
    """A chat-completion choice carrying the sampled tokens and their sampler log-probs.

    Args:
        completion: The sampled text (special tokens included).
        token_ids: The sampled token ids.
        logprobs: Their log-probs under the sampling policy.

    Returns:
        The ``Choice`` ART trains on.
    """
    return Choice(
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
    )


def philosopher_trajectory(
    calls: Sequence[dict[str, Any]], reward: float, metadata: dict[str, Any]
) -> art.Trajectory:
    """One philosopher's trajectory in one episode.

    Args:
        calls: The philosopher's transcript rows in round order (``messages`` and ``tools``
            as JSON, ``completion``, ``token_ids``, ``logprobs``; DESIGN.md §5).
        reward: The episode's reward.
        metadata: Scalars identifying the trajectory (episode, seat, ...).

    Returns:
        A trajectory whose first call is its main history and later calls are
        ``additional_histories``, all sharing its reward and advantage.
    """
    histories = [
        art.trajectories.History(
            messages_and_choices=[
                *json.loads(call["messages"]),
                sampled_choice(call["completion"], call["token_ids"], call["logprobs"]),
            ],
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
    """Each episode's reward under the run's trained variant and weights, rounded.

    Args:
        episodes: An episode table (DESIGN.md §5).
        run: The training run.

    Returns:
        ``{episode index: reward}`` for the episodes with status ``ok``.
    """
    rewarded = episodes.filter(pl.col("status") == "ok").select(
        "episode", reward_expr(run.variant, run.weights).round(REWARD_DECIMALS)
    )
    return dict(zip(rewarded["episode"].to_list(), rewarded["reward"].to_list(), strict=True))


def trajectory_groups(
    episodes: pl.DataFrame, transcripts: pl.DataFrame, run: TrainingRunConfig
) -> list[art.TrajectoryGroup]:
    """The GRPO groups of one step's rollouts.

    Episode ``e`` belongs to group ``e // episodes_per_group`` (one scenario per group). A
    pooled group holds every philosopher of its episodes (seats are symmetric); ``per_seat``
    makes one group per seat. Episodes that ended in an error are left out.

    Args:
        episodes: The step's episode table.
        transcripts: The step's transcript table.
        run: The training run.

    Returns:
        The groups, in (group, seat) order; ART drops those whose rewards are all equal.
    """
    rewards = episode_rewards(episodes, run)
    groups: dict[tuple[int, int], list[art.Trajectory]] = {}
    calls = transcripts.sort("episode", "philosopher", "round")
    for (episode, seat), rows in calls.group_by(["episode", "philosopher"], maintain_order=True):
        if episode not in rewards:
            continue
        group = episode // run.episodes_per_group
        key = (group, seat if run.grouping == "per_seat" else 0)
        metadata = {"episode": episode, "philosopher": seat, "group": group}
        groups.setdefault(key, []).append(
            philosopher_trajectory(rows.to_dicts(), rewards[episode], metadata)
        )
    return [art.TrajectoryGroup(groups[key]) for key in sorted(groups)]
