"""Where the local model's time goes: decisions and the GRPO update, split by operator kind.

Both paths run as the pipeline runs them, under ``torch.profiler``:

* **decisions**: a simultaneous round of 15 seats (the pipeline's prompts, six tools) decided
  as one group by ``LocalChatModel``, after a warm-up round;
* **update**: rows of a real step (one episode group played by the trainer's own sampler,
  every trajectory made trainable), each one optimizer step of ``TorchGRPOTrainer._step``:
  the six-way objective's forward pass, ART's loss, the backward pass and AdamW.

Every ATen operator's own time is put in one kind, by the operator and the innermost enclosing
operator that tells (so a kernel inside fused attention counts as attention):

* ``matrix products``: the decoder's linear layers (LoRA's included), forward and backward;
* ``attention``: fused attention, or eager attention's batched products and softmax;
* ``output layer``: the float32 head over the vocabulary and its log-softmax (an operator
  with a vocabulary-sized dimension);
* ``elementwise``: everything else ATen runs (norms, rotary embeddings, activations, copies,
  the optimizer);
* ``framework``: the wall time no ATen operator accounts for (Python, dispatch, the
  profiler's own cost).

The profiler adds a cost per operator, so the shares are of the profiled run. Beside them: the
unprofiled time of the same work (the median of three runs) and, from it, the linear layers'
work (counted as ``bench_local.py`` and ``bench_train.py`` count) as a share of the
matrix-product peak in the dtype the model computes in, timed in the same run (the "share of
the peak" the targets in ``benchmarks/README.md`` are stated in).

Usage: ``python benchmarks/bench_profile.py [--dtype float32] [--rows 4]``. Writes
``benchmarks/results/profile_<dtype>.json``. Takes about 4 minutes on 2 AVX2 cores, 2 on 2 AMX
cores.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch
from bench_local import decide_in_groups, load, tokens_run
from bench_train import BASE, bench_run, step_rollouts
from common import (
    MODEL_DIR,
    SOURCE,
    all_trainable,
    linear_parameters,
    matmul_peak,
    table_prompts,
    write_results,
)
from torch.profiler import ProfilerActivity, profile

from coordgap.models.prepare import prepare_model
from coordgap.policies.local import compute_dtype
from coordgap.training.grpo import TorchGRPOTrainer

if TYPE_CHECKING:
    from collections.abc import Callable

    from art.preprocessing.inputs import TrainInputs
    from openai.types.chat.chat_completion import Choice
    from torch.autograd.profiler_util import FunctionEvent

    from coordgap.policies.base import Decision

KINDS = ("matrix products", "attention", "output layer", "elementwise", "framework")
GROUP = 15


def _vocabulary_sized(event: FunctionEvent, vocabulary: int) -> bool:
    return any(vocabulary in shape for shape in event.input_shapes if isinstance(shape, list))


def _is_fused_attention(event: FunctionEvent) -> bool:
    name = event.name.lower()
    return "scaled_dot_product" in name or "scaleddotproduct" in name


def _telling_kind(event: FunctionEvent, vocabulary: int) -> str | None:
    """The kind an operator tells by itself, or None when it takes its enclosing one's.

    Autograd's nodes (``MmBackward0`` and the like) record no shapes: a node that needs its
    shapes to tell its kind tells none, and the ATen operators inside it, which have shapes,
    tell theirs.
    """
    name = event.name.lower()
    shapes = [shape for shape in event.input_shapes if isinstance(shape, list) and shape]
    if _is_fused_attention(event) or name in ("aten::bmm", "aten::baddbmm"):
        return "attention"
    if not shapes:
        return None
    vocabulary_sized = any(vocabulary in shape for shape in shapes)
    if name in ("aten::_softmax", "aten::_softmax_backward_data"):
        return "attention"
    if "log_softmax" in name and vocabulary_sized:
        return "output layer"
    if name in ("aten::mm", "aten::addmm", "aten::linear"):
        return "output layer" if vocabulary_sized else "matrix products"
    if name == "aten::matmul" and any(len(shape) == 4 for shape in shapes):
        return "attention"
    return None


def kind_of(event: FunctionEvent, vocabulary: int) -> str:
    """The kind an ATen operator's own time counts in (the module docstring's rules).

    Fused attention claims everything inside it; otherwise the operator itself, then its
    enclosing operators from the innermost out, decide; an operator none of them tells is
    elementwise work.
    """
    chain = []
    node: FunctionEvent | None = event
    while node is not None:
        chain.append(node)
        node = node.cpu_parent
    if any(_is_fused_attention(node) for node in chain):
        return "attention"
    for node in chain:
        kind = _telling_kind(node, vocabulary)
        if kind is not None:
            return kind
    return "elementwise"


def split(run: Callable[[], Any], vocabulary: int, plain_runs: int = 3) -> dict[str, Any]:
    """Time ``run`` without the profiler, then run it once under it; split that time by kind.

    Args:
        run: The work.
        vocabulary: The vocabulary's size (tells the output layer's operators).
        plain_runs: Unprofiled runs; their median is the work's time.
    """
    plain_seconds = []
    for _ in range(plain_runs):
        start = time.perf_counter()
        run()
        plain_seconds.append(time.perf_counter() - start)
    plain = statistics.median(plain_seconds)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        run()
        profiled = time.perf_counter() - start
    seconds: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.name.startswith("aten::"):
            seconds[kind_of(event, vocabulary)] += event.self_cpu_time_total / 1e6
    # One thread runs the operators (intra-op threads run inside them), so what they do not
    # cover is Python and dispatch.
    seconds["framework"] = max(profiled - sum(seconds.values()), 0.0)
    return {
        "seconds_plain": plain,
        "seconds_profiled": profiled,
        "seconds_by_kind": {kind: seconds[kind] for kind in KINDS},
        "share_by_kind": {kind: seconds[kind] / profiled for kind in KINDS},
    }


def with_matrix_rate(result: dict[str, Any], matrix_flops: float) -> dict[str, Any]:
    """``split``'s result with the linear layers' work, ``matrix_flops``, and their rate."""
    rate = matrix_flops / result["seconds_by_kind"]["matrix products"]
    return {**result, "matrix_flops": matrix_flops, "matrix_product_flops_per_s": rate}


class _InlineExecutor(ThreadPoolExecutor):
    """Runs what it is given at once, in the calling thread.

    The model decides in ``asyncio.to_thread``'s worker thread, which the profiler (it follows
    the thread it started in) would not see; the work and its order are the same inline.
    """

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:  # handed to the awaiting caller
            future.set_exception(error)
        return future


def decisions(dtype: str) -> dict[str, Any]:
    """A round of 15 decisions in one group, the pipeline's default batching."""
    model = load(dtype)
    chats = table_prompts(GROUP)

    async def round_inline() -> list[Decision]:
        asyncio.get_running_loop().set_default_executor(_InlineExecutor())
        return await decide_in_groups(model, chats, GROUP)

    decided = asyncio.run(round_inline())
    (prefix,) = model._prefixes
    flops = 2 * linear_parameters(model.model) * tokens_run(model, decided, len(prefix))
    vocabulary = model.model.get_output_embeddings().weight.shape[0]
    return with_matrix_rate(split(lambda: asyncio.run(round_inline()), vocabulary), flops)


def update_rows(
    dtype: str, rows: int, **changes: Any
) -> tuple[TorchGRPOTrainer, list[tuple[TrainInputs, Choice]]]:
    """A fresh trainer and the first ``rows`` rows of a real step, every trajectory trainable.

    Args:
        dtype: The base model's dtype.
        rows: The rows to return.
        **changes: Settings of the benchmark's run to change (``bench_run``).

    Returns:
        The trainer, in training mode, and each row's inputs with its choice.
    """
    run = bench_run(groups_per_step=1, episodes_per_group=3, **changes)
    base = {**BASE, "dtype": dtype}
    trainer = TorchGRPOTrainer(MODEL_DIR, run, base)
    tables = step_rollouts(trainer, run)
    groups = all_trainable(tables["episodes"], tables["transcripts"], run)
    random.seed(0)
    packed = trainer.rows(groups)
    inputs = [trainer.row(packed.packed, index) for index in range(rows)]
    trainer.model.train()
    return trainer, list(zip(inputs, packed.choices[:rows], strict=True))


def update(dtype: str, rows: int) -> dict[str, Any]:
    """``rows`` optimizer steps of a real step's rows, after one unprofiled warm-up row."""
    trainer, (first, *rows_and_choices) = update_rows(dtype, rows + 1)
    trainer._step(*first)
    vocabulary = trainer.model.get_output_embeddings().weight.shape[0]

    ran: list[int] = []

    def steps() -> None:
        ran.clear()
        for row, choice in rows_and_choices:
            ran.append(trainer._step(row, choice)[3])

    result = split(steps, vocabulary)
    # A forward pass and the gradient with respect to the activations, as bench_train.py
    # counts (the base weights are frozen; LoRA's products are left out).
    result = with_matrix_rate(result, 4 * linear_parameters(trainer.model) * sum(ran))
    return {**result, "rows": rows, "tokens_per_row": sum(ran) / rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default=BASE["dtype"], choices=("bfloat16", "float32"))
    parser.add_argument("--rows", type=int, default=4, help="update rows to profile")
    args = parser.parse_args()
    prepare_model(SOURCE, MODEL_DIR)
    computes = compute_dtype(args.dtype, "cpu")
    results = {"decisions": decisions(args.dtype), "update": update(args.dtype, args.rows)}
    peak = matmul_peak(computes)
    for result in results.values():
        result["share_of_peak"] = result["matrix_flops"] / result["seconds_plain"] / peak
    computes_in = str(computes).removeprefix("torch.")
    print(
        f"dtype {args.dtype} (computes in {computes_in}), threads {torch.get_num_threads()}, "
        f"{computes_in} matrix-product peak {peak / 1e9:.0f} GFLOP/s\n"
    )
    print(
        "| path | unprofiled s | share of peak | profiled s | "
        + " | ".join(KINDS)
        + " | matrix GFLOP/s |"
    )
    print("|---" * (5 + len(KINDS)) + "|")
    for path, result in results.items():
        shares = " | ".join(f"{result['share_by_kind'][kind]:.0%}" for kind in KINDS)
        print(
            f"| {path} | {result['seconds_plain']:.2f} | {result['share_of_peak']:.0%} | "
            f"{result['seconds_profiled']:.2f} | {shares} | "
            f"{result['matrix_product_flops_per_s'] / 1e9:.0f} |"
        )
    write_results(
        f"profile_{args.dtype}",
        {"computes_in": computes_in, "peak_flops_per_s": peak, **results},
    )


if __name__ == "__main__":
    main()
