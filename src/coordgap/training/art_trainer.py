"""The ``art`` trainer: OpenPipe ART 0.5.18's own LocalBackend (vLLM + Unsloth) on a CUDA GPU.

The loop (``coordgap.training.loop``) is the same as for the ``torch`` trainer; only the three
trainer calls differ. The policy is served by ART's vLLM server, so rollouts go through the
``openai`` backend pointed at it, naming the checkpoint with ``get_inference_name(step)``
before every step (the name ``register`` sets goes stale after training), and with the chat
template's keyword arguments of ``_internal_config`` (thinking off unless the run says
otherwise) sent as ART's own client sends them. The tools are sent as OpenAI function
schemas, which vLLM renders through the chat template, so every trajectory carries them too:
ART's tokenizer renders the same template with the same tools.
An update is one ``backend.train`` call; the checkpoint it writes is copied into our layout,
and the history's update fields are read from what that call reports (``update_stats``).

Departures from the ``torch`` trainer that ART imposes: its optimizer is ``paged_adamw_8bit``
and is not saved across restarts (OpenPipe/ART#72), so a resumed run continues with fresh
optimizer moments, and its sampler log-probs come from vLLM in bf16 while the trainer may
load the base model in 4 bits (``_internal_config.init_args.load_in_4bit``).

The trainer starts by putting the GPU job's environment in place (the site's scratch folder
for every cache, the model hub offline, W&B off unless the site allows it:
``coordgap.training.art_runtime``). None of this can run without a CUDA GPU, ART's backend
extra, a node ART's vLLM runtime fits (CPU architecture, glibc, NVIDIA driver) and that
runtime built beforehand (``make art-runtime``); elsewhere the job stops at start, naming what
is missing and how to get it (the dry run still plans the job).
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
import math
import os
import shutil
from typing import TYPE_CHECKING, Any

import torch

from coordgap.errors import ExpectedFailure
from coordgap.policies.remote import OpenAICompatible
from coordgap.site import load_site
from coordgap.training._art import art
from coordgap.training.art_runtime import apply_job_environment, gpu_job_shortfalls
from coordgap.training.grpo import UpdateStats

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from coordgap.config.play import ModelSpec
    from coordgap.config.training import TrainingRunConfig
    from coordgap.env.protocols import Tool

# ART's LocalBackend serves with this key (model.inference_api_key); the openai backend reads
# keys from the environment by name.
API_KEY_ENV = "COORDGAP_ART_API_KEY"
PROJECT = "coordgap"


class ArtBackendUnavailable(ExpectedFailure, RuntimeError):
    """ART's LocalBackend cannot run on this machine; the message says what is missing."""


def missing_requirements() -> list[str]:
    """What this machine lacks for ART's LocalBackend (empty when it has everything)."""
    missing = []
    if not torch.cuda.is_available():
        missing.append("a CUDA GPU")
    if importlib.util.find_spec("unsloth") is None or importlib.util.find_spec("trl") is None:
        missing.append("ART's backend extra (unsloth, trl)")
    return [*missing, *gpu_job_shortfalls()]


def check_requirements(run: TrainingRunConfig) -> None:
    """Stop before anything starts when ART's LocalBackend cannot run here.

    Args:
        run: The training run (named in the message).

    Raises:
        ArtBackendUnavailable: Naming every missing requirement and how to get it.
    """
    missing = missing_requirements()
    if missing:
        raise ArtBackendUnavailable(
            f"training run '{run.name}' uses trainer: art (OpenPipe ART's LocalBackend), which "
            f"needs {', '.join(missing)}. On a machine with an NVIDIA GPU, install "
            "'openpipe-art[backend]==0.5.18' (it pins torch 2.10 and transformers 5.2: use an "
            "environment of its own) and build ART's vLLM runtime once with `make art-runtime` "
            "(docs/art.md). Without a GPU, set trainer: torch, which optimises the same "
            "objective with ART's own preprocessing and loss."
        )


def internal_config(run: TrainingRunConfig) -> dict[str, Any]:
    """``art.TrainableModel._internal_config`` for a run.

    The run's ``art_internal_config`` is the starting point; the LoRA shape, the optimizer
    settings and Qwen3's thinking switch are set from the run, so the recipe means the same
    under both trainers.

    Args:
        run: The training run.

    Returns:
        The internal config dict.
    """
    config = copy.deepcopy(run.art_internal_config)
    config.setdefault("peft_args", {}).update(
        r=run.lora.rank,
        lora_alpha=run.lora.alpha,
        lora_dropout=run.lora.dropout,
        target_modules=list(run.lora.target_modules),
    )
    config.setdefault("trainer_args", {}).update(
        adam_beta1=run.optimizer.beta1,
        adam_beta2=run.optimizer.beta2,
        weight_decay=run.optimizer.weight_decay,
        max_grad_norm=run.optimizer.max_grad_norm,
    )
    # ART does not set vLLM's LoRA rank limit itself (engine_args.max_lora_rank).
    engine = config.setdefault("engine_args", {})
    engine["max_lora_rank"] = max(engine.get("max_lora_rank", 0), run.lora.rank)
    config.setdefault("chat_template_kwargs", {}).setdefault("enable_thinking", False)
    return config


def train_arguments(run: TrainingRunConfig) -> dict[str, Any]:
    """The keyword arguments of ``backend.train`` for a run (ART's defaults where unset)."""
    arguments: dict[str, Any] = {"learning_rate": run.learning_rate, "loss_fn": run.loss}
    if run.epsilon is not None:
        arguments["epsilon"] = run.epsilon
    if run.epsilon_high is not None:
        arguments["epsilon_high"] = run.epsilon_high
    return arguments


class PackedRowsBackend(art.local.LocalBackend):
    """ART's LocalBackend, keeping the shape of the rows it packed for its last step.

    How many tokens ART's trainer runs is in none of its metrics (see ``update_stats``).
    """

    rows_shape: tuple[int, ...] | None = None

    def _get_packed_tensors(self, *args: Any, **kwargs: Any) -> Any:
        packed = super()._get_packed_tensors(*args, **kwargs)
        self.rows_shape = None if packed is None else tuple(packed["tokens"].shape)
        return packed


def update_stats(
    groups: list[art.TrajectoryGroup],
    metrics: dict[str, float],
    rows_shape: tuple[int, ...] | None,
) -> UpdateStats:
    """The history's update fields from what one ``backend.train`` of ART 0.5.18 reports.

    ART's LocalBackend trains one row per tokenized history, so one LLM call each (it packs no
    two into a row), padded to the step's sequence length (a multiple of 2048), one optimizer
    step per row. Its metrics give the rows (``data/step_num_gradient_steps``), the trained
    positions (``data/step_trainer_tokens``), the groups whose rewards differ
    (``data/step_num_groups_trainable``), the mean row loss and mean gradient norm before
    clipping (``loss/train``, ``loss/grad_norm``, absent when no row ran) and the trainer's
    wall time (``time/step_trainer_s``). The tokens run through the model are in none of them:
    they are counted from the packed rows, padding included, as ART runs them (its one warm-up
    pass per trainer process is not counted). ART reports neither how many rows its clip cut
    nor the importance ratios, so those fields are NaN.

    Args:
        groups: The groups trained on.
        metrics: The ``metrics`` of ``backend.train``'s result.
        rows_shape: The shape of ART's packed rows (rows, sequence length); None when ART
            found nothing to train (no row ran).

    Returns:
        The update's stats.
    """
    return UpdateStats(
        groups=len(groups),
        groups_trainable=int(metrics["data/step_num_groups_trainable"]),
        trajectories=sum(len(group.trajectories) for group in groups),
        rows=int(metrics[art.metrics_taxonomy.TRAIN_GRADIENT_STEPS_KEY]),
        # One optimizer step per row: ART's LocalBackend (grad_accumulation_sequences 1).
        optimizer_steps=int(metrics[art.metrics_taxonomy.TRAIN_GRADIENT_STEPS_KEY]),
        tokens=0 if rows_shape is None else math.prod(rows_shape),
        trained_tokens=int(metrics["data/step_trainer_tokens"]),
        loss=float(metrics.get("loss/train", float("nan"))),
        grad_norm=float(metrics.get("loss/grad_norm", float("nan"))),
        clipped_share=float("nan"),
        ratio_log_mean=float("nan"),
        ratio_log_first=float("nan"),
        ascent_cosine=float("nan"),
        seconds=float(metrics["time/step_trainer_s"]),
    )


class ArtTrainer:
    """A run trained by ART's LocalBackend (see the module docstring).

    Args:
        run: The training run.
        base: The base model's entry (its decoding settings shape the rollouts' requests).
        weights: The base model's prepared folder, which ART loads as its base model.
        work: A folder of its own for ART's models, checkpoints and logs (kept for resume).
        start: The checkpoint to continue from (0 for a new run); ART's later ones go.

    Raises:
        ArtBackendUnavailable: On a machine that lacks what ``missing_requirements`` names.
        SiteError: The site file is invalid.
    """

    def __init__(
        self, run: TrainingRunConfig, base: ModelSpec, weights: Path, work: Path, start: int
    ) -> None:
        # Before ART looks for its runtime or starts a process: they inherit the environment.
        site = load_site()
        apply_job_environment(site.scratch, wandb=site.wandb)
        check_requirements(run)
        self.run = run
        self._base = base
        self._backend = PackedRowsBackend(path=str(work.resolve()))
        self._internal = internal_config(run)
        self._model = art.TrainableModel(
            name=run.name,
            project=PROJECT,
            base_model=str(weights.resolve()),
            _internal_config=self._internal,
        )
        checkpoints = work / PROJECT / "models" / run.name / "checkpoints"
        for folder in checkpoints.glob("[0-9]*"):
            if int(folder.name) > start:
                shutil.rmtree(folder)
        self._checkpoints = checkpoints
        self._step = start
        # ART's backend keeps clients and servers bound to the loop it started them on.
        self._loop = asyncio.Runner()

    def start(self) -> None:
        """Register the model: ART starts vLLM and writes checkpoint 0 (B = 0) if it is new."""
        self._loop.run(self._model.register(self._backend))

    def sampler(self) -> OpenAICompatible:
        """The current checkpoint behind ART's vLLM server, as an ``openai`` backend."""
        os.environ[API_KEY_ENV] = self._model.inference_api_key or "default"
        return OpenAICompatible(
            provider="openai",
            base_url=self._model.inference_base_url,
            model=self._model.get_inference_name(step=self._step),
            api_key_env=API_KEY_ENV,
            temperature=self.run.temperature,
            top_p=1.0,
            max_tokens=self._base.completion_limit,
            # As ART's own client sends them: the template renders as ART's trainer does.
            extra_body={"chat_template_kwargs": self._internal["chat_template_kwargs"]},
            tool_choice="auto",
            timeout_s=1200.0,
            max_retries=3,
            backoff_base_s=1.0,
            backoff_max_s=30.0,
            record_transcripts=True,
        )

    def update(self, groups: list[art.TrajectoryGroup]) -> UpdateStats:
        """One ``backend.train`` call: one new checkpoint."""
        result = self._loop.run(
            self._backend.train(self._model, groups, **train_arguments(self.run))
        )
        self._step = result.step
        return update_stats(groups, result.metrics, self._backend.rows_shape)

    def probe(
        self, conversations: Sequence[list[dict[str, str]]], tools: Sequence[Tool]
    ) -> dict[str, float]:
        """Nothing: vLLM samples free text, and its six-way choice has no score to read."""
        return {}

    def first_round_right(
        self, conversations: Sequence[list[dict[str, str]]], tools: Sequence[Tool]
    ) -> dict[str, float]:
        """Nothing, as ``probe``: the history's ``r1_exact`` columns stay null."""
        return {}

    def save(self, folder: Path) -> None:
        """Copy ART's checkpoint of the current step (its PEFT adapter) into ``folder``."""
        source = self._checkpoints / f"{self._step:04d}"
        folder.mkdir(parents=True)
        for name in ("adapter_model.safetensors", "adapter_config.json"):
            shutil.copy2(source / name, folder / name)

    def save_optimizer(self, path: Path) -> None:
        """Record that ART keeps no optimizer state a resumed run could continue from."""
        path.write_text(json.dumps({"optimizer": "not saved by ART 0.5.18 (OpenPipe/ART#72)"}))
