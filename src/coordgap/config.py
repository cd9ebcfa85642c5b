"""Typed, frozen experiment configuration and the cross-key checks of the config.

``config/config.yaml`` is checked against ``workflow/schemas/config.schema.yaml`` (JSON Schema,
``additionalProperties: false`` everywhere) by Snakemake's ``validate()`` and then by
``check_cross_keys`` for the rules the schema cannot express; both name the offending key before
any job runs. Jobs receive config sections through ``params:`` and turn them into these frozen
objects with their ``from_dict`` constructors.
"""

from __future__ import annotations

import dataclasses
import itertools
import string
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from coordgap.env.protocols import Protocol
from coordgap.env.reward import RewardVariant, RewardWeights
from coordgap.env.table import TieBreak, TurnOrder

if TYPE_CHECKING:
    from collections.abc import Sequence


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
        degenerate_share: Flag a cell with at least this share of degenerate episodes.
        all_think_share: Flag a cell with at least this share of episodes whose every action
            was a think.
        no_call_rate: Flag a cell with at least this share of decisions without a tool call.
        truncated_rate: Flag a cell with at least this share of decisions cut off by the
            completion token limit.
        starvation_share: Flag a cell with at least this share of episodes in which a seat
            went without a meal while another ate.
    """

    weights: RewardWeights
    degenerate_reward: float
    degenerate_share: float
    all_think_share: float
    no_call_rate: float
    truncated_rate: float
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
            truncated_rate=float(monitors["truncated_rate"]),
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


# Marks a value the user must fill in (config/paper.yaml's API model names): plans and dry runs
# accept it, a job that would use it stops, naming the key.
FILL_IN = "FILL-IN"


def unfilled_keys(node: Any, key: str) -> list[str]:
    """The dotted keys under ``node`` whose value is still a ``FILL-IN`` placeholder.

    Args:
        node: A config value (a section, an entry or a leaf).
        key: Its dotted key, e.g. ``models.gpt-5.4``.

    Returns:
        The keys whose string value starts with ``FILL-IN``, in config order.
    """
    if isinstance(node, dict):
        return [k for name, v in node.items() for k in unfilled_keys(v, f"{key}.{name}")]
    if isinstance(node, list):
        return [k for i, v in enumerate(node) for k in unfilled_keys(v, f"{key}[{i}]")]
    return [key] if isinstance(node, str) and node.startswith(FILL_IN) else []


def check_filled(node: Any, key: str) -> None:
    """Refuse to use a config value that is still a ``FILL-IN`` placeholder.

    Args:
        node: The config value a job is about to use.
        key: Its dotted key.

    Raises:
        ConfigError: Naming the first such key and what it holds.
    """
    keys = unfilled_keys(node, key)
    if keys:
        raise ConfigError(
            f"config key '{keys[0]}' is still a placeholder: fill in the value it describes "
            f"(all placeholders: {', '.join(keys)})"
        )


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


class Trainer(StrEnum):
    """What runs a GRPO update (README.md: GRPO training)."""

    TORCH = "torch"
    ART = "art"


@dataclass(frozen=True, slots=True)
class LoraSettings:
    """The LoRA adapter a run trains (ART's defaults: rank 8, alpha 16, no dropout)."""

    rank: int
    alpha: int
    dropout: float
    target_modules: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OptimizerSettings:
    """AdamW with a constant learning rate and a gradient-norm clip (ART's defaults)."""

    beta1: float
    beta2: float
    weight_decay: float
    max_grad_norm: float


@dataclass(frozen=True, slots=True)
class TrainingRunConfig:
    """One GRPO run: a base model, a trainer and the recipe (``training.runs.<name>``).

    Attributes:
        name: The run's slug (used in output paths).
        base_model: The ``models:`` entry (kind ``local``) whose weights are trained.
        trainer: ``torch`` (our loop around ART's math) or ``art`` (ART's LocalBackend).
        steps: GRPO steps; checkpoints 0 (the untrained adapter) to ``steps`` are written.
        groups_per_step: Groups played per step (one scenario each).
        episodes_per_group: Episodes per group (the same scenario, sampled independently).
        n: Philosophers at the training table, unless ``curriculum`` says otherwise.
        curriculum: ``(from_step, n)`` pairs in increasing step order, the first from step 0:
            the table size of each step (intervention 3); empty for a fixed ``n``.
        variant: The reward variant trained on (intervention 1).
        weights: Its component weights.
        temperature: Sampling temperature of the rollouts.
        learning_rate: AdamW's (constant) learning rate.
        lora: The adapter's shape.
        loss: ``cispo`` (ART's default) or ``ppo``.
        epsilon: Lower clip of the importance ratio (None: ART's default for the loss).
        epsilon_high: Upper clip (None: ART's default for the loss).
        optimizer: AdamW's other settings.
        warmup: Run ART's warm-up step (learning rate 1e-9 on the first row) before the first
            update of a fresh optimizer.
        max_in_flight: Rollout episodes played at once.
        seed: Seeds the adapter's initialisation and every step's generators.
        art_internal_config: Passed to ``art.TrainableModel(_internal_config=...)`` by the
            ``art`` trainer, merged under the LoRA settings above.
    """

    name: str
    base_model: str
    trainer: Trainer
    steps: int
    groups_per_step: int
    episodes_per_group: int
    n: int
    curriculum: tuple[tuple[int, int], ...]
    variant: RewardVariant
    weights: RewardWeights
    temperature: float
    learning_rate: float
    lora: LoraSettings
    loss: Literal["cispo", "ppo"]
    epsilon: float | None
    epsilon_high: float | None
    optimizer: OptimizerSettings
    warmup: bool
    max_in_flight: int
    seed: int
    art_internal_config: dict[str, Any]

    def n_at(self, step: int) -> int:
        """The table size of the rollouts of ``step`` (0-based)."""
        size = self.n
        for start, n in self.curriculum:
            if start <= step:
                size = n
        return size

    def settings(self) -> dict[str, Any]:
        """The run as a plain dict of plain values (fingerprints, provenance)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, name: str, entry: dict[str, Any]) -> TrainingRunConfig:
        """Build from one validated ``training.runs.<name>`` entry."""
        reward = entry["reward"]
        return cls(
            name=name,
            base_model=entry["base_model"],
            trainer=Trainer(entry["trainer"]),
            steps=int(entry["steps"]),
            groups_per_step=int(entry["groups_per_step"]),
            episodes_per_group=int(entry["episodes_per_group"]),
            n=int(entry["n"]),
            curriculum=tuple(
                (int(stage["from_step"]), int(stage["n"])) for stage in entry["curriculum"] or ()
            ),
            variant=RewardVariant(reward["variant"]),
            weights=RewardWeights(**{k: float(v) for k, v in reward["weights"].items()}),
            temperature=float(entry["temperature"]),
            learning_rate=float(entry["learning_rate"]),
            lora=LoraSettings(
                rank=int(entry["lora"]["rank"]),
                alpha=int(entry["lora"]["alpha"]),
                dropout=float(entry["lora"]["dropout"]),
                target_modules=tuple(entry["lora"]["target_modules"]),
            ),
            loss=entry["loss"],
            epsilon=entry["epsilon"],
            epsilon_high=entry["epsilon_high"],
            optimizer=OptimizerSettings(**{k: float(v) for k, v in entry["optimizer"].items()}),
            warmup=bool(entry["warmup"]),
            max_in_flight=int(entry["max_in_flight"]),
            seed=int(entry["seed"]),
            art_internal_config=dict(entry["art_internal_config"] or {}),
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
    known = set(models) | set(selected_checkpoints(config))
    for i, pair in enumerate(config["analysis"]["comparisons"]):
        for j, name in enumerate(pair):
            if name not in known:
                raise ConfigError(
                    f"config key 'analysis.comparisons[{i}][{j}]': unknown model '{name}'"
                )
        if pair[0] == pair[1]:
            raise ConfigError(f"config key 'analysis.comparisons[{i}]': a model against itself")
    sizes = config["experiment"]["sizes"]
    if len(set(sizes)) != len(sizes):
        raise ConfigError("config key 'experiment.sizes': sizes must be distinct")
    for name, entry in models.items():
        if is_served(entry):
            _check_served(f"models.{name}", entry)
        _check_source(name, entry)
    for name, run in config["training"]["runs"].items():
        _check_run(f"training.runs.{name}", run, models)
        if name in models:
            raise ConfigError(f"config key 'training.runs.{name}': a model has this name too")
    for name in config["plan"]["prices"]:
        if name not in models or models[name]["kind"] != "openai" or is_served(models[name]):
            raise ConfigError(
                f"config key 'plan.prices.{name}': not a model behind a paid API (an openai "
                "model without serve)"
            )
    _check_scenarios(config)
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


def selected_checkpoints(config: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The models that are selected checkpoints, ``<run>@<policy>``, with their run and policy.

    Each plays the test grid like any model (README.md: Checkpoint discipline).

    Args:
        config: The schema-valid config.

    Returns:
        Model name -> (run, selection policy), runs and policies in config order.
    """
    return {
        f"{run}@{policy}": (run, policy)
        for run in config["training"]["runs"]
        for policy in config["evaluation"]["policies"]
    }


def evaluated_steps(config: dict[str, Any], run: str) -> list[int]:
    """The checkpoints of a run that play validation: 0, every, 2 * every, ... and the last.

    Args:
        config: The schema-valid config.
        run: A name in ``training.runs``.

    Returns:
        The steps, in increasing order.
    """
    steps = config["training"]["runs"][run]["steps"]
    return sorted({*range(0, steps + 1, config["evaluation"]["every"]), steps})


def checkpoint_families(config: dict[str, Any]) -> dict[str, tuple[tuple[str, str], ...]]:
    """The comparison families checkpoint selection adds, one pair list per run and question.

    ``<run>: selected vs base`` compares every selected checkpoint with the run's base model;
    ``<run>: selected vs last`` compares every other selection with the paper's choice.

    Args:
        config: The schema-valid config.

    Returns:
        Family name -> (model a, model b) pairs; Holm's correction runs within each.
    """
    families: dict[str, tuple[tuple[str, str], ...]] = {}
    for run, entry in config["training"]["runs"].items():
        selected = [name for name, (r, _) in selected_checkpoints(config).items() if r == run]
        families[f"{run}: selected vs base"] = tuple((m, entry["base_model"]) for m in selected)
        last = f"{run}@last"
        if last in selected and len(selected) > 1:
            families[f"{run}: selected vs last"] = tuple((m, last) for m in selected if m != last)
    return families


def scenario_ranges(config: dict[str, Any]) -> dict[str, range]:
    """The scenario ids each split of a config uses, by split name.

    Args:
        config: The schema-valid config.

    Returns:
        ``{"test": ..., "validation": ..., "train": ...}``: the test range covers the largest
        cell, the validation range a checkpoint's episodes, the training range the longest
        run.
    """
    first = config["scenarios"]
    cells = [cell_episodes(config, model) for model in config["models"]]
    runs = [run["steps"] * run["groups_per_step"] for run in config["training"]["runs"].values()]
    return {
        "test": range(first["test"], first["test"] + max(cells)),
        "validation": range(
            first["validation"], first["validation"] + config["evaluation"]["episodes"]
        ),
        "train": range(first["train"], first["train"] + max(runs, default=0)),
    }


def _check_scenarios(config: dict[str, Any]) -> None:
    """Refuse overlapping scenario ranges, naming both keys."""
    ranges = sorted(scenario_ranges(config).items(), key=lambda item: item[1].start)
    for (name_a, a), (name_b, b) in itertools.pairwise(ranges):
        if a and b and b.start < a.stop:
            raise ConfigError(
                f"config keys 'scenarios.{name_a}' and 'scenarios.{name_b}': their scenario ids "
                f"overlap ({name_a} uses {a.start}..{a.stop - 1}, {name_b} starts at {b.start})"
            )


def _check_source(name: str, entry: dict[str, Any]) -> None:
    """A model's weights source must parse, and a hub source must pin a commit.

    A ``FILL-IN`` placeholder passes: plans and dry runs accept it, and the job that would
    prepare the weights stops on it.
    """
    source = weights_source(entry)
    if source is None or source.startswith(FILL_IN):
        return
    # Imported here: coordgap.models.prepare imports this module.
    from coordgap.models.prepare import parse_source

    try:
        parse_source(source)
    except ValueError as error:
        key = f"models.{name}.source" if entry["kind"] == "local" else f"models.{name}.serve.source"
        raise ConfigError(f"config key '{key}': {error}") from None


def _check_served(key: str, entry: dict[str, Any]) -> None:
    """The cross-key rules of a served model: its job owns the endpoint and its placeholders."""
    for field in ("base_url", "api_key_env"):
        if entry[field] is not None:
            raise ConfigError(
                f"config key '{key}.{field}': must be null for a served model: its job starts "
                "the server and gives it a fresh address and key"
            )
    serve = entry["serve"]
    for part, allowed in (("command", COMMAND_FIELDS), ("lora", LORA_FIELDS)):
        unknown = template_fields(serve[part] or ()) - allowed
        if unknown:
            raise ConfigError(
                f"config key '{key}.serve.{part}': unknown placeholder {{{sorted(unknown)[0]}}} "
                f"(known: {', '.join(sorted(allowed))}; write {{{{ for a brace)"
            )
    if serve["source"] is None and "weights" in template_fields(serve["command"]):
        raise ConfigError(
            f"config key '{key}.serve.command': uses {{weights}} but serve.source is null"
        )


# Settings ART 0.5.18's LocalBackend imposes in RL whatever it is told (unsloth/train.py sets
# the weight decay on every step; the warm-up runs at every process start).
ART_FORCED = {"optimizer.weight_decay": 0.1, "warmup": True}


def _check_art_overrides(key: str, run: dict[str, Any]) -> None:
    """Refuse a ``trainer: art`` run whose settings ART would silently override."""
    for name, forced in ART_FORCED.items():
        value: Any = run
        for part in name.split("."):
            value = value[part]
        if value != forced:
            raise ConfigError(
                f"config key '{key}.{name}': trainer art cannot use {value!r}; ART's "
                f"LocalBackend forces {forced!r} in RL. Set {forced!r}, or use trainer: torch"
            )


def _check_run(key: str, run: dict[str, Any], models: dict[str, Any]) -> None:
    """The cross-key rules of one training run (see ``check_cross_keys``)."""
    base = run["base_model"]
    if base not in models:
        raise ConfigError(f"config key '{key}.base_model': unknown model '{base}'")
    entry = models[base]
    if weights_source(entry) is None:
        raise ConfigError(
            f"config key '{key}.base_model': '{base}' has no weights to train; only local "
            "models and served models with serve.source can be trained"
        )
    if run["trainer"] == "torch" and entry["kind"] != "local":
        raise ConfigError(
            f"config key '{key}.trainer': torch trains in-process models only; '{base}' is "
            "served, so use trainer: art"
        )
    if run["trainer"] == "art":
        _check_art_overrides(key, run)
    if is_served(entry) and entry["serve"]["lora"] is None:
        raise ConfigError(
            f"config key 'models.{base}.serve.lora': '{base}' is trained by {key}, so its "
            "server needs the arguments that load a checkpoint's adapter"
        )
    starts = [stage["from_step"] for stage in run["curriculum"] or ()]
    if starts and (starts[0] != 0 or starts != sorted(set(starts)) or starts[-1] >= run["steps"]):
        raise ConfigError(
            f"config key '{key}.curriculum': from_step must start at 0 and increase, "
            f"below steps ({run['steps']})"
        )
