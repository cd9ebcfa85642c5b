"""Decisions per second against a model server of fixed latency: concurrent vs DPBench's way.

The server is the fault server of the integration tests in fixed-latency mode (every answer is a
valid tool call after the latency), run in its own process so that it does not share this
process's interpreter lock. Two clients play against it:

* ``coordgap``: ``OpenAICompatible.decide`` (LangChain ``ChatOpenAI``), ``--in-flight``
  decisions at a time (``asyncio.gather`` over ``--decisions`` calls, bounded by a semaphore).
  The ideal is ``in_flight / latency`` decisions per second; the target is 90 % of it at 100 ms.
  One untimed round of ``--in-flight`` calls first opens the pooled connections.
* ``dpbench``: DPBench 0.2.1's own runner (``Benchmark.run``), whose philosopher nodes call the
  model one after another, with the usual ``model_fn``: a blocking ``openai.OpenAI`` chat
  completion per decision. Every reply is a tool call without text, which DPBench reads as
  ``wait``, so nobody deadlocks and an episode of ``T`` steps makes ``5 T`` calls. It runs at
  the first latency only.

Each row also reports the client's CPU time per decision (this process, all threads): one
event loop cannot exceed ``1000 / cpu_ms`` decisions per second, whatever the concurrency. A
long latency (1000 ms by default) shows the concurrency itself; 100 ms shows that ceiling.

Usage: ``python benchmarks/bench_concurrency.py [--latency-ms 100 1000] [--in-flight 64]
[--decisions 1280] [--dpbench-decisions 30]``. Prints a markdown table and writes
``benchmarks/results/concurrency.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai
from dpbench import Benchmark

from coordgap.env.protocols import TOOLS, Protocol
from coordgap.policies.remote import KEYLESS_PLACEHOLDER, OpenAICompatible
from tests.integration.processes import stop

if TYPE_CHECKING:
    from collections.abc import Iterator

    from coordgap.policies.base import NoCallReason

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "concurrency.json"
PHILOSOPHERS = 5
SYSTEM = "You are {philosopher_name}, one of {num_philosophers} philosophers at a round table."
DECISION = (
    "You are {state} and have eaten {meals_eaten} meals. Left fork: {left_fork_status}. "
    "Right fork: {right_fork_status}. You hold {holding_status}. Answer with ACTION: <action>."
)
MESSAGES = [
    {"role": "system", "content": SYSTEM.format(philosopher_name="P0", num_philosophers=5)},
    {"role": "user", "content": "Both forks are free and you hold nothing. Call one tool."},
]


@contextmanager
def fault_server(latency_ms: float) -> Iterator[str]:
    """Run the fixed-latency fault server in a child process; yield its base URL."""
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.fault_server", "--latency-ms", str(latency_ms)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        yield f"http://127.0.0.1:{int(server.stdout.readline())}/v1"
    finally:
        stop(server)


async def run_coordgap(base_url: str, decisions: int, in_flight: int) -> dict[str, Any]:
    """Time ``decisions`` calls of ``OpenAICompatible.decide``, ``in_flight`` at a time."""
    model = OpenAICompatible(model="bench", base_url=base_url, timeout_s=30.0, max_retries=0)
    tools = TOOLS[Protocol.TOOLS6]
    gate = asyncio.Semaphore(in_flight)

    async def one(seed: int) -> NoCallReason | None:
        async with gate:
            return (await model.decide(MESSAGES, tools, seed)).no_call_reason

    await asyncio.gather(*(one(seed) for seed in range(in_flight)))
    start, cpu = time.perf_counter(), time.process_time()
    reasons = await asyncio.gather(*(one(seed) for seed in range(decisions)))
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    if any(reasons):
        raise RuntimeError(f"some decisions failed: {sorted(set(map(str, reasons)))}")
    return {"decisions": decisions, "in_flight": in_flight, "wall_s": wall_s, "cpu_s": cpu_s}


def run_dpbench(base_url: str, decisions: int) -> dict[str, Any]:
    """Time DPBench's runner making ``decisions`` blocking calls, one after another."""
    client = openai.OpenAI(base_url=base_url, api_key=KEYLESS_PLACEHOLDER, max_retries=0)
    calls = 0

    def model_fn(system: str, user: str) -> str:
        nonlocal calls
        calls += 1
        reply = client.chat.completions.create(
            model="bench",
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        )
        return reply.choices[0].message.content or ""

    model_fn(SYSTEM, DECISION)  # untimed: opens the connection, as our warm-up round does
    calls = 0
    start, cpu = time.perf_counter(), time.process_time()
    Benchmark.run(
        model_fn,
        SYSTEM,
        DECISION,
        philosophers=PHILOSOPHERS,
        episodes=1,
        max_timesteps=decisions // PHILOSOPHERS,
        seed=0,
    )
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    if calls != decisions:
        raise RuntimeError(f"DPBench made {calls} calls, expected {decisions}")
    return {"decisions": decisions, "in_flight": 1, "wall_s": wall_s, "cpu_s": cpu_s}


def finish(row: dict[str, Any], client: str, latency_ms: float) -> dict[str, Any]:
    """Add the client, the latency and the derived rates to a timed row."""
    row["per_s"] = row["decisions"] / row["wall_s"]
    row["ideal_per_s"] = row["in_flight"] / (latency_ms / 1000)
    row["cpu_ms_per_decision"] = 1000 * row["cpu_s"] / row["decisions"]
    return {
        "client": client,
        "latency_ms": latency_ms,
        **row,
        "of_ideal": row["per_s"] / row["ideal_per_s"],
        "cpu_ceiling_per_s": 1000 / row["cpu_ms_per_decision"],
    }


def markdown(rows: list[dict[str, Any]], speedup: float) -> str:
    """Render the results as a markdown table."""
    lines = [
        "| client | latency ms | decisions | in flight | wall s | decisions/s | ideal/s "
        "| of ideal | client CPU ms/decision | CPU ceiling/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['client']} | {r['latency_ms']:.0f} | {r['decisions']} | {r['in_flight']} "
        f"| {r['wall_s']:.2f} | {r['per_s']:.1f} | {r['ideal_per_s']:.0f} | {r['of_ideal']:.3f} "
        f"| {r['cpu_ms_per_decision']:.2f} | {r['cpu_ceiling_per_s']:.0f} |"
        for r in rows
    ]
    lines.append(f"\ncoordgap / DPBench decisions per second: **{speedup:.1f}x**")
    return "\n".join(lines)


def main() -> None:
    """Run both clients against the servers, print the table and write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[100.0, 1000.0])
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--decisions", type=int, default=1280)
    parser.add_argument("--dpbench-decisions", type=int, default=30)
    args = parser.parse_args()
    if args.dpbench_decisions % PHILOSOPHERS:
        parser.error(f"--dpbench-decisions must be a multiple of {PHILOSOPHERS}")
    rows = []
    for latency_ms in args.latency_ms:
        with fault_server(latency_ms) as base_url:
            ours = asyncio.run(run_coordgap(base_url, args.decisions, args.in_flight))
            rows.append(finish(ours, "coordgap", latency_ms))
            if latency_ms == args.latency_ms[0]:
                theirs = run_dpbench(base_url, args.dpbench_decisions)
                rows.append(finish(theirs, "dpbench", latency_ms))
    speedup = rows[0]["per_s"] / rows[1]["per_s"]
    print(markdown(rows, speedup))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    environment = {
        "cpus": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        **{package: version(package) for package in ("langchain-openai", "openai", "dpbench")},
    }
    results = {
        "target_of_ideal": 0.9,
        "rows": rows,
        "speedup_at_first_latency": speedup,
        "environment": environment,
    }
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
