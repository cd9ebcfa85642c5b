"""Typed, frozen experiment configuration and the cross-key checks of the config.

``config/config.yaml`` is checked against ``workflow/schemas/config.schema.yaml`` (JSON Schema,
``additionalProperties: false`` everywhere) by Snakemake's ``validate()`` and then by
``check_cross_keys`` for the rules the schema cannot express; both name the offending key before
any job runs. Jobs receive config sections through ``params:`` and turn them into these frozen
objects with their ``from_dict`` constructors.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from coordgap.env.protocols import Protocol
from coordgap.env.reward import RewardVariant, RewardWeights
from coordgap.env.table import TieBreak, TurnOrder


class ConfigError(ValueError):
    """An invalid configuration; the message starts with the offending key."""


class ScriptedPolicy(StrEnum):
    """The scripted reference policies."""

    RESOURCE_HIERARCHY = "resource_hierarchy"
    LEFT_FIRST = "left_first"
    RANDOM = "random"
    THINK_ONLY = "think_only"
    SILENT = "silent"


@dataclass(frozen=True, slots=True)
class EnvironmentConfig:
    """The rules of the table (DESIGN.md §2)."""

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
    """How a model decides (DESIGN.md §4)."""

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


@dataclass(frozen=True, slots=True)
class AnalysisConfig:
    """Everything the statistics, figures and report depend on."""

    weights: RewardWeights
    variants: tuple[RewardVariant, ...]
    confidence: float
    bootstrap_resamples: int
    seed: int
    comparisons: tuple[tuple[str, str], ...]

    @classmethod
    def from_dict(cls, reward: dict[str, Any], analysis: dict[str, Any]) -> AnalysisConfig:
        """Build from the validated ``reward`` and ``analysis`` sections."""
        return cls(
            weights=RewardWeights(**{k: float(v) for k, v in reward["weights"].items()}),
            variants=tuple(RewardVariant(v) for v in reward["variants"]),
            confidence=float(analysis["confidence"]),
            bootstrap_resamples=int(analysis["bootstrap_resamples"]),
            seed=int(analysis["seed"]),
            comparisons=tuple((a, b) for a, b in analysis["comparisons"]),
        )


def check_cross_keys(config: dict[str, Any]) -> None:
    """Check the rules that span several keys, which the JSON schema cannot express.

    Run after the schema check (Snakemake's ``validate()``), before any job starts.

    Args:
        config: The schema-valid config.

    Raises:
        ConfigError: On the first problem, naming the offending key.
    """
    models = config["models"]
    for i, pair in enumerate(config["analysis"]["comparisons"]):
        for j, name in enumerate(pair):
            if name not in models:
                raise ConfigError(
                    f"config key 'analysis.comparisons[{i}][{j}]': unknown model '{name}'"
                )
        if pair[0] == pair[1]:
            raise ConfigError(f"config key 'analysis.comparisons[{i}]': a model against itself")
    sizes = config["experiment"]["sizes"]
    if len(set(sizes)) != len(sizes):
        raise ConfigError("config key 'experiment.sizes': sizes must be distinct")
