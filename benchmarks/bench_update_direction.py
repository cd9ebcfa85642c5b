"""Does an update follow its reward? The control's first step on SmolLM2 under every update.

For each seed of the CPU study's positive-control arm (``config/study_cpu.yaml``, runs
``control-s1`` to ``control-s3``): step 0's rollouts are played once, by the untrained adapter,
as the training loop plays them (the run's own cell, scenarios and seeds), and their groups
are trained by each update of ``GRID`` in turn, every time from a fresh adapter and optimizer
(the run's seed: the same initial adapter) and the loop's generator seeds: the updates differ
by their rows per optimizer step (``grad_accumulation_sequences``), clip
(``optimizer.max_grad_norm``; ``none`` never binds) and learning rate alone. ART's warm-up is
off for every update, so that each is the loop it names and nothing else. For each:

* ``ascent_cosine``: the cosine between the change of the adapter's weights and the step's
  policy-gradient estimate (minus the unclipped mean gradient over all its trained positions,
  at the untrained adapter; ``coordgap.training.grpo.UpdateStats``);
* the change of the probe set's mean mu(right) (nine round-1 prompts, in float32), and of the
  control's exact expected reward E[r1] (the mean over the N seats of mu(right | the seat's
  round-1 prompt), as the policy acts);
* the rows, the share of optimizer steps the clip cut and their mean gradient norm.

Per seed it also reports what the mechanism of a binding clip reads: the rows with positive and
negative advantage, and how many of each chose the right fork. Everything runs inside one
Snakemake job (``benchmarks/workflow``, rule ``direction``), in the study's bf16.

Usage: ``python benchmarks/bench_update_direction.py``. Writes
``benchmarks/results/update_direction.json``. Takes about 75 minutes on 2 cores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math
import random
import tempfile
from pathlib import Path
from typing import Any

import torch
from common import MODEL_DIR, ROOT, SOURCE, job_threads, run_in_snakemake, write_results

from coordgap.config.overlays import resolve
from coordgap.config.play import EnvironmentConfig
from coordgap.config.training import TrainingRunConfig, rows_per_step
from coordgap.data import derive_seed
from coordgap.env.observation import PromptTemplates
from coordgap.env.protocols import TOOLS, Tool
from coordgap.models.prepare import prepare_model
from coordgap.training.grpo import TorchGRPOTrainer
from coordgap.training.loop import play_rollouts, rollout_cell, rollout_outputs
from coordgap.training.probe import first_round_conversations, probe_conversations
from coordgap.training.trajectories import trajectory_groups

STUDY = resolve([ROOT / "config" / "study_cpu.yaml"]).config
STUDY_ENV = EnvironmentConfig.from_dict(STUDY["environment"])
SEEDS = ("control-s1", "control-s2", "control-s3")
STUDY_RATE = 2e-5
# (rows per optimizer step, clip, learning rate): ART's one-row loop at the study's former rate
# under ART's clip, a ten times looser one and none; one step of all rows at each rate the
# pilot considers (``config/study_cpu.yaml``, ``pilot``), and at the chosen rate without a clip
# (from fresh Adam moments one step moves each weight by about lr * sign(g), whatever the clip
# scaled g by, so the clip should not matter there). A one-row update of the step's ~110 rows
# takes 3 to 6 minutes on 2 cores with its cosine's extra pass, an accumulated one 1 to 2.
GRID = [
    ("1", 0.1, STUDY_RATE),
    ("1", 1.0, STUDY_RATE),
    ("1", math.inf, STUDY_RATE),
    ("all", 0.1, 2e-5),
    ("all", 0.1, 1e-4),
    ("all", 0.1, 5e-4),
    ("all", math.inf, 1e-4),
]


def label(rows: str, clip: float, rate: float) -> str:
    """An update as the table names it."""
    clipped = "none" if math.isinf(clip) else f"{clip:g}"
    return f"rows {rows}, clip {clipped}, lr {rate:g}"


def variant(run: TrainingRunConfig, rows: str, clip: float, rate: float) -> TrainingRunConfig:
    """The control's run with one update of the grid (ART's warm-up off)."""
    return dataclasses.replace(
        run,
        learning_rate=rate,
        grad_accumulation_sequences=rows_per_step(rows),
        optimizer=dataclasses.replace(run.optimizer, max_grad_norm=clip),
        warmup=False,
    )


def measures(
    trainer: TorchGRPOTrainer,
    run: TrainingRunConfig,
    env: EnvironmentConfig,
    templates: PromptTemplates,
) -> dict[str, float]:
    """The probe set's mean mu(right) in float32 and the exact E[r1] as the policy acts."""
    tools = TOOLS[env.protocol]
    probe = trainer.probe(probe_conversations(env, templates, run.n), tools)
    exact = trainer.first_round_right(first_round_conversations(env, templates, run.n), tools)
    return {"mu_right": probe[f"probe_{Tool.PICK_UP_RIGHT}"], **exact}


def seed_rows(trainer: TorchGRPOTrainer, groups: list[Any]) -> dict[str, int]:
    """The step's rows by the sign of their advantage, and how many of each chose right."""
    random.seed(0)
    rows = trainer.rows(groups)
    if rows.packed is None:
        return {"rows": 0}
    right = TOOLS[STUDY_ENV.protocol].index(Tool.PICK_UP_RIGHT)
    counts = {"positive": 0, "negative": 0, "positive_right": 0, "negative_right": 0}
    for index, choice in enumerate(rows.choices):
        mask = rows.packed["assistant_mask"][index]
        advantage = float(rows.packed["advantages"][index][mask][0])
        sign = "positive" if advantage > 0 else "negative"
        counts[sign] += 1
        counts[f"{sign}_right"] += int(choice.chosen == right)
    return {"rows": len(rows.choices), **counts}


def measure() -> dict[str, Any]:
    """Every seed's step-0 rollouts under every update of the grid (see the module docstring)."""
    templates = PromptTemplates.load(ROOT / "config" / "prompts")
    base = STUDY["models"]["smollm2-135m"]
    result: dict[str, Any] = {"torch_threads": torch.get_num_threads(), "seeds": {}}
    for name in SEEDS:
        run = TrainingRunConfig.from_dict(name, STUDY["training"]["runs"][name])
        untrained = TorchGRPOTrainer(MODEL_DIR, run, base)
        cell = rollout_cell(run, STUDY_ENV, STUDY["seed"], STUDY["scenarios"]["train"], 0)
        with tempfile.TemporaryDirectory(prefix="bench_direction.") as folder:
            tables = asyncio.run(
                play_rollouts(
                    untrained.sampler(),
                    cell,
                    rollout_outputs(Path(folder), 0),
                    templates,
                    run.max_in_flight,
                )
            )
        before = measures(untrained, run, STUDY_ENV, templates)
        seed: dict[str, Any] = {
            "before": before,
            "rows": seed_rows(
                untrained, trajectory_groups(tables["episodes"], tables["transcripts"], run)
            ),
            "updates": {},
        }
        for rows, clip, rate in GRID:
            trained = variant(run, rows, clip, rate)
            trainer = TorchGRPOTrainer(MODEL_DIR, trained, base)
            # As the loop seeds step 0's update: ART's shuffle, and dropout's generator.
            random.seed(derive_seed(run.seed, run.name, "update", 0))
            torch.manual_seed(derive_seed(run.seed, run.name, "dropout", 0))
            stats = trainer.update(
                trajectory_groups(tables["episodes"], tables["transcripts"], trained)
            )
            after = measures(trainer, run, STUDY_ENV, templates)
            seed["updates"][label(rows, clip, rate)] = {
                "ascent_cosine": stats.ascent_cosine,
                "mu_right_change": after["mu_right"] - before["mu_right"],
                "r1_change": after["r1_exact"] - before["r1_exact"],
                "rows": stats.rows,
                "optimizer_steps": stats.optimizer_steps,
                "clipped_share": stats.clipped_share,
                "grad_norm": stats.grad_norm,
                "seconds": stats.seconds,
            }
            print(
                name, label(rows, clip, rate), seed["updates"][label(rows, clip, rate)], flush=True
            )
            # One trainer at a time: each holds a model, its graphs' buffers and a sampler.
            del trainer
            gc.collect()
        result["seeds"][name] = seed
    return result


def follows(job: dict[str, Any], update: str) -> bool:
    """Whether an update raised both the probe's mu(right) and E[r1], at a positive cosine, in
    every seed."""
    return all(
        seed["updates"][update]["r1_change"] > 0
        and seed["updates"][update]["mu_right_change"] > 0
        and seed["updates"][update]["ascent_cosine"] > 0
        for seed in job["seeds"].values()
    )


def main() -> None:
    prepare_model(SOURCE, MODEL_DIR)
    job = run_in_snakemake("direction", cores=torch.get_num_threads())
    print(job_threads(job))
    header = " | ".join(f"{name} ({job['seeds'][name]['rows']['rows']} rows)" for name in SEEDS)
    print(f"| update | {header} | follows in every seed |")
    print("|---" * (len(SEEDS) + 2) + "|")
    for update in job["seeds"][SEEDS[0]]["updates"]:
        cells = [
            f"{u['mu_right_change']:+.3f} / {u['r1_change']:+.3f} (cos {u['ascent_cosine']:.2f})"
            for u in (job["seeds"][name]["updates"][update] for name in SEEDS)
        ]
        print(f"| {update} | {' | '.join(cells)} | {'yes' if follows(job, update) else 'no'} |")
    for name in SEEDS:
        seed = job["seeds"][name]
        print(name, "before", seed["before"], "rows", seed["rows"])
    write_results("update_direction", {"in_snakemake_job": job})


if __name__ == "__main__":
    main()
