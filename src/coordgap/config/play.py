"""Settings of play: the table's rules and the models (what an episode depends on)."""

from __future__ import annotations

import string
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

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
    """One entry of ``models:``.

    Attributes:
        name: The model's slug (used in output paths).
        kind: How it decides.
        entry: The validated config entry, kept whole: backends read their own settings
            from it, and it identifies the model's episodes in the resume journal.
    """

    name: str
    kind: ModelKind
    entry: dict[str, Any]

    @property
    def policy(self) -> ScriptedPolicy:
        """The scripted policy of a ``scripted`` model."""
        return ScriptedPolicy(self.entry["policy"])

    def settings(self) -> dict[str, Any]:
        """The entry as a plain dict (for fingerprints)."""
        return dict(self.entry)

    @classmethod
    def from_dict(cls, name: str, entry: dict[str, Any]) -> ModelSpec:
        """Build from one validated ``models.<name>`` entry."""
        return cls(name=name, kind=ModelKind(entry["kind"]), entry=dict(entry))


def cell_episodes(config: dict[str, Any], model: str) -> int:
    """Episodes in a cell of one model: a language model's own count if set, else the experiment's.

    Args:
        config: The validated config.
        model: A name in ``models``.

    Returns:
        The number of episodes per N of that model.
    """
    entry = config["models"][model]
    if entry["kind"] != "scripted" and entry["episodes_per_cell"] is not None:
        return int(entry["episodes_per_cell"])
    return int(config["experiment"]["episodes_per_cell"])


def accepted_error_share(config: dict[str, Any]) -> float:
    """The largest share of ``error`` episodes a cell may have and still be written.

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


def completion_limit(entry: dict[str, Any]) -> int:
    """Tokens a language model may write per decision: ``max_new_tokens`` or ``max_tokens``.

    Args:
        entry: A ``local`` or ``openai`` entry of ``models:``.

    Returns:
        The limit.
    """
    return int(entry["max_new_tokens"] if entry["kind"] == "local" else entry["max_tokens"])


def is_served(entry: dict[str, Any]) -> bool:
    """Whether a model is played through a server its own job starts (``serve:``)."""
    return entry["kind"] == "openai" and entry["serve"] is not None


def generation_rule(entry: dict[str, Any]) -> str:
    """The Snakemake rule that plays a model's cells.

    Served models start their server on a GPU; hosted APIs need no GPU and may run on the
    submit host; scripted and local models play inside the job.
    """
    if is_served(entry):
        return "generate_served_episodes"
    return "generate_api_episodes" if entry["kind"] == "openai" else "generate_episodes"


def weights_source(entry: dict[str, Any]) -> str | None:
    """Where a model's prepared weights come from: a local model's or a served one's source.

    Args:
        entry: A ``models:`` entry.

    Returns:
        The source, or None for a model without prepared weights.
    """
    if entry["kind"] == "local":
        return entry["source"]
    return entry["serve"]["source"] if is_served(entry) else None


def weights_source_key(name: str, entry: dict[str, Any]) -> str:
    """The config key that holds a model's weights source (see ``weights_source``).

    Args:
        name: The model's name in ``models:``.
        entry: Its entry.

    Returns:
        ``models.<name>.source`` for a local model, ``models.<name>.serve.source`` else.
    """
    return f"models.{name}.source" if entry["kind"] == "local" else f"models.{name}.serve.source"
