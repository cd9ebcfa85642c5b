"""Rows per optimizer step: ART's one step per row against one accumulated, prefix-shared step.

``grad_accumulation_sequences: 1`` is ART's LocalBackend loop: every row is a forward and
backward pass of its whole prompt and six candidates, then an AdamW step. ``all`` accumulates
the update's rows into one step, and runs them batched after the prompt prefix they share (the
system turn), computed once (``coordgap.training.grpo.TorchGRPOTrainer.accumulate``). Measured
here, inside a Snakemake job (``benchmarks/workflow``, rule ``accumulation``), on SmolLM2-135M in
the default bf16:

* one step's rollouts of the CPU study's recipe (2 groups of 3 episodes at N = 5), played once
  by the untrained adapter, every trajectory made trainable: the same rows for every update;
* the update, from a fresh adapter and optimizer each time, with one row per step and with all
  rows in one step, interleaved over ``REPEATS`` rounds so that both see the same machine:
  seconds per update step, tokens run, and the rate as 4 x (decoder linear parameters) x
  tokens / second against the bf16 matrix-product peak timed in the same run (the tokens the
  shared path skips count for neither).

Target: the shared, batched step at least ``TARGET_SPEEDUP`` times faster than one row per
step. Usage: ``python benchmarks/bench_accumulation.py``. Writes
``benchmarks/results/accumulation.json``. Takes about 12 minutes on 2 cores.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

import torch
from bench_train import BASE, bench_run, step_rollouts
from common import (
    MODEL_DIR,
    SOURCE,
    all_trainable,
    job_threads,
    linear_parameters,
    matmul_peak,
    run_in_snakemake,
    write_results,
)

from coordgap.models.prepare import prepare_model
from coordgap.training.grpo import TorchGRPOTrainer

REPEATS = 2
TARGET_SPEEDUP = 2.0
LOOPS = {"one row per step": 1, "all rows in one step": "all"}


def compare() -> dict[str, Any]:
    """Both loops' updates on the same rows, interleaved (see the module docstring)."""
    run = bench_run(groups_per_step=2, episodes_per_group=3)
    tables = step_rollouts(TorchGRPOTrainer(MODEL_DIR, run, BASE), run)
    peak = matmul_peak(torch.bfloat16)
    timings: dict[str, list[dict[str, Any]]] = {loop: [] for loop in LOOPS}
    for _ in range(REPEATS):
        for loop, rows in LOOPS.items():
            trainer = TorchGRPOTrainer(MODEL_DIR, bench_run(grad_accumulation_sequences=rows), BASE)
            groups = all_trainable(tables["episodes"], tables["transcripts"], run)
            random.seed(0)
            stats = trainer.update(groups)
            timings[loop].append(
                {
                    "seconds": stats.seconds,
                    "rows": stats.rows,
                    "optimizer_steps": stats.optimizer_steps,
                    "tokens": stats.tokens,
                    "peak_share": 4
                    * linear_parameters(trainer.model)
                    * stats.tokens
                    / stats.seconds
                    / peak,
                }
            )
    seconds = {loop: statistics.median(t["seconds"] for t in timings[loop]) for loop in LOOPS}
    one, shared = (seconds[loop] for loop in LOOPS)
    return {
        "torch_threads": torch.get_num_threads(),
        "bf16_matmul_peak_flops": peak,
        "updates": timings,
        "median_seconds": seconds,
        "speedup": one / shared,
        "target_speedup": TARGET_SPEEDUP,
    }


def main() -> None:
    prepare_model(SOURCE, MODEL_DIR)
    job = run_in_snakemake("accumulation", cores=torch.get_num_threads())
    print(f"{job_threads(job)}; {REPEATS} interleaved rounds, medians")
    print("| update | rows | optimizer steps | tokens | seconds per update | s/row | of peak |")
    print("|---|---|---|---|---|---|---|")
    for loop in LOOPS:
        first = job["updates"][loop][0]
        seconds = job["median_seconds"][loop]
        print(
            f"| {loop} | {first['rows']} | {first['optimizer_steps']} | {first['tokens']} | "
            f"{seconds:.1f} | {seconds / first['rows']:.2f} | {first['peak_share']:.0%} |"
        )
    verdict = "meets" if job["speedup"] >= TARGET_SPEEDUP else "misses"
    print(f"shared and batched: {job['speedup']:.2f}x ({verdict} the {TARGET_SPEEDUP:g}x target)")
    write_results("accumulation", {"in_snakemake_job": job})


if __name__ == "__main__":
    main()
