"""Numerics of the local model per dtype and oneDNN kernel path: speed and log-prob agreement.

oneDNN picks its matrix kernels by the instructions it finds (AMX, AVX512-BF16, AVX-512,
AVX2), and machines of this kind differ in CPU; ``ONEDNN_MAX_CPU_ISA`` caps the choice, so one
machine can run every lower path. For each path and dtype, a worker process decides 20 seats of
two tables in groups of 5 (as simultaneous rounds) and one at a time, and reports:

* ms per decision, grouped and alone;
* grouped vs alone: the largest and mean |difference| of a sampled token's log-prob (same
  tool only);
* sampler vs trainer, per token: the same for the chosen calls' token log-probs the GRPO
  trainer recomputes for the unchanged policy (ART's rows, a plain forward pass);
* sampler vs trainer, per decision: |log mu_theta(k) - log mu_old(k)|, the noise of the
  importance ratio the trainer uses for constrained decisions at step start.

The bounds the tests hold the local model and the trainer to (``tests/unit/test_local_model.py``,
``tests/unit/test_training.py``) come from these numbers.
Usage: ``python benchmarks/bench_numerics.py [--caps default,AVX512_CORE,...]``.
Writes ``benchmarks/results/numerics.json``. Takes about 10 minutes on 2 cores (bf16 without
bf16 instructions is slow).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from typing import Any

import yaml
from bench_local import decide_in_groups
from common import (
    MODEL_DIR,
    ROOT,
    SOURCE,
    machine,
    table_prompts,
    token_level,
    write_results,
)

from coordgap.config.training import TrainingRunConfig
from coordgap.episodes import transcript_row
from coordgap.models.prepare import prepare_model
from coordgap.training._art import art
from coordgap.training.grpo import TorchGRPOTrainer
from coordgap.training.trajectories import philosopher_trajectory

CONFIG = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
CAPS = ("default", "AVX512_CORE_BF16", "AVX512_CORE", "AVX2")


def _spread(a: list[float], b: list[float]) -> dict[str, float]:
    differences = [abs(x - y) for x, y in zip(a, b, strict=True)]
    return {"max": max(differences), "mean": sum(differences) / len(differences)}


def measure(dtype: str) -> dict[str, Any]:
    """One dtype on this process's kernel path (see the module docstring)."""
    base = {**CONFIG["models"]["smollm2-135m"], "dtype": dtype, "max_batch": 5}
    run = TrainingRunConfig.from_dict("numerics", CONFIG["training"]["runs"]["smollm2-grpo"])
    trainer = TorchGRPOTrainer(MODEL_DIR, run, base)
    sampler = trainer.sampler()
    chats = table_prompts(10) + table_prompts(10, seed=1)
    asyncio.run(decide_in_groups(sampler, chats, 5))  # warm-up and the prefix cache
    seconds = {}
    decided = {}
    for group in (5, 1):
        start = time.perf_counter()
        decided[group] = asyncio.run(decide_in_groups(sampler, chats, group))
        seconds[group] = time.perf_counter() - start
    same = [(a, b) for a, b in zip(decided[5], decided[1], strict=True) if a.tool == b.tool]
    grouped = [lp for a, _ in same for lp in a.transcript.logprobs]
    alone = [lp for _, b in same for lp in b.transcript.logprobs]
    calls = [transcript_row(d.transcript) for d in decided[5]]
    gaps = {}
    for level, rows in (("decision", calls), ("token", [token_level(c) for c in calls])):
        group = art.TrajectoryGroup(
            [
                philosopher_trajectory([call], float(i), {"seat": i}, run.temperature)
                for i, call in enumerate(rows)
            ]
        )
        random.seed(0)
        gaps[level] = trainer.sampler_gaps(trainer.rows([group]))
    return {
        "ms_per_decision_grouped": 1000 * seconds[5] / len(chats),
        "ms_per_decision_alone": 1000 * seconds[1] / len(chats),
        "tools_equal_grouped_alone": len(same) == len(chats),
        "grouped_vs_alone": _spread(grouped, alone),
        "sampler_vs_trainer": _stats(gaps["token"]),
        "decision_ratio": _stats(gaps["decision"]),
    }


def _stats(gaps: list[float]) -> dict[str, float]:
    return {"max": max(gaps), "mean": sum(gaps) / len(gaps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--caps", default=",".join(CAPS))
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--worker", help="measure one dtype here and print JSON")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps({"machine": machine(), **measure(args.worker)}))
        return
    prepare_model(SOURCE, MODEL_DIR)
    results = []
    for cap in args.caps.split(","):
        env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
        if cap != "default":
            env["ONEDNN_MAX_CPU_ISA"] = cap
        for dtype in args.dtypes.split(","):
            out = subprocess.run(
                [sys.executable, __file__, "--worker", dtype],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.splitlines()[-1]
            results.append({"cap": cap, "dtype": dtype, **json.loads(out)})
    print(
        "| ISA cap | dtype | ms/decision grouped | alone | grouped vs alone max / mean | "
        "sampler vs trainer per token, max / mean | per decision, max / mean |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        g, s, d = r["grouped_vs_alone"], r["sampler_vs_trainer"], r["decision_ratio"]
        print(
            f"| {r['cap']} | {r['dtype']} | {r['ms_per_decision_grouped']:.0f} | "
            f"{r['ms_per_decision_alone']:.0f} | {g['max']:.2g} / {g['mean']:.1g} | "
            f"{s['max']:.2g} / {s['mean']:.1g} | {d['max']:.2g} / {d['mean']:.1g} |"
        )
    bounds = {}
    for dtype in args.dtypes.split(","):
        rows = [r for r in results if r["dtype"] == dtype]
        bounds[dtype] = {
            "largest": max(r[k]["max"] for r in rows for k in ("sampler_vs_trainer",
                                                                 "grouped_vs_alone")),
            "mean": max(r[k]["mean"] for r in rows for k in ("sampler_vs_trainer",
                                                              "grouped_vs_alone")),
        }  # fmt: skip
        bounds[dtype]["decision_largest"] = max(r["decision_ratio"]["max"] for r in rows)
        bounds[dtype]["decision_mean"] = max(r["decision_ratio"]["mean"] for r in rows)
        print(f"{dtype} on every path: largest {bounds[dtype]['largest']:.3g}, "
              f"mean up to {bounds[dtype]['mean']:.3g}; per decision largest "
              f"{bounds[dtype]['decision_largest']:.3g}, mean up to "
              f"{bounds[dtype]['decision_mean']:.3g}")  # fmt: skip
    write_results("numerics", {"rows": results, "bounds": bounds})


if __name__ == "__main__":
    main()
