"""Settings of play: the table's rules and the models (what an episode depends on)."""

from __future__ import annotations

import string
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

from coordgap.env.protocols import Protocol
from coordgap.env.table import TieBreak, TurnOrder

if TYPE_CHECKING:
    from collections.abc import Sequence


class ScriptedPolicy(StrEnum):
    """The scripted reference policies."""

    RESOURCE_HIERARCHY = "resource_hierarchy"
    LEFT_FIRST = "left_first"
    RANDOM = "random"
    THINK_ONLY = "think_only"
    SILENT = "silent"


@dataclass(frozen=True, slots=True)
class EnvironmentConfig:
    """The rules of the table (``coordgap.env.table``)."""

    protocol: Protocol
    turn_order: TurnOrder
    tie_break: TieBreak
    rounds: int
    deadlock_terminal: bool
    history: int

    @classmethod
    def from_dict(cls, section: dict[str, Any]) -> EnvironmentConfig:
        """Build from the validated ``environment`` section."""
        return cls(
            protocol=Protocol(section["protocol"]),
            turn_order=TurnOrder(section["turn_order"]),
            tie_break=TieBreak(section["tie_break"]),
            rounds=int(section["rounds"]),
            deadlock_terminal=bool(section["deadlock_terminal"]),
            history=int(section["history"]),
        )


class ModelKind(StrEnum):
    """How a model decides (README.md: Language models)."""

    SCRIPTED = "scripted"
    OPENAI = "openai"
    LOCAL = "local"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One entry of ``models:``, as the class of its kind (``ModelSpec.from_dict`` picks it).

    Each kind declares what the workflow needs to know about its models: the rule that plays
    them, the GPUs and threads of that job, the weights it prepares, the identity that
    provenance records, and the completion limit of a language model. How a model is opened
    is its kind's entry in ``coordgap.policies.factory.BACKENDS``.

    Attributes:
        name: The model's slug (used in output paths).
        entry: The validated config entry, kept whole: backends read their own settings
            from it, and it identifies the model's episodes in the resume journal.
    """

    name: str
    entry: dict[str, Any]

    kind: ClassVar[ModelKind]
    """How the models of this class decide."""
    in_process: ClassVar[bool] = False
    """Whether the job itself runs the model (it gets every core the job may use)."""
    is_language_model: ClassVar[bool] = True
    """Whether it writes tokens (everything but a scripted policy)."""

    @property
    def generation_rule(self) -> str:
        """The Snakemake rule that plays the model's cells."""
        return "generate_episodes"

    @property
    def gpus(self) -> int:
        """GPUs the job that plays the model's cells holds."""
        return 0

    @property
    def is_served(self) -> bool:
        """Whether it is played through a server its own job starts (``serve:``)."""
        return False

    @property
    def threads(self) -> int | None:
        """Threads of a job that runs it in-process, or None for all the job may use."""
        return None

    @property
    def weights_source_key(self) -> str | None:
        """The config key of its prepared weights' source, or None for a model without."""
        return None

    @property
    def weights_source(self) -> str | None:
        """Where its prepared weights come from (the value at ``weights_source_key``)."""
        return None

    @property
    def served_gpu_memory_gb(self) -> float:
        """GPU memory a job that serves or trains it needs; 0 (any card) if not served."""
        return 0

    @property
    def own_episodes_per_cell(self) -> int | None:
        """Its own episodes per cell, or None to play the experiment's."""
        return None

    @property
    def api_key_env(self) -> str | None:
        """The environment variable that holds its API key, or None for a model without."""
        return None

    @property
    def is_paid_api(self) -> bool:
        """Whether its tokens are paid for: a hosted API, not a server of its own."""
        return False

    @property
    def calls_to(self) -> str | None:
        """Where its decisions are asked, as messages name it; None for a model in the job."""
        return None

    def identity(self) -> dict[str, Any]:
        """What provenance records of it: its kind and where it comes from."""
        identity: dict[str, Any] = {"name": self.name, "kind": self.kind.value}
        # The source names the revision where there is one (hf:<repo>@<revision>).
        if self.weights_source is not None:
            identity["source"] = self.weights_source
        return identity

    def settings(self) -> dict[str, Any]:
        """The entry as a plain dict (for fingerprints)."""
        return dict(self.entry)

    @staticmethod
    def from_dict(name: str, entry: dict[str, Any]) -> ModelSpec:
        """Build the model of its kind from one validated ``models.<name>`` entry."""
        return MODEL_CLASSES[ModelKind(entry["kind"])](name=name, entry=dict(entry))


class ScriptedModel(ModelSpec):
    """A built-in scripted policy: no language model, no weights, nothing to serve."""

    __slots__ = ()
    kind = ModelKind.SCRIPTED
    is_language_model = False

    @property
    def policy(self) -> ScriptedPolicy:
        """Its scripted policy."""
        return ScriptedPolicy(self.entry["policy"])


class _LanguageModel(ModelSpec):
    """A language model: it may play its own number of episodes per cell."""

    __slots__ = ()

    @property
    def own_episodes_per_cell(self) -> int | None:
        """The entry's ``episodes_per_cell``, or None to play the experiment's."""
        count = self.entry["episodes_per_cell"]
        return None if count is None else int(count)


class LocalModel(_LanguageModel):
    """A model the job runs in-process on its prepared weights (torch, on a GPU if there is one)."""

    __slots__ = ()
    kind = ModelKind.LOCAL
    in_process = True

    @property
    def gpus(self) -> int:
        """One: the job runs the model, on a GPU where there is one."""
        return 1

    @property
    def threads(self) -> int | None:
        """The entry's ``threads``."""
        return self.entry["threads"]

    @property
    def weights_source_key(self) -> str:
        """``models.<name>.source``."""
        return f"models.{self.name}.source"

    @property
    def weights_source(self) -> str:
        """The entry's ``source``."""
        return self.entry["source"]

    @property
    def completion_limit(self) -> int:
        """Tokens it may write per decision (``max_new_tokens``)."""
        return int(self.entry["max_new_tokens"])


class OpenAIModel(_LanguageModel):
    """A chat model behind an OpenAI-compatible or provider API: hosted, or served by its job."""

    __slots__ = ()
    kind = ModelKind.OPENAI

    @property
    def generation_rule(self) -> str:
        """A served model's server runs on a GPU, a hosted API needs none: two rules."""
        return "generate_served_episodes" if self.is_served else "generate_api_episodes"

    @property
    def gpus(self) -> int:
        """One for a served model (its server's), none for a hosted API."""
        return int(self.is_served)

    @property
    def is_served(self) -> bool:
        """Whether the entry has ``serve:``."""
        return self.entry["serve"] is not None

    @property
    def weights_source_key(self) -> str | None:
        """``models.<name>.serve.source`` of a served model."""
        return f"models.{self.name}.serve.source" if self.is_served else None

    @property
    def weights_source(self) -> str | None:
        """A served model's ``serve.source``."""
        return self.entry["serve"]["source"] if self.is_served else None

    @property
    def served_gpu_memory_gb(self) -> float:
        """A served model's ``serve.gpu_memory_gb``."""
        return self.entry["serve"]["gpu_memory_gb"] if self.is_served else 0

    @property
    def api_key_env(self) -> str | None:
        """The entry's ``api_key_env``."""
        return self.entry["api_key_env"]

    @property
    def completion_limit(self) -> int:
        """Tokens it may write per decision (``max_tokens``)."""
        return int(self.entry["max_tokens"])

    @property
    def is_paid_api(self) -> bool:
        """True for a hosted API."""
        return not self.is_served

    def identity(self) -> dict[str, Any]:
        """Its kind, provider and model id, and the source of a served model's weights."""
        return super().identity() | {
            "provider": self.entry["provider"],
            "model": self.entry["model"],
        }

    @property
    def calls_to(self) -> str:
        """The endpoint and the model name, e.g. ``http://gpu-node:8000/v1, model 'Qwen'``."""
        base_url = self.entry["base_url"]
        if base_url is None and self.is_served:
            # Its job starts the server on a port chosen then.
            base_url = "the model server its job starts"
        return calls_to(endpoint_name(base_url, self.entry["provider"]), self.entry["model"])


MODEL_CLASSES: dict[ModelKind, type[ModelSpec]] = {
    ModelKind.SCRIPTED: ScriptedModel,
    ModelKind.LOCAL: LocalModel,
    ModelKind.OPENAI: OpenAIModel,
}
"""The class of each model kind; every kind has one (tested)."""


def endpoint_name(base_url: str | None, provider: str) -> str:
    """An endpoint as messages name it: its base URL, or the provider's default endpoint."""
    return base_url or f"the default endpoint of provider {provider!r}"


def calls_to(endpoint: str, model: str) -> str:
    """Where a model's calls go, as every message about them names it (never with the key)."""
    return f"{endpoint}, model {model!r}"


def cell_episodes(config: dict[str, Any], model: str) -> int:
    """Episodes in a cell of one model: a language model's own count if set, else the experiment's.

    Args:
        config: The validated config.
        model: A name in ``models``.

    Returns:
        The number of episodes per N of that model.
    """
    own = ModelSpec.from_dict(model, config["models"][model]).own_episodes_per_cell
    return int(config["experiment"]["episodes_per_cell"]) if own is None else own


def accepted_error_share(config: dict[str, Any]) -> float:
    """The largest share of ``error`` episodes a cell, or a training step's rollouts, may have.

    Jobs read it from the config, not from their params: it decides whether a cell is accepted,
    not what its episodes are, so changing it must not replay the cells already written (paid
    API calls among them).

    Args:
        config: The validated config.

    Returns:
        ``experiment.max_error_share``.
    """
    return float(config["experiment"]["max_error_share"])


# Placeholders of serve.command and serve.lora (coordgap.policies.serving fills them in).
COMMAND_FIELDS = frozenset({"weights", "model", "host", "port"})
LORA_FIELDS = frozenset({"adapter", "adapter_name"})


def template_fields(template: Sequence[str]) -> set[str]:
    """The placeholder names a command template uses (``{port}`` gives ``port``).

    Args:
        template: Command-line arguments, ``str.format`` templates (``{{`` is a brace).

    Returns:
        The field names.
    """
    return {
        field
        for argument in template
        for _, field, _, _ in string.Formatter().parse(argument)
        if field is not None
    }
