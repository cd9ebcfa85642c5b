"""Build the per-episode policies of a model from its config entry."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

from coordgap.config import ModelKind
from coordgap.policies.adapters import ScriptedAgentPolicy
from coordgap.policies.scripted import make_scripted_policy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import numpy as np

    from coordgap.config import EnvironmentConfig, ModelSpec
    from coordgap.env.observation import PromptTemplates
    from coordgap.policies.base import AsyncPolicy

    PolicyFactory = Callable[[int, int, np.random.Generator], AsyncPolicy]


@contextmanager
def open_policy_factory(
    model: ModelSpec, env: EnvironmentConfig, templates: PromptTemplates
) -> Iterator[tuple[PolicyFactory, int]]:
    """Load the model's backend once and yield a per-episode policy factory.

    Args:
        model: The model entry.
        env: The table rules (the protocol decides the tools).
        templates: Prompt templates for language models.

    Yields:
        A factory ``(n, episode seed, policy rng) -> policy`` and the episodes to play at once.
    """
    if model.kind is ModelKind.SCRIPTED:

        def scripted(n: int, seed: int, rng: np.random.Generator) -> AsyncPolicy:
            return ScriptedAgentPolicy(make_scripted_policy(model.policy, n, env.protocol, rng))

        # Scripted decisions never wait, so concurrency would only add scheduling overhead.
        yield scripted, 1
        return
    raise NotImplementedError(model.kind)
