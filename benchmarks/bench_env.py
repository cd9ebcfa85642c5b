"""Philosopher-actions per second: our ``Table`` against DPBench 0.2.1's ``step``.

Both environments play the same uniformly random action streams from a fresh table, with
deadlocks broken and play continued (``release_all`` / ``resolve_deadlock``), and both check
for deadlock after every round, as an episode does. Ours is timed through its public API:
``Table.resolve_simultaneous`` per round, ``Table.act`` per action in sequential rounds (in
``Table.seat_order()``), ``Table.is_deadlocked`` per round. The like-for-like comparison is
protocol ``dpbench4`` with ``tie_break: lowest_id``; ``tools6`` (default ``random`` tie-break)
is timed for reference and has no DPBench counterpart.

This machine is shared and noisy, so ours and DPBench's blocks alternate (who goes first
alternates too), garbage collection is off inside a block, as in ``timeit``, and the table
reports medians over the blocks.

Usage: ``python benchmarks/bench_env.py [--blocks 15] [--rounds 1000]``. Prints a markdown
table and writes ``benchmarks/results/env.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from dpbench.core.environment import create_initial_state, resolve_deadlock, step
from dpbench.core.types import Action, AgentDecision

from coordgap.env.protocols import TOOLS, Protocol, Tool
from coordgap.env.table import Table, TieBreak, TurnOrder

if TYPE_CHECKING:
    from collections.abc import Callable

RESULTS = Path(__file__).resolve().parent / "results" / "env.json"
SIZES = (5, 15)
TARGET_RATIO = 10.0
_DPBENCH_ACTION = {
    Tool.GRAB_LEFT: Action.GRAB_LEFT,
    Tool.GRAB_RIGHT: Action.GRAB_RIGHT,
    Tool.RELEASE: Action.RELEASE,
    Tool.WAIT: Action.WAIT,
}


@dataclass
class Row:
    protocol: str
    tie_break: str
    turn_order: str
    n: int
    ours_actions_per_s: float
    dpbench_actions_per_s: float | None
    ratio: float | None
    ours_block_s: list[float]
    dpbench_block_s: list[float] | None


def action_stream(protocol: Protocol, n: int, rounds: int, seed: int) -> list[list[Tool]]:
    """``rounds`` rounds of uniformly random tools of the protocol, one per seat."""
    tools = TOOLS[protocol]
    picks = np.random.default_rng(seed).integers(len(tools), size=(rounds, n))
    return [[tools[k] for k in row] for row in picks]


def play_ours(
    stream: list[list[Tool]], protocol: Protocol, tie_break: TieBreak, turn_order: TurnOrder
) -> list[int]:
    """Play the stream on a fresh table; return the meals per seat."""
    table = Table(len(stream[0]), protocol, tie_break, np.random.default_rng(0))
    if turn_order is TurnOrder.SIMULTANEOUS:
        for tools in stream:
            table.resolve_simultaneous(tools)
            if table.is_deadlocked():
                table.release_all()
    else:
        act = table.act
        for tools in stream:
            for seat in table.seat_order():
                act(seat, tools[seat])
            if table.is_deadlocked():
                table.release_all()
    return table.meals


def play_dpbench(decisions: list[list[AgentDecision]], mode: str) -> list[int]:
    """Play prepared decisions with DPBench; return the meals per seat."""
    state = create_initial_state(len(decisions[0]))
    for round_ in decisions:
        result = step(state, round_, mode)
        state = result.new_state
        if result.deadlock:
            state = resolve_deadlock(state)
    return [p.meals_eaten for p in state.philosophers]


def timed(play: Callable[[], list[int]]) -> tuple[float, list[int]]:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        meals = play()
        return time.perf_counter() - start, meals
    finally:
        gc.enable()


def bench(
    protocol: Protocol,
    tie_break: TieBreak,
    turn_order: TurnOrder,
    n: int,
    rounds: int,
    blocks: int,
) -> Row:
    stream = action_stream(protocol, n, rounds, seed=n)
    ours = lambda: play_ours(stream, protocol, tie_break, turn_order)  # noqa: E731
    theirs = None
    if protocol is Protocol.DPBENCH4:
        # DPBench applies sequential decisions in list order: list them in our seat order,
        # which under lowest_id is 0..N-1.
        decisions = [
            [AgentDecision(i, _DPBENCH_ACTION[tool]) for i, tool in enumerate(tools)]
            for tools in stream
        ]
        theirs = lambda: play_dpbench(decisions, turn_order.value)  # noqa: E731
    ours_s: list[float] = []
    theirs_s: list[float] = []
    for block in range(blocks):
        order = [(ours, ours_s), (theirs, theirs_s)]
        for play, times in order if block % 2 == 0 else order[::-1]:
            if play is None:
                continue
            seconds, meals = timed(play)
            times.append(seconds)
            if play is theirs:
                # Same streams, same semantics: a cheap check that like is compared with like.
                assert meals == play_ours(stream, protocol, tie_break, turn_order), meals
    actions = rounds * n
    ours_rate = actions / statistics.median(ours_s)
    theirs_rate = actions / statistics.median(theirs_s) if theirs_s else None
    return Row(
        protocol=protocol.value,
        tie_break=tie_break.value,
        turn_order=turn_order.value,
        n=n,
        ours_actions_per_s=ours_rate,
        dpbench_actions_per_s=theirs_rate,
        ratio=ours_rate / theirs_rate if theirs_rate else None,
        ours_block_s=ours_s,
        dpbench_block_s=theirs_s or None,
    )


def markdown(rows: list[Row]) -> str:
    lines = [
        "| protocol | tie-break | turn order | N | ours (actions/s) | DPBench (actions/s) "
        "| ours / DPBench |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        theirs = f"{r.dpbench_actions_per_s:,.0f}" if r.dpbench_actions_per_s else "—"
        ratio = f"{r.ratio:.1f}x" if r.ratio else "—"
        lines.append(
            f"| {r.protocol} | {r.tie_break} | {r.turn_order} | {r.n} "
            f"| {r.ours_actions_per_s:,.0f} | {theirs} | {ratio} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=15, help="timed blocks per side")
    parser.add_argument("--rounds", type=int, default=1000, help="rounds per block")
    args = parser.parse_args()
    start = time.perf_counter()
    rows = [
        bench(protocol, tie_break, turn_order, n, args.rounds, args.blocks)
        for protocol, tie_break in (
            (Protocol.DPBENCH4, TieBreak.LOWEST_ID),
            (Protocol.TOOLS6, TieBreak.RANDOM),
        )
        for turn_order in TurnOrder
        for n in SIZES
    ]
    print(markdown(rows))
    ratios = [r.ratio for r in rows if r.ratio is not None]
    print(
        f"\nmin ratio {min(ratios):.1f}x (target ≥ {TARGET_RATIO:.0f}x); "
        f"{time.perf_counter() - start:.1f} s"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "philosopher-actions per second, coordgap Table vs DPBench step",
                "python": platform.python_version(),
                "machine": platform.machine(),
                "dpbench": version("dpbench"),
                "blocks": args.blocks,
                "rounds_per_block": args.rounds,
                "statistic": "median over blocks",
                "target_ratio": TARGET_RATIO,
                "min_ratio": min(ratios),
                "rows": [asdict(r) for r in rows],
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
