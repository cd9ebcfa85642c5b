"""bf16 against float32 on the training path: seconds per decision and per update row, and
how much of what the adapter learnt the bf16 policy acts on.

``dtype: bfloat16`` is mixed precision (``coordgap.policies.local.load_weights``): the decoder's
matrices multiply in bf16, everything between them (the residual stream, norms, attention, the
LoRA's products) in float32. Measured here, inside a Snakemake job (``benchmarks/workflow``,
rule ``dtype``), for each dtype in turn with a fresh trainer on SmolLM2-135M:

* one group of the default run's rollouts (3 episodes at N = 5), played by the untrained
  adapter: seconds per decision;
* one update, every trajectory made trainable, on the rollouts the first dtype played (the
  same rows for both dtypes): seconds per row;
* after it, the probe set's KL(mu || mu_0) in float32 (what the weights learnt) and as the
  policy acts in the dtype, and their ratio (the tests hold bf16's to at least 0.9).

Rates are also given against each dtype's matrix-product peak timed in the same run. Where
oneDNN has no bf16 kernels (an AVX2-only CPU) ``bfloat16`` computes in float32
(``compute_dtype``): the two rows are then the same path, which the output names.

Usage: ``python benchmarks/bench_dtype.py``. Writes ``benchmarks/results/dtype.json``. Takes
about 10 minutes on 2 cores.
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch
from bench_train import BASE, ENV, TEMPLATES, bench_run, step_rollouts
from common import (
    MODEL_DIR,
    SOURCE,
    TOOLS6,
    all_trainable,
    job_threads,
    linear_parameters,
    matmul_peak,
    run_in_snakemake,
    write_results,
)

from coordgap.models.prepare import prepare_model
from coordgap.policies.local import DTYPES, compute_dtype, matmul_dtype
from coordgap.training.grpo import TorchGRPOTrainer
from coordgap.training.probe import probe_conversations

# Larger than ART's 5e-6 so that one update moves the probe's KL well above its rounding
# (about 0.01 to 0.05 nats, the size of the CPU study's updates); the timings do not depend on it.
LEARNING_RATE = 5e-5


def compare(dtypes: tuple[str, ...] = ("bfloat16", "float32")) -> dict[str, Any]:
    """Each dtype's rollouts, update and probe, in one process (see the module docstring)."""
    run = bench_run(groups_per_step=1, episodes_per_group=3, learning_rate=LEARNING_RATE)
    probes = probe_conversations(ENV, TEMPLATES, run.n)
    result: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "learning_rate": run.learning_rate,
    }
    rows = None
    for dtype in dtypes:
        trainer = TorchGRPOTrainer(MODEL_DIR, run, {**BASE, "dtype": dtype})
        start = time.perf_counter()
        tables = step_rollouts(trainer, run)
        rollout_seconds = time.perf_counter() - start
        decisions = int(tables["episodes"]["decisions"].sum())
        if rows is None:
            rows = tables
        groups = all_trainable(rows["episodes"], rows["transcripts"], run)
        random.seed(0)
        stats = trainer.update(groups)
        probe = trainer.probe(probes, TOOLS6)
        computes = matmul_dtype(trainer.model)
        result[dtype] = {
            "matrices_in": str(computes).removeprefix("torch."),
            "peak_flops": matmul_peak(computes),
            "seconds_per_decision": rollout_seconds / decisions,
            "decisions": decisions,
            "seconds_per_row": stats.seconds / stats.rows,
            "rows": stats.rows,
            "update_flops": 4 * linear_parameters(trainer.model) * stats.tokens / stats.seconds,
            "probe_kl": probe["probe_kl"],
            "probe_kl_acting": probe["probe_kl_acting"],
            "acting_share": probe["probe_kl_acting"] / probe["probe_kl"],
        }
    return result


def main() -> None:
    prepare_model(SOURCE, MODEL_DIR)
    job = run_in_snakemake("dtype", cores=torch.get_num_threads())
    print(f"{job_threads(job)}; learning rate {job['learning_rate']:g}")
    if compute_dtype("bfloat16", "cpu") != DTYPES["bfloat16"]:
        print("no oneDNN bf16 kernels here: bfloat16 computes in float32 (compute_dtype)")
    print(
        "| dtype | matrices in | s/decision | s/update row | update vs its peak | "
        "probe KL float32 | as it acts | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for dtype in ("bfloat16", "float32"):
        part = job[dtype]
        print(
            f"| {dtype} | {part['matrices_in']} | {part['seconds_per_decision']:.3f} | "
            f"{part['seconds_per_row']:.2f} | {part['update_flops'] / part['peak_flops']:.0%} | "
            f"{part['probe_kl']:.3g} | {part['probe_kl_acting']:.3g} | {part['acting_share']:.2f} |"
        )
    bf16, fp32 = job["bfloat16"], job["float32"]
    decisions = fp32["seconds_per_decision"] / bf16["seconds_per_decision"]
    rows = fp32["seconds_per_row"] / bf16["seconds_per_row"]
    print(f"bf16 against float32: decisions {decisions:.2f}x, update rows {rows:.2f}x faster")
    write_results("dtype", {"in_snakemake_job": job})


if __name__ == "__main__":
    main()
