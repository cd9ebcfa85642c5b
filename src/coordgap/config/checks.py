"""The cross-key rules of the config, which the JSON schema cannot express.

Run at parse time (Snakefile, ``coordgap check``/``plan``), after the schema, before any job;
each names the offending key.
"""

from __future__ import annotations

import itertools
from typing import Any

from coordgap.config.keys import FILL_IN, ConfigError
from coordgap.config.play import (
    COMMAND_FIELDS,
    LORA_FIELDS,
    ModelSpec,
    cell_episodes,
    template_fields,
)
from coordgap.config.training import (
    PILOT,
    Trainer,
    TrainingRunConfig,
    arms,
    compared_arms,
    compared_checkpoints,
    is_control,
    pilot_recipe,
)
from coordgap.env.table import TurnOrder
from coordgap.env.variants import RewardVariant
from coordgap.models.prepare import parse_source

# Why a control arm's checkpoints enter no comparison, for the errors that refuse them.
_CONTROL_ONLY = "the positive control enters no comparison; analysis.control checks it"


def check_cross_keys(config: dict[str, Any]) -> None:
    """Check the rules that span several keys, which the JSON schema cannot express.

    Run after the schema check (Snakemake's ``validate()``), before any job starts.

    Args:
        config: The schema-valid config.

    Raises:
        ConfigError: On the first problem, naming the offending key.
    """
    models = {name: ModelSpec.from_dict(name, entry) for name, entry in config["models"].items()}
    known = set(models) | set(compared_checkpoints(config))
    controls = _control_selections(config)
    for i, pair in enumerate(config["analysis"]["comparisons"]):
        for j, name in enumerate(pair):
            key = f"config key 'analysis.comparisons[{i}][{j}]'"
            if name in controls:
                raise ConfigError(f"{key}: '{name}' is a control run's checkpoint: {_CONTROL_ONLY}")
            if name not in known:
                raise ConfigError(f"{key}: unknown model '{name}'")
        if pair[0] == pair[1]:
            raise ConfigError(f"config key 'analysis.comparisons[{i}]': a model against itself")
    sizes = config["experiment"]["sizes"]
    if len(set(sizes)) != len(sizes):
        raise ConfigError("config key 'experiment.sizes': sizes must be distinct")
    for name, model in models.items():
        if model.is_served:
            _check_served(f"models.{name}", model.entry)
        _check_source(model)
    for name, run in config["training"]["runs"].items():
        _check_run(f"training.runs.{name}", run, models)
        if name in models:
            raise ConfigError(f"config key 'training.runs.{name}': a model has this name too")
    for name in config["plan"]["prices"]:
        if name not in models or not models[name].is_paid_api:
            raise ConfigError(
                f"config key 'plan.prices.{name}': not a model behind a paid API (an openai "
                "model without serve)"
            )
    _check_pilot(config)
    _check_scenarios(config)
    _check_timeline(config)
    _check_arms(config)
    _check_control(config)


def _control_selections(config: dict[str, Any]) -> set[str]:
    """The selections of every control run, by run and by arm (``<run or arm>@<policy>``)."""
    controls = [
        (run, entry) for run, entry in config["training"]["runs"].items() if is_control(entry)
    ]
    owners = {run for run, _ in controls} | {entry.get("arm", run) for run, entry in controls}
    return {f"{owner}@{policy}" for owner in owners for policy in config["evaluation"]["policies"]}


def _check_control(config: dict[str, Any]) -> None:
    """Refuse the control reward among the coordination rewards, and a bad control check.

    ``reward.variants[0]`` is the report's headline, and every variant listed there is tabled
    and compared as a coordination reward. The check must name a control arm, its base model,
    and a selection policy and a size that the study has; the arm must train at that size
    alone, with trainer torch, under simultaneous turns (the exact expected reward the check
    reads exists only there).
    """
    for i, variant in enumerate(config["reward"]["variants"]):
        if variant == RewardVariant.CONTROL:
            role = "the headline reward (the first variant)" if i == 0 else "a coordination reward"
            raise ConfigError(
                f"config key 'reward.variants[{i}]': 'control' cannot be {role}: it is the "
                "positive control's training reward, and no coordination table or finding "
                "uses it; analysis.control reports it"
            )
    control = config["analysis"]["control"]
    if control is None:
        return
    key = "config key 'analysis.control"
    grouped = arms(config)
    run = control["run"]
    if run not in grouped:
        raise ConfigError(f"{key}.run': unknown training run '{run}' (an arm of training.runs)")
    entry = config["training"]["runs"][grouped[run][0]]
    if not is_control(entry):
        raise ConfigError(
            f"{key}.run': '{run}' trains on the '{entry['reward']['variant']}' reward; the "
            f"positive control trains on '{RewardVariant.CONTROL}'"
        )
    if control["model"] != entry["base_model"]:
        raise ConfigError(
            f"{key}.model': '{control['model']}' is not the model '{run}' trains "
            f"('{entry['base_model']}'): the control measures how far training moved it"
        )
    if control["policy"] not in config["evaluation"]["policies"]:
        raise ConfigError(f"{key}.policy': '{control['policy']}' is not in evaluation.policies")
    if control["n"] not in config["experiment"]["sizes"]:
        raise ConfigError(f"{key}.n': {control['n']} is not in experiment.sizes")
    # The check judges each checkpoint's exact expected reward, which the training history
    # records at the run's N after each update, scored by the torch trainer, from round-1
    # prompts that only simultaneous turns keep free of the policy (coordgap.training.probe).
    recipe = TrainingRunConfig.from_dict(grouped[run][0], entry)
    run_sizes = {recipe.n_at(step) for step in range(recipe.steps)}
    if run_sizes != {control["n"]}:
        raise ConfigError(
            f"{key}.n': '{run}' trains at N in {sorted(run_sizes)}, not at {control['n']} "
            "only: the check reads the exact expected reward its history records at the run's N"
        )
    if entry["trainer"] != Trainer.TORCH:
        raise ConfigError(
            f"{key}.run': '{run}' uses trainer {entry['trainer']}, which cannot score the "
            "six-way choice: the check reads the exact expected reward trainer torch records"
        )
    if config["environment"]["turn_order"] != TurnOrder.SIMULTANEOUS:
        raise ConfigError(
            f"{key}': the check needs environment.turn_order: simultaneous (under sequential "
            "turns a later seat's round-1 prompt depends on the policy, so the control reward "
            "has no exact expectation)"
        )


def _check_pilot(config: dict[str, Any]) -> None:
    """The pilot trains a control arm's recipe with trainer torch, at ascending rates (optional)."""
    if PILOT not in config:
        return
    pilot = config[PILOT]
    grouped = arms(config)
    if pilot["arm"] not in grouped:
        raise ConfigError(
            f"config key '{PILOT}.arm': '{pilot['arm']}' is not an arm of training.runs "
            f"(arms: {', '.join(grouped)})"
        )
    recipe = pilot_recipe(config)
    if not is_control(config["training"]["runs"][recipe]):
        raise ConfigError(
            f"config key '{PILOT}.arm': '{pilot['arm']}' is no positive-control arm (reward "
            "variant control); the pilot's rule asks that the control's exact expected reward "
            "rises with every update"
        )
    if config["training"]["runs"][recipe]["trainer"] != "torch":
        raise ConfigError(
            f"config key '{PILOT}.arm': its run '{recipe}' uses trainer art, which measures no "
            "probe KL; the pilot's rule needs trainer torch"
        )
    rates = pilot["learning_rates"]
    if any(later <= earlier for earlier, later in itertools.pairwise(rates)):
        raise ConfigError(
            f"config key '{PILOT}.learning_rates': rates must ascend, each above the one before "
            f"({rates})"
        )


def _check_arms(config: dict[str, Any]) -> None:
    """The seeds of an arm train one base model; seed comparisons name an arm's selection."""
    grouped = arms(config)
    policies = config["evaluation"]["policies"]
    selections = {f"{arm}@{policy}" for arm in compared_arms(config) for policy in policies}
    controls = _control_selections(config)
    for i, (a, b) in enumerate(config["analysis"]["seed_comparisons"]):
        key = f"config key 'analysis.seed_comparisons[{i}]"
        for j, name in enumerate((a, b)):
            if name in controls:
                raise ConfigError(f"{key}[{j}]': '{name}' is a control arm: {_CONTROL_ONLY}")
        if a not in selections:
            raise ConfigError(f"{key}[0]': '{a}' is not an arm's selection <arm>@<policy>")
        if b not in selections | set(config["models"]):
            raise ConfigError(f"{key}[1]': '{b}' is neither an arm's selection nor a model")
        if a == b:
            raise ConfigError(f"{key}': an arm against itself")
    for arm, runs in grouped.items():
        entries = config["training"]["runs"]
        bases = {entries[run]["base_model"] for run in runs}
        if len(bases) > 1:
            raise ConfigError(
                f"config key 'training.runs.{runs[-1]}.arm': the runs of arm '{arm}' train "
                f"different base models ({', '.join(sorted(bases))})"
            )


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


def scenario_ranges(config: dict[str, Any]) -> dict[str, range]:
    """The scenario ids each split of a config uses, by split name.

    Args:
        config: The schema-valid config.

    Returns:
        ``{"test": ..., "validation": ..., "train": ...}``: the test range covers the largest
        cell, the validation range a checkpoint's episodes, the training range the longest
        run (the pilot's runs included).
    """
    first = config["scenarios"]
    cells = [cell_episodes(config, model) for model in config["models"]]
    runs = [run["steps"] * run["groups_per_step"] for run in config["training"]["runs"].values()]
    if PILOT in config:
        # The pilot's runs play the training scenarios of their recipe's first steps.
        recipe = config["training"]["runs"][pilot_recipe(config)]
        runs.append(config[PILOT]["steps"] * recipe["groups_per_step"])
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


def _check_source(model: ModelSpec) -> None:
    """A model's weights source must parse, and a hub source must pin a commit.

    A ``FILL-IN`` placeholder passes: plans and dry runs accept it, and the job that would
    prepare the weights stops on it.
    """
    source = model.weights_source
    if source is None or source.startswith(FILL_IN):
        return
    try:
        parse_source(source)
    except ValueError as error:
        raise ConfigError(f"config key '{model.weights_source_key}': {error}") from None


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


def _check_accumulation(key: str, run: dict[str, Any]) -> None:
    """Refuse a ``grad_accumulation_sequences`` the run's trainer would not honour as written.

    ART 0.5.18's LocalBackend (trainer art) reads the value only to size its progress bar and
    takes one step per row whatever it says. Accumulating is the loop of ART's Megatron
    backend, which runs no warm-up: ART's warm-up is its LocalBackend's first row at learning
    rate 1e-9, which would seed Adam's moments with one row beside the accumulated step.
    """
    rows = run["grad_accumulation_sequences"]
    if rows == 1:
        return
    if run["trainer"] == "art":
        raise ConfigError(
            f"config key '{key}.grad_accumulation_sequences': trainer art takes one optimizer "
            f"step per row whatever this says (ART 0.5.18's LocalBackend ignores it), so "
            f"{rows!r} would be silently ignored; set 1, or use trainer: torch"
        )
    if run["warmup"]:
        raise ConfigError(
            f"config key '{key}.warmup': grad_accumulation_sequences {rows!r} is the loop of "
            "ART's Megatron backend, which has no warm-up (a 1e-9 step on the first row would "
            "seed Adam's moments with that one row); set warmup: false"
        )


def _check_run(key: str, run: dict[str, Any], models: dict[str, ModelSpec]) -> None:
    """The cross-key rules of one training run (see ``check_cross_keys``)."""
    base = run["base_model"]
    if base not in models:
        raise ConfigError(f"config key '{key}.base_model': unknown model '{base}'")
    model = models[base]
    if model.weights_source is None:
        raise ConfigError(
            f"config key '{key}.base_model': '{base}' has no weights to train; only local "
            "models and served models with serve.source can be trained"
        )
    if run["trainer"] == "torch" and not model.in_process:
        raise ConfigError(
            f"config key '{key}.trainer': torch trains in-process models only; '{base}' is "
            "served, so use trainer: art"
        )
    if run["trainer"] == "art":
        _check_art_overrides(key, run)
        if run["compile_update"]:
            raise ConfigError(
                f"config key '{key}.compile_update': trainer art updates with ART's own "
                "kernels; compile_update is for trainer torch"
            )
    _check_accumulation(key, run)
    if model.is_served and model.entry["serve"]["lora"] is None:
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
