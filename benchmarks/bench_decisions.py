"""Local decisions, the path of today against the path before it, timed in the same run.

The model is SmolLM2-135M-Instruct in bf16 mixed precision, as the default config decides with
it (``config/config.yaml``), on the pipeline's prompts for the seats of a table
(``common.table_prompts``), with the six tools. Every round of N seats is one group, as the
episode runner groups a simultaneous round. Two paths on one loaded model, taking turns round
by round (the first round of each discarded as a warm-up), at N = 5 and N = 15:

* ``previous``: the path before 2026-12-07, rebuilt here as the peer: every candidate call's own
  tokens as one block after the stem (``flat_tree``), transformers' gated MLP (three tensors of
  the MLP's width allocated per layer), and the output layer's product and log-softmax each
  into a fresh tensor (``fresh_log_probs``);
* ``tree``: today's ``coordgap.policies.local``: the candidates' own tokens as a tree, so that
  ``pick_up_`` and ``put_down_`` run once each; the gated MLP in place; the output layer in a
  buffer kept between calls.

Both give the same choice distribution (``tests/unit/test_local_model.py`` holds it). For each:
seconds per decision (the median round) and the decoder's linear work as a share of the bf16
matrix-product peak timed in the same run (2 x linear parameters x tokens a decision runs: its
prompt after the cached system turn, the candidates' shared start and its blocks). Everything
runs inside one Snakemake job (``benchmarks/workflow``, rule ``tree``).

Usage: ``python benchmarks/bench_decisions.py``. Writes
``benchmarks/results/decisions.json``. Takes about 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import statistics
import time
import types
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from bench_local import decide_in_groups, load, tokens_run
from common import (
    MODEL_DIR,
    SOURCE,
    TOOLS6,
    job_threads,
    linear_parameters,
    matmul_peak,
    run_in_snakemake,
    table_prompts,
    write_results,
)

from coordgap.models.prepare import prepare_model
from coordgap.policies import local

if TYPE_CHECKING:
    from collections.abc import Iterator

    from coordgap.policies.base import Decision

SIZES = (5, 15)
PATHS = ("previous", "tree")
TARGET = 2.0
# Timed rounds per path and N, after one warm-up round each.
ROUNDS = 7


@functools.lru_cache(maxsize=64)
def flat_tree(candidates: tuple[tuple[int, ...], ...]) -> local.CandidateTree:
    """The previous path's layout: each candidate's own tokens one block after the stem."""
    shared = local.shared_length(candidates)
    blocks = tuple(candidate[shared:-1] for candidate in candidates)
    reads = []
    column = shared + 1
    for block in blocks:
        reads.append((*range(shared + 1), *range(column, column + len(block))))
        column += len(block)
    return local.CandidateTree(shared, blocks, (0,) * len(blocks), tuple(reads))


def fresh_log_probs(self: local.LocalChatModel, hidden: torch.Tensor) -> torch.Tensor:
    """The previous path's output layer: the product and its log-softmax in fresh tensors."""
    return torch.log_softmax(F.linear(hidden.float(), self._head), dim=-1)


@contextlib.contextmanager
def previous_path(model: local.LocalChatModel) -> Iterator[None]:
    """Decide along the previous path while the context is open."""
    mlps = [module for module in model.model.modules() if local._is_silu_gated_mlp(module)]
    tree, log_probs = local.candidate_tree, local.LocalChatModel._log_probs
    local.candidate_tree = flat_tree
    local.LocalChatModel._log_probs = fresh_log_probs  # type: ignore[method-assign]
    for module in mlps:
        del module.forward
    try:
        yield
    finally:
        local.candidate_tree = tree
        local.LocalChatModel._log_probs = log_probs  # type: ignore[method-assign]
        for module in mlps:
            module.forward = types.MethodType(local._gated_mlp_forward, module)


def tokens_per_decision(
    model: local.LocalChatModel, chats: list[Any], decided: list[Decision]
) -> float:
    """Tokens a decision of ``chats`` ran after the cached system turn, along the path in force."""
    messages = local.with_tools(chats[0], TOOLS6)
    prefix = model._prefix(messages, model._prompt(messages))
    return tokens_run(model, decided, len(prefix)) / len(decided)


def measure(rounds: int = ROUNDS) -> dict[str, Any]:
    """Both paths' rounds at each N, interleaved (see the module docstring)."""
    model = load("bfloat16")
    chats = {n: table_prompts(n) for n in SIZES}
    seconds: dict[str, dict[int, list[float]]] = {path: {n: [] for n in SIZES} for path in PATHS}
    tokens: dict[str, float] = {}
    for _ in range(rounds + 1):
        for path in PATHS:
            with previous_path(model) if path == "previous" else contextlib.nullcontext():
                for n in SIZES:
                    start = time.perf_counter()
                    decided = asyncio.run(decide_in_groups(model, chats[n], n))
                    seconds[path][n].append((time.perf_counter() - start) / n)
                tokens[path] = tokens_per_decision(model, chats[n], decided)
    peak = matmul_peak(torch.bfloat16)
    parameters = linear_parameters(model.model)
    result: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "bf16_peak_flops": peak,
        "tokens_per_decision": tokens,
        "seconds_per_decision": seconds,
        "rows": [],
    }
    for n in SIZES:
        median = {path: statistics.median(seconds[path][n][1:]) for path in PATHS}
        for path in PATHS:
            result["rows"].append(
                {
                    "n": n,
                    "path": path,
                    "seconds_per_decision": median[path],
                    "speedup": median["previous"] / median[path],
                    "share_of_bf16_peak": 2 * parameters * tokens[path] / median[path] / peak,
                }
            )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    prepare_model(SOURCE, MODEL_DIR)
    job = run_in_snakemake("tree", cores=torch.get_num_threads())
    print(job_threads(job), f"bf16 peak {job['bf16_peak_flops'] / 1e9:.0f} GFLOP/s")
    print("| N | path | tokens/decision | s/decision | vs previous | share of bf16 peak |")
    print("|---|---|---|---|---|---|")
    for row in job["rows"]:
        print(
            f"| {row['n']} | {row['path']} | {job['tokens_per_decision'][row['path']]:.0f} | "
            f"{row['seconds_per_decision']:.3f} | {row['speedup']:.2f}x | "
            f"{row['share_of_bf16_peak']:.0%} |"
        )
    write_results("decisions", {"in_snakemake_job": job, "target_speedup_n5": TARGET})


if __name__ == "__main__":
    main()
