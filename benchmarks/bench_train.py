"""One GRPO step of the default recipe on this CPU: rollouts, then the update, vs the peak.

The run is the default config's (``training.runs.smollm2-grpo``): 2 groups of 3 episodes at
N = 5, 5 rounds, played by SmolLM2-135M through the episode runner, then one update with ART's
preprocessing and loss and one AdamW step per row, exactly as ``train_grpo`` runs them. The
update's cost does not depend on the rewards' values, so every trajectory is made trainable
(distinct rewards per episode): the benchmark times the largest update a step can have.

Reported, each against the bf16 matrix-product peak timed in the same run:

* seconds of the step, split into rollouts and update;
* update tokens/s, and its rate as 4 x (decoder linear parameters) x tokens / second: a
  forward pass and the gradient with respect to the activations (the base weights are frozen;
  LoRA's own products and attention are left out, so the fraction understates the work);
* the importance ratio on the unchanged policy: |log p_trainer - log p_sampler| over every
  trained token before the first optimizer step (the sampler/trainer numerical noise);
* the same update (one group) timed inside a Snakemake job (``benchmarks/workflow``).

Usage: ``python benchmarks/bench_train.py``. Writes ``benchmarks/results/train.json``.
Takes about 5 minutes on 2 cores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from typing import Any

import torch
import yaml
from common import (
    MODEL_DIR,
    ROOT,
    SOURCE,
    job_threads,
    linear_parameters,
    matmul_peak,
    run_in_snakemake,
    write_results,
)

from coordgap.config import EnvironmentConfig, TrainingRunConfig
from coordgap.env.observation import PromptTemplates
from coordgap.models.prepare import prepare_model
from coordgap.training.grpo import TorchGRPOTrainer
from coordgap.training.loop import play_rollouts
from coordgap.training.trajectories import trajectory_groups

CONFIG = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
TARGET_PEAK = 0.4


def time_step(groups_per_step: int, episodes_per_group: int) -> dict[str, Any]:
    """Play one step's rollouts and run its update with the default run's trainer."""
    entry = CONFIG["training"]["runs"]["smollm2-grpo"]
    run = TrainingRunConfig.from_dict(
        "bench",
        {**entry, "groups_per_step": groups_per_step, "episodes_per_group": episodes_per_group},
    )
    trainer = TorchGRPOTrainer(MODEL_DIR, run, CONFIG["models"][run.base_model])
    env = EnvironmentConfig.from_dict(CONFIG["environment"])
    templates = PromptTemplates.load(ROOT / "config" / "prompts")
    start = time.perf_counter()
    tables = asyncio.run(
        play_rollouts(trainer.sampler(), run, env, templates, CONFIG["seed"], 0, 0)
    )
    rollout_seconds = time.perf_counter() - start
    groups = trajectory_groups(tables["episodes"], tables["transcripts"], run)
    for group in groups:
        for trajectory in group.trajectories:
            trajectory.reward = float(trajectory.metadata["episode"])
    random.seed(0)
    packed, _ = trainer.rows(groups)
    noise = trainer.sampler_gaps(packed)
    random.seed(0)
    stats = trainer.update(groups)
    return {
        "rollout_seconds": rollout_seconds,
        "decisions": int(tables["episodes"]["decisions"].sum()),
        "update": dataclasses.asdict(stats),
        "tokens_per_s": stats.tokens / stats.seconds,
        "update_flops": 4 * linear_parameters(trainer.model) * stats.tokens / stats.seconds,
        "ratio_noise": {
            "tokens": len(noise),
            "mean_abs_log_ratio": sum(noise) / len(noise),
            "max_abs_log_ratio": max(noise),
        },
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    prepare_model(SOURCE, MODEL_DIR)
    # First, as it is the quickest to fail: one group's step timed inside a Snakemake job.
    job = run_in_snakemake("update", cores=torch.get_num_threads())
    peak = matmul_peak(torch.bfloat16)
    entry = CONFIG["training"]["runs"]["smollm2-grpo"]
    step = time_step(entry["groups_per_step"], entry["episodes_per_group"])
    update = step["update"]
    print(f"bf16 matmul peak {peak / 1e9:.0f} GFLOP/s; {step['torch_threads']} threads\n")
    print("| part | seconds | work | rate |\n|---|---|---|---|")
    print(
        f"| rollouts | {step['rollout_seconds']:.1f} | {step['decisions']} decisions | "
        f"{step['rollout_seconds'] / step['decisions']:.3f} s/decision |"
    )
    print(
        f"| update | {update['seconds']:.1f} | {update['rows']} rows, {update['tokens']} tokens "
        f"| {step['tokens_per_s']:.0f} tokens/s = {step['update_flops'] / 1e9:.0f} GFLOP/s = "
        f"{step['update_flops'] / peak:.0%} of bf16 peak |"
    )
    noise = step["ratio_noise"]
    print(
        f"\nimportance ratio on the unchanged policy, {noise['tokens']} tokens: mean |log r| "
        f"{noise['mean_abs_log_ratio']:.4f}, max {noise['max_abs_log_ratio']:.4f}"
    )
    print(
        f"{job_threads(job)}: {job['tokens_per_s']:.0f} tokens/s = "
        f"{job['update_flops'] / peak:.0%} of bf16 peak"
    )
    write_results(
        "train",
        {
            "bf16_matmul_peak_flops": peak,
            "step": step,
            "fraction_of_bf16_peak": step["update_flops"] / peak,
            "in_snakemake_job": job,
            "target_fraction_of_bf16_peak": TARGET_PEAK,
        },
    )


if __name__ == "__main__":
    main()
