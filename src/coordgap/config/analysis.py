"""Settings of the analysis: rewards, intervals, comparisons, power and monitors."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from coordgap.env.variants import RewardVariant, RewardWeights

if TYPE_CHECKING:
    from collections.abc import Mapping


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
            weights=RewardWeights.from_dict(reward),
            variants=tuple(RewardVariant(v) for v in reward["variants"]),
            confidence=float(analysis["confidence"]),
            bootstrap_resamples=int(analysis["bootstrap_resamples"]),
            seed=int(analysis["seed"]),
        )


@dataclass(frozen=True, slots=True)
class ComparisonConfig:
    """The pairwise comparisons: the statistics' settings, the pairs, and the power settings.

    Attributes:
        analysis: Rewards and interval settings.
        comparisons: The (model a, model b) pairs of ``analysis.comparisons``.
        power: The power settings; each comparison's detectable effect uses their alpha and
            target power.
        checkpoints: Further families from checkpoint selection (``checkpoint_families``).
    """

    analysis: AnalysisConfig
    comparisons: tuple[tuple[str, str], ...]
    power: PowerConfig
    checkpoints: dict[str, tuple[tuple[str, str], ...]] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(
        cls,
        reward: dict[str, Any],
        analysis: dict[str, Any],
        checkpoints: dict[str, Any] | None = None,
    ) -> ComparisonConfig:
        """Build from the validated ``reward`` section and the comparison keys of ``analysis``.

        Args:
            reward: The ``reward`` section.
            analysis: The ``analysis`` keys the comparisons read.
            checkpoints: The families of ``checkpoint_families``, if the study trains.

        Returns:
            The comparisons' configuration.
        """
        return cls(
            analysis=AnalysisConfig.from_dict(reward, analysis),
            comparisons=tuple((a, b) for a, b in analysis["comparisons"]),
            power=PowerConfig.from_dict(analysis["power"]),
            checkpoints={
                family: tuple((a, b) for a, b in pairs)
                for family, pairs in (checkpoints or {}).items()
            },
        )


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    """Thresholds of the degenerate-policy monitors; a cell at or above one is flagged.

    Attributes:
        weights: Reward weights; the degenerate monitor scores episodes with the paper reward.
        degenerate_reward: A meal-less episode scoring at least this is degenerate.
        thresholds: Each monitor's threshold, by its share column
            (``coordgap.analysis.monitors.MONITORS``): flag a cell whose share reaches it.
    """

    weights: RewardWeights
    degenerate_reward: float
    thresholds: Mapping[str, float]

    @classmethod
    def from_dict(cls, reward: dict[str, Any], monitors: dict[str, Any]) -> MonitorConfig:
        """Build from the validated ``reward`` and ``analysis.monitors`` sections.

        Every key of ``analysis.monitors`` but ``degenerate_reward`` is a threshold: the
        schema admits exactly the monitors' share columns.
        """
        settings = dict(monitors)
        return cls(
            weights=RewardWeights.from_dict(reward),
            degenerate_reward=float(settings.pop("degenerate_reward")),
            thresholds=MappingProxyType({share: float(t) for share, t in settings.items()}),
        )


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """The positive control, stated before any result (``analysis.control``).

    Attributes:
        run: The control arm: a ``training.runs`` entry trained on the ``control`` reward.
        model: The model it is compared with: the arm's base model.
        policy: The selection policy whose checkpoints are checked.
        n: The table size of the check.
        min_gain: The smallest rise of the selected checkpoint's exact expected ``control``
            reward over the model's, in every seed, that passes.
    """

    run: str
    model: str
    policy: str
    n: int
    min_gain: float

    @classmethod
    def from_dict(cls, section: dict[str, Any]) -> ControlConfig:
        """Build from the validated ``analysis.control`` section (not null)."""
        return cls(
            run=section["run"],
            model=section["model"],
            policy=section["policy"],
            n=int(section["n"]),
            min_gain=float(section["min_gain"]),
        )
