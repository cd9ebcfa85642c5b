"""One GRPO step of the default recipe on this CPU, and what its objective does to the policy.

The run is the default config's (``training.runs.smollm2-grpo``): 2 groups of 3 episodes at
N = 5, 5 rounds, played by SmolLM2-135M through the episode runner, then one update with ART's
preprocessing and loss and one AdamW step per row, exactly as ``train_grpo`` runs them. The
update's cost does not depend on the rewards' values, so every trajectory is made trainable
(distinct rewards per episode): the benchmark times the largest update a step can have.

Reported, each rate against the bf16 matrix-product peak timed in the same run:

* seconds of the step, split into rollouts and update;
* the update under both objectives on the same rollouts: the decision-level one the trainer
  uses (each row scores the prompt and all six candidate calls) and the former token-level one
  (each row the prompt and the chosen call): seconds per row, tokens/s, and the rate as
  4 x (decoder linear parameters) x tokens / second (a forward pass and the gradient with
  respect to the activations; the base weights are frozen, and LoRA's own products and
  attention are left out, so the fraction understates the work); the warm-up row is left out;
* the importance ratio on the unchanged policy: |log mu_trainer(k) - log mu_sampler(k)| over
  every decision before the first optimizer step (the sampler/trainer numerical noise);
* on the probe set's first prompt (round 1, both forks free), for each tool as the chosen
  call, the cosine between the two objectives' gradients, and between the token-level one and
  the gradient of the tokens every call shares;
* one update of a two-decision group (think rewarded over the favoured call) under each
  objective, in float32: how it moves log mu on the probe set, the step being the same size
  (Adam's first step);
* after the default step's update: the probe set's KL(mu || mu_0) in float32 (what the weights
  learnt) and in bf16 (the policy as it acts, rounding included);
* the default step timed inside a Snakemake job (``benchmarks/workflow``).

Usage: ``python benchmarks/bench_train.py``. Writes ``benchmarks/results/train.json``.
Takes about 10 minutes on 2 cores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml
from common import (
    MODEL_DIR,
    ROOT,
    SOURCE,
    TOOLS6,
    all_trainable,
    job_threads,
    linear_parameters,
    matmul_peak,
    run_in_snakemake,
    token_level,
    write_results,
)

from coordgap.config.play import EnvironmentConfig
from coordgap.config.training import TrainingRunConfig
from coordgap.env.observation import PromptTemplates
from coordgap.env.protocols import Tool
from coordgap.episodes import transcript_row
from coordgap.models.prepare import prepare_model
from coordgap.policies.local import shared_length
from coordgap.training._art import art
from coordgap.training.grpo import TorchGRPOTrainer
from coordgap.training.loop import play_rollouts, rollout_cell, rollout_outputs
from coordgap.training.probe import probe_conversations
from coordgap.training.trajectories import philosopher_trajectory

if TYPE_CHECKING:
    import polars as pl

CONFIG = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
ENTRY = CONFIG["training"]["runs"]["smollm2-grpo"]
BASE = CONFIG["models"]["smollm2-135m"]
ENV = EnvironmentConfig.from_dict(CONFIG["environment"])
TEMPLATES = PromptTemplates.load(ROOT / "config" / "prompts")
TARGET_PEAK = 0.4


def bench_run(**changes: Any) -> TrainingRunConfig:
    """The default run, changed; without the warm-up unless asked, so rows time alone."""
    return TrainingRunConfig.from_dict("bench", {**ENTRY, "warmup": False, **changes})


def step_rollouts(trainer: TorchGRPOTrainer, run: TrainingRunConfig) -> dict[str, pl.DataFrame]:
    """Step 0's rollout tables under the trainer's policy, played and journalled as in training."""
    cell = rollout_cell(run, ENV, CONFIG["seed"], 0, 0)
    with tempfile.TemporaryDirectory(prefix="bench_rollouts.") as folder:
        outputs = rollout_outputs(Path(folder), 0)
        return asyncio.run(
            play_rollouts(trainer.sampler(), cell, outputs, TEMPLATES, run.max_in_flight)
        )


def time_step(groups_per_step: int, episodes_per_group: int) -> dict[str, Any]:
    """Play one step's rollouts, then run its update under each objective on a fresh adapter."""
    run = bench_run(groups_per_step=groups_per_step, episodes_per_group=episodes_per_group)
    trainer = TorchGRPOTrainer(MODEL_DIR, run, BASE)
    start = time.perf_counter()
    tables = step_rollouts(trainer, run)
    rollout_seconds = time.perf_counter() - start
    result: dict[str, Any] = {
        "rollout_seconds": rollout_seconds,
        "decisions": int(tables["episodes"]["decisions"].sum()),
        "torch_threads": torch.get_num_threads(),
    }
    for objective in ("decision", "token"):
        transcripts = tables["transcripts"]
        if objective == "token":
            transcripts = transcripts.with_columns(
                candidates=None, scores=None, choice=None, choice_logprob=None
            )
        groups = all_trainable(tables["episodes"], transcripts, run)
        fresh = TorchGRPOTrainer(MODEL_DIR, run, BASE)
        random.seed(0)
        noise = fresh.sampler_gaps(fresh.rows(groups))
        random.seed(0)
        stats = fresh.update(groups)
        probe = fresh.probe(probe_conversations(ENV, TEMPLATES, run.n), TOOLS6)
        result[objective] = {
            "probe_kl": probe["probe_kl"],
            "probe_kl_acting": probe["probe_kl_acting"],
            "update": dataclasses.asdict(stats),
            "seconds_per_row": stats.seconds / stats.rows,
            "tokens_per_s": stats.tokens / stats.seconds,
            "update_flops": 4 * linear_parameters(fresh.model) * stats.tokens / stats.seconds,
            "ratio_noise": {
                "positions": len(noise),
                "mean_abs_log_ratio": sum(noise) / len(noise),
                "max_abs_log_ratio": max(noise),
            },
        }
    return result


def drawn(transcript: Any, k: int, temperature: float) -> dict[str, Any]:
    """The transcript row of a decision had it drawn candidate ``k`` from the same mu.

    The chosen call's token log-probs are NaN, which ART reads as the current policy's (ratio
    1): the update is on-policy under either objective.
    """
    scores = torch.tensor(transcript.scores, dtype=torch.float64)
    row = dataclasses.replace(
        transcript,
        token_ids=transcript.candidates[k],
        logprobs=(math.nan,) * len(transcript.candidates[k]),
        choice=k,
        choice_logprob=float(torch.log_softmax(scores / temperature, 0)[k]),
    )
    return transcript_row(row)


def flat_gradient(trainer: TorchGRPOTrainer) -> torch.Tensor:
    grads = [p.grad.flatten() for p in trainer.model.parameters() if p.requires_grad]
    trainer.model.zero_grad()
    return torch.cat(grads)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def gradient_cosines(trainer: TorchGRPOTrainer, chat: list[dict[str, str]]) -> dict[str, Any]:
    """For each tool as the choice: cos(token-level, decision-level), cos(token-level, shared)."""
    run = trainer.run
    decision = asyncio.run(trainer.sampler().decide(chat, TOOLS6, 0))
    transcript = decision.transcript
    shared = shared_length(transcript.candidates)
    trainer.model.train()
    out = {}
    mu = torch.softmax(torch.tensor(transcript.scores) / run.temperature, 0)
    for k, tool in enumerate(TOOLS6):
        choice = drawn(transcript, k, run.temperature)
        grads = {}
        for objective, call in (("decision", choice), ("token", token_level(choice))):
            trajectory = philosopher_trajectory([call], 1.0, {}, run.temperature)
            other = philosopher_trajectory([call], 0.0, {}, run.temperature)
            random.seed(0)
            rows = trainer.rows([art.TrajectoryGroup([trajectory, other])])
            inputs = trainer.row(rows.packed, 0)
            new, _ = trainer.log_probs(inputs, rows.choices[0])
            positions = inputs["assistant_mask"][0, 1:].nonzero()[:, 0]
            new[0, positions].sum().backward()
            grads[objective] = flat_gradient(trainer)
            if objective == "token":
                new, _ = trainer.log_probs(inputs, rows.choices[0])
                new[0, positions[:shared]].sum().backward()
                grads["shared"] = flat_gradient(trainer)
        out[str(tool)] = {
            "mu": float(mu[k]),
            "cos_token_decision": cosine(grads["token"], grads["decision"]),
            "cos_token_shared": cosine(grads["token"], grads["shared"]),
        }
    trainer.model.eval()
    return out


def one_step_moves(chats: list[list[dict[str, str]]]) -> dict[str, Any]:
    """How one update moves mu on the probe set, under each objective.

    The update is one group of two decisions on the first probe: think rewarded 1, the call mu
    favours 0. Reported per objective: the mean change of log mu(think) and of log mu of the
    favoured call over the nine probes, and the mean total variation between mu before and
    after. In float32: in bf16 a step this small re-rounds the activations, which moves log mu
    by more than the step does (``probe_kl_acting`` against ``probe_kl`` in ``time_step``).
    """
    out: dict[str, Any] = {}
    think = TOOLS6.index(Tool.THINK)
    for objective in ("decision", "token"):
        run = bench_run()
        trainer = TorchGRPOTrainer(MODEL_DIR, run, {**BASE, "dtype": "float32"})
        before = trainer.choice_log_probs(chats, TOOLS6)
        decision = asyncio.run(trainer.sampler().decide(chats[0], TOOLS6, 0))
        transcript = decision.transcript
        favoured = int(torch.tensor(transcript.scores).argmax())
        calls = []
        for k, reward in ((think, 1.0), (favoured, 0.0)):
            call = drawn(transcript, k, run.temperature)
            calls.append((call if objective == "decision" else token_level(call), reward))
        group = art.TrajectoryGroup(
            [philosopher_trajectory([c], r, {}, run.temperature) for c, r in calls]
        )
        random.seed(0)
        trainer.update([group])
        after = trainer.choice_log_probs(chats, TOOLS6)
        out[objective] = {
            "log_mu_think": float((after - before)[:, think].mean()),
            "log_mu_favoured": float((after - before)[:, favoured].mean()),
            "total_variation": float((after.exp() - before.exp()).abs().sum(dim=1).mean() / 2),
        }
    out["think_ratio"] = out["decision"]["log_mu_think"] / out["token"]["log_mu_think"]
    return out


def main() -> None:
    prepare_model(SOURCE, MODEL_DIR)
    # First, as it is the quickest to fail: one group's step timed inside a Snakemake job.
    job = run_in_snakemake("update", cores=torch.get_num_threads())
    peak = matmul_peak(torch.bfloat16)
    step = time_step(ENTRY["groups_per_step"], ENTRY["episodes_per_group"])
    probes = probe_conversations(ENV, TEMPLATES, ENTRY["n"])
    cosines = gradient_cosines(TorchGRPOTrainer(MODEL_DIR, bench_run(), BASE), probes[0])
    moves = one_step_moves(probes)
    print(f"bf16 matmul peak {peak / 1e9:.0f} GFLOP/s; {step['torch_threads']} threads\n")
    print("| part | seconds | work | rate |\n|---|---|---|---|")
    print(
        f"| rollouts | {step['rollout_seconds']:.1f} | {step['decisions']} decisions | "
        f"{step['rollout_seconds'] / step['decisions']:.3f} s/decision |"
    )
    for objective in ("decision", "token"):
        part = step[objective]
        update = part["update"]
        print(
            f"| update, {objective} level | {update['seconds']:.1f} | {update['rows']} rows, "
            f"{update['tokens']} tokens | {part['seconds_per_row']:.2f} s/row, "
            f"{part['tokens_per_s']:.0f} tokens/s = {part['update_flops'] / peak:.0%} of peak |"
        )
    for objective in ("decision", "token"):
        part = step[objective]
        print(
            f"after the {objective}-level update: probe KL(mu || mu_0) {part['probe_kl']:.2g} "
            f"in float32, {part['probe_kl_acting']:.2g} in bf16 as it acts"
        )
    noise = step["decision"]["ratio_noise"]
    print(
        f"\nratio on the unchanged policy, {noise['positions']} decisions: mean |log r| "
        f"{noise['mean_abs_log_ratio']:.2g}, max {noise['max_abs_log_ratio']:.2g}"
    )
    print("\n| chosen tool | mu | cos(token, decision) | cos(token, shared tokens) |")
    print("|---|---|---|---|")
    for tool, row in cosines.items():
        print(
            f"| {tool} | {row['mu']:.2g} | {row['cos_token_decision']:.2f} | "
            f"{row['cos_token_shared']:.2f} |"
        )
    print("\n| one update | mean change of log mu(think) | of log mu(favoured) | TV |")
    print("|---|---|---|---|")
    for objective in ("decision", "token"):
        move = moves[objective]
        print(
            f"| {objective} level | {move['log_mu_think']:+.4f} | "
            f"{move['log_mu_favoured']:+.5f} | {move['total_variation']:.4f} |"
        )
    print(
        f"{job_threads(job)}: decision level {job['decision']['tokens_per_s']:.0f} tokens/s = "
        f"{job['decision']['update_flops'] / peak:.0%} of bf16 peak"
    )
    write_results(
        "train",
        {
            "bf16_matmul_peak_flops": peak,
            "step": step,
            "fraction_of_bf16_peak": step["decision"]["update_flops"] / peak,
            "gradient_cosines": cosines,
            "one_update_moves_mu": moves,
            "in_snakemake_job": job,
            "target_fraction_of_bf16_peak": TARGET_PEAK,
        },
    )


if __name__ == "__main__":
    main()
