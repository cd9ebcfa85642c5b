"""Settings of training: a GRPO run's recipe, and the checkpoints validation and tests play."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from coordgap.config.keys import ConfigError
from coordgap.env.variants import RewardVariant, RewardWeights

# ``grad_accumulation_sequences``' value that puts every row of an update into one step.
ALL_ROWS = "all"


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
        grad_accumulation_sequences: Rows per optimizer step, as ART's ``TrainConfig`` names
            it: 1 is ART's LocalBackend loop (one AdamW step per row); more accumulates that
            many rows into one step (``coordgap.training.grpo``); None accumulates every row
            of the update (``all`` in the config).
        warmup: Run ART's warm-up step (learning rate 1e-9 on the first row) before the first
            update of a fresh optimizer.
        compile_update: Run the update's decoder layers compiled by ``torch.compile`` (trainer
            ``torch`` on a CPU; see ``coordgap.training.grpo._CompiledLayers``).
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
    grad_accumulation_sequences: int | None
    warmup: bool
    compile_update: bool
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
            weights=RewardWeights.from_dict(reward),
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
            grad_accumulation_sequences=rows_per_step(entry["grad_accumulation_sequences"]),
            warmup=bool(entry["warmup"]),
            compile_update=bool(entry["compile_update"]),
            max_in_flight=int(entry["max_in_flight"]),
            seed=int(entry["seed"]),
            art_internal_config=dict(entry["art_internal_config"] or {}),
        )


@dataclass(frozen=True, slots=True)
class PilotConfig:
    """The pilot (``pilot``; README.md: Choosing the update: the pilot).

    Each candidate update (a learning rate, rows per optimizer step and a gradient clip)
    trains the arm's recipe for ``steps`` steps from the untrained adapter; the rule that
    picks the study's update from what they did is ``coordgap.training.pilot.apply_rule``.

    Attributes:
        arm: The arm whose recipe is trained: its first seed's run.
        learning_rates: The candidate rates, ascending.
        grad_accumulation_sequences: The candidate rows per optimizer step (None: all).
        max_grad_norms: The candidate gradient clips.
        steps: Steps each candidate trains.
        max_ratio_log: The largest mean |log importance ratio| of a step's rows.
        max_probe_kl_per_step: The largest probe KL(mu || mu_0) per update so far.
    """

    arm: str
    learning_rates: tuple[float, ...]
    grad_accumulation_sequences: tuple[int | None, ...]
    max_grad_norms: tuple[float, ...]
    steps: int
    max_ratio_log: float
    max_probe_kl_per_step: float

    def updates(self) -> list[tuple[float, int | None, float]]:
        """Every candidate update as (rate, rows per step, clip): rows, then clip, then rate."""
        return [
            (rate, rows, clip)
            for rows, clip, rate in itertools.product(
                self.grad_accumulation_sequences, self.max_grad_norms, self.learning_rates
            )
        ]

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> PilotConfig:
        """Build from the validated ``pilot`` section."""
        return cls(
            arm=entry["arm"],
            learning_rates=tuple(float(rate) for rate in entry["learning_rates"]),
            grad_accumulation_sequences=tuple(
                rows_per_step(rows) for rows in entry["grad_accumulation_sequences"]
            ),
            max_grad_norms=tuple(float(norm) for norm in entry["max_grad_norms"]),
            steps=int(entry["steps"]),
            max_ratio_log=float(entry["max_ratio_log"]),
            max_probe_kl_per_step=float(entry["max_probe_kl_per_step"]),
        )


def rows_per_step(value: int | str) -> int | None:
    """A ``grad_accumulation_sequences`` value as the trainer takes it: None for ``all``."""
    return None if value == ALL_ROWS else int(value)


def rows_label(rows: int | None) -> str:
    """Rows per optimizer step as the config writes them (``1``, ``8``, ``all``)."""
    return ALL_ROWS if rows is None else str(rows)


PILOT = "pilot"


def pilot_section(config: dict[str, Any]) -> dict[str, Any]:
    """The config's ``pilot`` section, which only the pilot needs.

    Raises:
        ConfigError: The config has none, naming the key.
    """
    if PILOT not in config:
        raise ConfigError(
            f"config key '{PILOT}' is missing: the pilot trains the learning rates that section "
            "lists (README.md: Choosing the update: the pilot); config/study_cpu.yaml has "
            "one"
        )
    return config[PILOT]


def pilot_recipe(config: dict[str, Any]) -> str:
    """The run whose recipe the pilot trains: its arm's first seed's run (or the arm itself).

    Args:
        config: The schema-valid config with a valid ``pilot`` section.
    """
    return arms(config)[pilot_section(config)["arm"]][0]


SEEDS = "seeds"


def seed_run(arm: str, seed: int) -> str:
    """The name of one seed's run of an arm: ``<arm>-s<seed>``."""
    return f"{arm}-s{seed}"


def with_seed_runs(config: dict[str, Any]) -> dict[str, Any]:
    """The config with each run that lists ``seeds`` replaced by one run per seed.

    A run is an arm of a study; ``seeds: [1, 2, 3]`` in place of ``seed`` trains it once per
    seed, as the runs ``<arm>-s1``, ``<arm>-s2``, ``<arm>-s3``, each with its ``seed`` and with
    ``arm: <arm>``, in place of the entry (README.md: Seeds). A run with ``seed`` is an arm of
    one seed under its own name. Everything downstream sees plain runs; the statistics pool a
    run's seeds by ``arm`` (:func:`arms`).

    Args:
        config: A merged config; entries that are not mappings are left for the schema.

    Returns:
        A copy, runs in config order with each arm's seeds in the listed order.

    Raises:
        ConfigError: ``seeds`` that is not a list of distinct non-negative integers, or beside
            ``seed``, naming the key.
    """
    training = config.get("training")
    runs = training.get("runs") if isinstance(training, dict) else None
    if not isinstance(runs, dict) or not any(
        isinstance(entry, dict) and SEEDS in entry for entry in runs.values()
    ):
        return config
    expanded: dict[str, Any] = {}
    for name, entry in runs.items():
        if not (isinstance(entry, dict) and SEEDS in entry):
            expanded[name] = entry
            continue
        key = f"training.runs.{name}.{SEEDS}"
        seeds = entry[SEEDS]
        if "seed" in entry:
            raise ConfigError(f"config key '{key}': give seed or seeds, not both")
        integers = isinstance(seeds, list) and all(type(s) is int and s >= 0 for s in seeds)
        if not (integers and seeds and len(set(seeds)) == len(seeds)):
            raise ConfigError(f"config key '{key}': a list of distinct non-negative integers")
        recipe = {k: v for k, v in entry.items() if k != SEEDS}
        for seed in seeds:
            if (run := seed_run(name, seed)) in runs:
                raise ConfigError(f"config key '{key}': its run '{run}' is a run's name already")
            expanded[run] = {**recipe, "seed": seed, "arm": name}
    return {**config, "training": {**training, "runs": expanded}}


def arms(config: dict[str, Any]) -> dict[str, list[str]]:
    """The study's arms: each arm's runs (its seeds), arms and runs in config order.

    Args:
        config: The schema-valid config.

    Returns:
        Arm -> its runs; a run without ``arm`` is an arm of its own.
    """
    grouped: dict[str, list[str]] = {}
    for run, entry in config["training"]["runs"].items():
        grouped.setdefault(entry.get("arm", run), []).append(run)
    return grouped


def is_control(entry: dict[str, Any]) -> bool:
    """Whether a ``training.runs`` entry trains the positive control (reward ``control``).

    Such a run measures whether training moves the model at all (``analysis.control``); it is
    no coordination result, so no comparison and no coordination statistic includes it.
    """
    return entry["reward"]["variant"] == RewardVariant.CONTROL


def compared_arms(config: dict[str, Any]) -> dict[str, list[str]]:
    """The arms of :func:`arms` that coordination statistics compare: all but control arms."""
    runs = config["training"]["runs"]
    return {arm: names for arm, names in arms(config).items() if not is_control(runs[names[0]])}


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


def compared_checkpoints(config: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The selected checkpoints that coordination statistics compare: those of no control run.

    Args:
        config: The schema-valid config.

    Returns:
        Model name -> (run, selection policy), as :func:`selected_checkpoints`.
    """
    runs = config["training"]["runs"]
    return {
        name: (run, policy)
        for name, (run, policy) in selected_checkpoints(config).items()
        if not is_control(runs[run])
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
    ``<run>: selected vs last`` compares every other selection with the paper's choice. A
    control run has none: its check is ``analysis.control``.

    Args:
        config: The schema-valid config.

    Returns:
        Family name -> (model a, model b) pairs; Holm's correction runs within each.
    """
    families: dict[str, tuple[tuple[str, str], ...]] = {}
    for run, entry in config["training"]["runs"].items():
        if is_control(entry):
            continue
        selected = [name for name, (r, _) in selected_checkpoints(config).items() if r == run]
        families[f"{run}: selected vs base"] = tuple((m, entry["base_model"]) for m in selected)
        last = f"{run}@last"
        if last in selected and len(selected) > 1:
            families[f"{run}: selected vs last"] = tuple((m, last) for m in selected if m != last)
    return families
