"""Adapters that give every kind of policy the one-philosopher async interface of the graphs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from coordgap.data import derive_seed
from coordgap.env.protocols import TOOLS
from coordgap.env.table import TurnOrder
from coordgap.policies.base import BatchSlot

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy as np

    from coordgap.config.play import EnvironmentConfig
    from coordgap.env.observation import Observation, PromptTemplates
    from coordgap.env.protocols import Tool
    from coordgap.policies.base import AsyncPolicy, Decision, Policy

    PolicyFactory = Callable[[int, int, np.random.Generator], AsyncPolicy]


class ChatBackend(Protocol):
    """A language model that turns chat messages into one tool-call decision."""

    async def decide(
        self,
        messages: list[dict[str, str]],
        tools: Sequence[Tool],
        seed: int,
        batch: BatchSlot | None = None,
    ) -> Decision:
        """Decide from the messages, choosing among ``tools``; sampling seeded by ``seed``.

        ``batch`` places the decision in the group it is made with (see ``BatchSlot``).
        """
        ...


class ScriptedAgentPolicy:
    """Serves a scripted (synchronous, batch) policy one philosopher at a time."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy

    async def adecide(self, observation: Observation) -> Decision:
        """The scripted decision for one observation."""
        (decision,) = self._policy.decide([observation])
        return decision


class LLMAgentPolicy:
    """Prompts a chat model with a philosopher's observation, rendered from the templates.

    Every call gets its own sampling seed from (episode seed, seat, round), and the calls of
    one simultaneous round form one batch group, so an episode's samples do not depend on how
    concurrent calls are scheduled or batched.

    Args:
        backend: The chat model.
        templates: The prompt templates of ``config/prompts/``.
        episode_seed: The episode's seed.
        simultaneous: Whether all philosophers of a round decide together (the table's turn
            order); in sequential rounds every call is a group of its own.
    """

    def __init__(
        self,
        backend: ChatBackend,
        templates: PromptTemplates,
        episode_seed: int,
        simultaneous: bool,
    ):
        self._backend = backend
        self._templates = templates
        self._episode_seed = episode_seed
        self._simultaneous = simultaneous

    async def adecide(self, observation: Observation) -> Decision:
        """Render the prompt, call the model and return its parsed decision."""
        seat, round_ = observation.philosopher, observation.round
        seed = derive_seed(self._episode_seed, seat, round_)
        batch = (
            BatchSlot((self._episode_seed, round_), observation.n, seat)
            if self._simultaneous
            else None
        )
        return await self._backend.decide(
            self._templates.messages(observation), TOOLS[observation.protocol], seed, batch
        )


def prompted_policies(
    backend: ChatBackend, env: EnvironmentConfig, templates: PromptTemplates
) -> PolicyFactory:
    """The per-episode policy factory of a language model on an open chat backend.

    Every language model's episodes are played by these policies: a cell's, and a training
    step's rollouts with the policy being trained.

    Args:
        backend: The model's chat backend.
        env: The table rules (whether the agents act at once).
        templates: Prompt templates.

    Returns:
        A factory ``(n, episode seed, policy rng) -> policy``.
    """

    def prompted(n: int, seed: int, rng: np.random.Generator) -> AsyncPolicy:
        return LLMAgentPolicy(
            backend, templates, seed, simultaneous=env.turn_order is TurnOrder.SIMULTANEOUS
        )

    return prompted
