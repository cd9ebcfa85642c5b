"""Build the per-episode policies of a model from its config entry."""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

from coordgap.config.keys import check_filled
from coordgap.config.play import ModelKind, ScriptedModel
from coordgap.policies.adapters import ScriptedAgentPolicy, prompted_policies
from coordgap.policies.scripted import make_scripted_policy
from coordgap.policies.serving import serve_model

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    import numpy as np

    from coordgap.config.play import EnvironmentConfig, ModelSpec
    from coordgap.env.observation import PromptTemplates
    from coordgap.policies.adapters import ChatBackend
    from coordgap.policies.base import AsyncPolicy

    PolicyFactory = Callable[[int, int, np.random.Generator], AsyncPolicy]


def _local_backend(model: ModelSpec, weights: Path | None) -> ChatBackend:
    """The in-process backend of a ``local`` model, on its prepared weights."""
    # Imported here: torch and transformers take seconds to import, and scripted and API
    # models never need them.
    from coordgap.policies.local import LocalChatModel

    if weights is None:
        raise ValueError(f"model '{model.name}': a local model needs its prepared weights")
    entry = model.entry
    return LocalChatModel(
        weights,
        adapter=entry["adapter"],
        dtype=entry["dtype"],
        decoding=entry["decoding"],
        temperature=entry["temperature"],
        max_new_tokens=entry["max_new_tokens"],
        max_batch=entry["max_batch"],
        chat_template_kwargs=entry["chat_template_kwargs"],
    )


def _openai_backend(model: ModelSpec, weights: Path | None) -> ChatBackend:
    """The client of an ``openai`` model's endpoint (a hosted API or its own server)."""
    from coordgap.policies.remote import OpenAICompatible

    # The config entry uses the backend's own field names (the schema's openai_model).
    return OpenAICompatible(
        **{
            field.name: model.entry[field.name]
            for field in dataclasses.fields(OpenAICompatible)
            # Settings a config entry has no key for (a trainer's) keep their defaults.
            if field.init and field.name in model.entry
        }
    )


# The chat backend of each kind of language model; scripted models have none.
BACKENDS: dict[ModelKind, Callable[[ModelSpec, Path | None], ChatBackend]] = {
    ModelKind.LOCAL: _local_backend,
    ModelKind.OPENAI: _openai_backend,
}


def open_backend(model: ModelSpec, weights: Path | None) -> ChatBackend:
    """Create the chat backend of a language model: loads weights or checks the API key.

    Args:
        model: An ``openai`` or ``local`` model entry.
        weights: The prepared weights folder of a ``local`` model.

    Returns:
        The backend, shared by every episode of the job.

    Raises:
        ValueError: A model kind without a chat backend (``scripted``).
        MissingAPIKeyError: The entry's ``api_key_env`` is not set (names the variable).
    """
    if model.kind not in BACKENDS:
        raise ValueError(f"model '{model.name}': kind {model.kind} has no chat backend")
    return BACKENDS[model.kind](model, weights)


@contextmanager
def open_policy_factory(
    model: ModelSpec,
    env: EnvironmentConfig,
    templates: PromptTemplates,
    weights: Path | None,
    serve_host: str = "loopback",
) -> Iterator[tuple[PolicyFactory, int]]:
    """Open the model's backend once and yield a per-episode policy factory.

    A served model's server (``serve:``) runs while the factory is open, and stops when it
    closes, however it closes (``coordgap.policies.serving``).

    Args:
        model: The model entry.
        env: The table rules (the protocol decides the tools).
        templates: Prompt templates for language models.
        weights: The prepared weights folder of a ``local`` or served model, else None.
        serve_host: Where a served model's server listens: ``loopback`` or ``node``.

    Yields:
        A factory ``(n, episode seed, policy rng) -> policy`` and the episodes to play at once.

    Raises:
        ConfigError: The entry still holds a ``FILL-IN`` placeholder (names the key).
        ServerStartError: A served model's server did not start.
    """
    if isinstance(model, ScriptedModel):

        def scripted(n: int, seed: int, rng: np.random.Generator) -> AsyncPolicy:
            return ScriptedAgentPolicy(make_scripted_policy(model.policy, n, env.protocol, rng))

        # Scripted decisions never wait, so concurrency would only add scheduling overhead.
        yield scripted, 1
        return
    check_filled(model.entry, f"models.{model.name}")
    with ExitStack() as stack:
        if model.is_served:
            model = stack.enter_context(serve_model(model, weights, serve_host))
        policies = prompted_policies(open_backend(model, weights), env, templates)
        yield policies, model.entry["max_in_flight"]
