"""What ``torch.compile`` buys the local model's decisions and update, with a persistent cache.

The pipeline decides eagerly, and updates eagerly unless a run sets ``compile_update``. This
measures, on the machine it runs on, whether compiling pays, and whether a compiled run's
results depend on its cache being warm. Variants:

* **eager**: PyTorch's eager kernels;
* **whole decoder** (decisions only): ``torch.compile`` of the whole decoder, so inductor may
  fuse across layers;
* **each layer**: every decoder layer compiled on its own (regional compilation): the layers
  share one compiled graph, so compiling costs about one layer's time. For the update this is
  the trainer's ``compile_update``.

Shapes are dynamic (every group's packed rows, every update row, has its own length). Paths:

* **decisions**: a round of 15 decisions in one group (the pipeline's default batching, the
  prompts of ``bench_profile.py``), six rounds;
* **update**: the first six rows of a real step (``bench_profile.update_rows``), one
  optimizer step each.

Each compiled variant runs in a fresh process beside an eager twin (a second model, or
trainer, on the same inputs), the two taking turns step by step, so the speed-up is an A/B
inside one process; a process-to-process comparison on this shared machine drifts by more
than the effect. The first step (which compiles) is timed apart, the steady time is the median
of the other five. Each variant runs twice on one inductor cache folder, first cold (the
folder empty), then warm. Reported per run: the first and the steady seconds, the speed-up
over eager, the compile overhead and the steps one process must run before it pays; whether
the warm run's results (the decisions' scores; each row's loss and gradient norm) equal the
cold run's bit for bit; and their largest difference from eager's.

Usage: ``python benchmarks/bench_compile.py [--dtype float32]``. Writes
``benchmarks/results/compile_<dtype>.json``. Takes about 20 minutes on 2 AVX2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from bench_local import decide_in_groups, load
from bench_profile import GROUP, update_rows
from bench_train import BASE
from common import MODEL_DIR, SOURCE, table_prompts, write_results

from coordgap.models.prepare import prepare_model

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

# The compiled variants of each path (each runs beside eager).
PATHS = {"decisions": ("whole decoder", "each layer"), "update": ("each layer",)}
STEADY = 5


def compile_decoder(decoder: torch.nn.Module, variant: str) -> None:
    """Compile ``decoder`` in place as ``variant`` says (``eager`` leaves it as it is)."""
    if variant == "whole decoder":
        decoder.compile(dynamic=True)
    elif variant == "each layer":
        for layer in decoder.layers:
            layer.compile(dynamic=True)


def measure_decisions(variant: str, dtype: str) -> dict[str, Any]:
    """Rounds of decisions by ``variant`` and by an eager copy, interleaved (see ``ab``)."""
    models = {"eager": load(dtype), variant: load(dtype)}
    compile_decoder(models[variant]._decoder, variant)
    chats = table_prompts(GROUP)

    def one_round(name: str) -> list[float]:
        decided = asyncio.run(decide_in_groups(models[name], chats, GROUP))
        return [score for decision in decided for score in decision.transcript.scores]

    return ab(variant, [one_round] * (1 + STEADY))


def measure_update(variant: str, dtype: str) -> dict[str, Any]:
    """Update rows by ``variant`` and by an eager trainer, interleaved (see ``ab``)."""
    trainers = {
        name: update_rows(dtype, 1 + STEADY, compile_update=name == "each layer")
        for name in ("eager", variant)
    }

    def one_row(index: int) -> Callable[[str], list[float]]:
        def run(name: str) -> list[float]:
            trainer, rows = trainers[name]
            loss, norm, _, _ = trainer._step(*rows[index])
            return [loss, norm]

        return run

    return ab(variant, [one_row(index) for index in range(1 + STEADY)])


def ab(variant: str, steps: list[Callable[[str], list[float]]]) -> dict[str, Any]:
    """Run each step by ``variant`` and by ``eager``, the two in alternating order.

    Both run in one process, one after the other, so the machine's drift between processes
    (several per cent on a shared machine) does not enter the speed-up. The first step of
    each (compiling, for ``variant``) is timed apart; the steady time is the median of the
    others.

    Returns:
        Per side the first step's and the steady seconds, and the values every step returned.
    """
    seconds: dict[str, list[float]] = {"eager": [], variant: []}
    values: dict[str, list[float]] = {"eager": [], variant: []}
    for index, step in enumerate(steps):
        for name in (variant, "eager") if index % 2 == 0 else ("eager", variant):
            start = time.perf_counter()
            values[name] += step(name)
            seconds[name].append(time.perf_counter() - start)
    return {
        "first_s": seconds[variant][0],
        "steady_s": statistics.median(seconds[variant][1:]),
        "eager_steady_s": statistics.median(seconds["eager"][1:]),
        "values": values[variant],
        "eager_values": values["eager"],
    }


def in_process(path: str, variant: str, dtype: str, cache: str) -> dict[str, Any]:
    """A measurement in a fresh Python process, with ``cache`` as inductor's cache folder."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    command = [sys.executable, __file__, "--dtype", dtype, "--worker", path, variant]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def summary(run: dict[str, Any]) -> dict[str, Any]:
    """A compiled run against its eager twin: speed-up, overhead, break-even, difference."""
    overhead = run["first_s"] - run["steady_s"]
    saved = run["eager_steady_s"] - run["steady_s"]
    return {
        "first_s": run["first_s"],
        "steady_s": run["steady_s"],
        "eager_steady_s": run["eager_steady_s"],
        "speedup": run["eager_steady_s"] / run["steady_s"],
        "compile_overhead_s": overhead,
        "break_even": overhead / saved if saved > 0 else None,
        "largest_difference_from_eager": max(
            abs(a - b) for a, b in zip(run["values"], run["eager_values"], strict=True)
        ),
    }


def compare(path: str, dtype: str) -> dict[str, Any]:
    """Every compiled variant of ``path``, cold and then warm, each beside eager."""
    results: dict[str, Any] = {}
    for variant in PATHS[path]:
        with tempfile.TemporaryDirectory() as cache:
            cold = in_process(path, variant, dtype, cache)
            warm = in_process(path, variant, dtype, cache)
        results[variant] = {
            "cold": summary(cold),
            "warm": summary(warm),
            "warm_equals_cold": warm["values"] == cold["values"],
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default=BASE["dtype"], choices=("bfloat16", "float32"))
    parser.add_argument("--worker", nargs=2, metavar=("PATH", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        path, variant = args.worker
        measure = measure_decisions if path == "decisions" else measure_update
        print(json.dumps(measure(variant, args.dtype)))
        return
    prepare_model(SOURCE, MODEL_DIR)
    results = {path: compare(path, args.dtype) for path in PATHS}
    print("| path | variant | cache | first s | steady s | eager s | speed-up | break-even |")
    print("|---|---|---|---|---|---|---|---|")
    for path, variants in results.items():
        for variant, result in variants.items():
            for cache in ("cold", "warm"):
                row = result[cache]
                even = "never" if row["break_even"] is None else f"{row['break_even']:.0f}"
                print(
                    f"| {path} | {variant} | {cache} | {row['first_s']:.1f} | "
                    f"{row['steady_s']:.2f} | {row['eager_steady_s']:.2f} | "
                    f"{row['speedup']:.2f} | {even} |"
                )
            print(
                f"{path}, {variant}: warm results equal cold bit for bit: "
                f"{result['warm_equals_cold']}; largest difference from eager "
                f"{result['warm']['largest_difference_from_eager']:.1e}"
            )
    write_results(f"compile_{args.dtype}", {"group": GROUP, "steady": STEADY, **results})


if __name__ == "__main__":
    main()
