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
class PowerConfig:
    """The a-priori power question: episodes per cell to detect an effect of a given size."""

    effect_size: float
    alpha: float
    power: float

    @classmethod
    def from_dict(cls, section: dict[str, Any]) -> PowerConfig:
        """Build from the validated ``analysis.power`` section."""
        return cls(
            effect_size=float(section["effect_size"]),
            alpha=float(section["alpha"]),
            power=float(section["power"]),
        )


@dataclass(frozen=True, slots=True)
class AnalysisConfig:
    """What every statistic depends on: the rewards, and how intervals are estimated."""

    weights: RewardWeights
    variants: tuple[RewardVariant, ...]
    confidence: float
    bootstrap_resamples: int
    seed: int

    @classmethod
    def from_dict(cls, reward: dict[str, Any], analysis: dict[str, Any]) -> AnalysisConfig:
        """Build from the validated ``reward`` section and the interval keys of ``analysis``."""
        return cls(
            weights=reward_weights(reward),
            variants=tuple(RewardVariant(v) for v in reward["variants"]),
            confidence=float(analysis["confidence"]),
            bootstrap_resamples=int(analysis["bootstrap_resamples"]),
            seed=int(analysis["seed"]),
        )


@dataclass(frozen=True, slots=True)
class ComparisonConfig:
    """The pairwise comparisons: the statistics' settings, the pairs, and power's alpha.

    Attributes:
        analysis: Rewards and interval settings.
        comparisons: The (model a, model b) pairs of ``analysis.comparisons``.
        power: The power settings; their alpha is the one of each comparison's achieved power.
    """

    analysis: AnalysisConfig
    comparisons: tuple[tuple[str, str], ...]
    power: PowerConfig

    @classmethod
    def from_dict(cls, reward: dict[str, Any], analysis: dict[str, Any]) -> ComparisonConfig:
        """Build from the validated ``reward`` section and the comparison keys of ``analysis``."""
        return cls(
            analysis=AnalysisConfig.from_dict(reward, analysis),
            comparisons=tuple((a, b) for a, b in analysis["comparisons"]),
            power=PowerConfig.from_dict(analysis["power"]),
        )


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    """Thresholds of the degenerate-policy monitors; a cell at or above one is flagged.

    Attributes:
        weights: Reward weights; the degenerate monitor scores episodes with the paper reward.
        degenerate_reward: A meal-less episode scoring at least this is degenerate.
        degenerate_share: Flag a cell with at least this share of degenerate episodes.
        all_think_share: Flag a cell with at least this share of episodes whose every action
            was a think.
        no_call_rate: Flag a cell with at least this share of decisions without a tool call.
        starvation_share: Flag a cell with at least this share of episodes in which a seat
            went without a meal while another ate.
    """

    weights: RewardWeights
    degenerate_reward: float
    degenerate_share: float
    all_think_share: float
    no_call_rate: float
    starvation_share: float

    @classmethod
    def from_dict(cls, reward: dict[str, Any], monitors: dict[str, Any]) -> MonitorConfig:
        """Build from the validated ``reward`` and ``analysis.monitors`` sections."""
        return cls(
            weights=reward_weights(reward),
            degenerate_reward=float(monitors["degenerate_reward"]),
            degenerate_share=float(monitors["degenerate_share"]),
            all_think_share=float(monitors["all_think_share"]),
            no_call_rate=float(monitors["no_call_rate"]),
            starvation_share=float(monitors["starvation_share"]),
        )


def reward_weights(reward: dict[str, Any]) -> RewardWeights:
    """The weights of the validated ``reward`` section."""
    return RewardWeights(**{k: float(v) for k, v in reward["weights"].items()})


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
    _check_timeline(config)


def _check_timeline(config: dict[str, Any]) -> None:
    """The episode the report draws must be one the study plays."""
    timeline = config["analysis"]["timeline"]
    model = timeline["model"]
    if model not in config["models"]:
        raise ConfigError(f"config key 'analysis.timeline.model': unknown model '{model}'")
    if timeline["n"] not in config["experiment"]["sizes"]:
        raise ConfigError(
            f"config key 'analysis.timeline.n': {timeline['n']} is not in experiment.sizes"
        )
    episodes = cell_episodes(config, model)
    if timeline["episode"] >= episodes:
        raise ConfigError(
            f"config key 'analysis.timeline.episode': {model} plays episodes 0 to {episodes - 1}"
        )
