"""Orchestration overhead per decision: LangGraph graphs + environment + records, N = 15.

A scripted policy (random) decides instantly, so the time per decision is what the agent
machinery itself costs. Three layers, interleaved in repeated blocks (this machine is noisy):

* ``plain loop``: the reference loop, environment + recorder only;
* ``graphs``: the same episodes through the philosopher and table graphs;
* ``runner``: the whole cell runner, graphs plus the per-episode journal writes and the merge.

Target: runner ≤ 2 ms per decision. Writes ``benchmarks/results/orchestration.json``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import polars as pl

from coordgap.agents.graphs import play_episode_graph
from coordgap.agents.runner import Cell, CellOutputs, run_cell
from coordgap.config.play import EnvironmentConfig, ModelSpec
from coordgap.data import EpisodeSeeds
from coordgap.episodes import play_episode
from coordgap.policies.adapters import ScriptedAgentPolicy
from coordgap.policies.scripted import make_scripted_policy

N = 15
EPISODES = 40
BLOCKS = 5
ENV = EnvironmentConfig.from_dict(
    {
        "protocol": "tools6",
        "turn_order": "simultaneous",
        "tie_break": "random",
        "rounds": 5,
        "deadlock_terminal": True,
        "history": 0,
    }
)
MODEL = ModelSpec.from_dict("random", {"kind": "scripted", "policy": "random"})


def _policy(n, seed, rng):
    return ScriptedAgentPolicy(make_scripted_policy(MODEL.policy, n, ENV.protocol, rng))


def plain_loop() -> int:
    decisions = 0
    for seed in range(EPISODES):
        table_rng, policy_rng = EpisodeSeeds.derive(0, seed, 0, "test").generators()
        policy = make_scripted_policy(MODEL.policy, N, ENV.protocol, policy_rng)
        decisions += play_episode(ENV, N, policy, table_rng).row["decisions"]
    return decisions


def graphs() -> int:
    async def go() -> int:
        decisions = 0
        for seed in range(EPISODES):
            table_rng, policy_rng = EpisodeSeeds.derive(0, seed, 0, "test").generators()
            log = await play_episode_graph(ENV, N, _policy(N, seed, policy_rng), table_rng)
            decisions += log.row["decisions"]
        return decisions

    return asyncio.run(go())


def runner() -> int:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        outputs = CellOutputs(out / "n.parquet", out / "n.steps.parquet", out / "n.t.parquet")
        cell = Cell("random", N, ENV, EPISODES, 1, 0, MODEL.settings())
        asyncio.run(run_cell(cell, outputs, _policy, max_in_flight=1, progress=False))
        return int(pl.read_parquet(outputs.episodes)["decisions"].sum())


def main() -> None:
    layers = {"plain loop": plain_loop, "graphs": graphs, "runner": runner}
    samples: dict[str, list[float]] = {name: [] for name in layers}
    for _ in range(BLOCKS):
        for name, layer in layers.items():
            start = time.perf_counter()
            decisions = layer()
            samples[name].append((time.perf_counter() - start) / decisions * 1e3)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print(f"| layer (N={N}, scripted) | ms per decision (median of {BLOCKS}) |")
    print("| --- | --- |")
    for name, value in medians.items():
        print(f"| {name} | {value:.3f} |")
    target = "met" if medians["runner"] <= 2.0 else "MISSED"
    print(f"\nrunner overhead {medians['runner']:.3f} ms per decision: target 2 ms {target}")
    out = Path(__file__).parent / "results" / "orchestration.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"n": N, "ms_per_decision": medians, "samples": samples}, indent=2))


if __name__ == "__main__":
    main()
