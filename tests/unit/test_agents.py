"""The LangGraph agents and the episode runner."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging

import polars as pl
import pytest

from coordgap.agents.graphs import philosopher_graph, play_episode_graph, table_graph
from coordgap.agents.runner import Cell, CellErrors, CellOutputs, merge_journal, run_cell
from coordgap.config.play import EnvironmentConfig, ModelSpec, ScriptedPolicy
from coordgap.data import EpisodeSeeds
from coordgap.env.table import TurnOrder
from coordgap.episodes import play_episode
from coordgap.policies.adapters import ScriptedAgentPolicy
from coordgap.policies.base import Decision, NoCallReason
from coordgap.policies.scripted import make_scripted_policy

pytestmark = pytest.mark.unit


def _env(protocol: str, turn_order: str, history: int = 1) -> EnvironmentConfig:
    return EnvironmentConfig.from_dict(
        {
            "protocol": protocol,
            "turn_order": turn_order,
            "tie_break": "random",
            "rounds": 5,
            "deadlock_terminal": turn_order == "simultaneous",
            "history": history,
        }
    )


@pytest.mark.parametrize(
    ("protocol", "turn_order", "policy"),
    list(itertools.product(["tools6", "dpbench4"], ["simultaneous", "sequential"], ScriptedPolicy)),
)
def test_graphs_play_the_reference_loop_episodes(protocol, turn_order, policy):
    env = _env(protocol, turn_order)
    for seed in range(6):
        table_rng, policy_rng = EpisodeSeeds.derive(0, seed, 0, "test").generators()
        reference = play_episode(
            env, 6, make_scripted_policy(policy, 6, env.protocol, policy_rng), table_rng
        )
        table_rng, policy_rng = EpisodeSeeds.derive(0, seed, 0, "test").generators()
        agent = ScriptedAgentPolicy(make_scripted_policy(policy, 6, env.protocol, policy_rng))
        graphed = asyncio.run(play_episode_graph(env, 6, agent, table_rng))
        assert graphed.row == reference.row
        assert graphed.steps == reference.steps


def test_graphs_have_the_documented_shape():
    assert set(philosopher_graph().get_graph().nodes) == {"__start__", "decide", "act", "__end__"}
    simultaneous = set(table_graph(TurnOrder.SIMULTANEOUS).get_graph().nodes)
    assert {"observe", "decide", "resolve", "check"} <= simultaneous
    assert "resolve" not in table_graph(TurnOrder.SEQUENTIAL).get_graph().nodes


class _CountingPolicy:
    """Counts concurrent decisions: proves the philosophers of a round decide together."""

    def __init__(self, inner: ScriptedAgentPolicy, state: dict[str, int]) -> None:
        self._inner = inner
        self._state = state

    async def adecide(self, observation):
        self._state["now"] += 1
        self._state["peak"] = max(self._state["peak"], self._state["now"])
        await asyncio.sleep(0.001)
        self._state["now"] -= 1
        return await self._inner.adecide(observation)


def _counting_factory(env: EnvironmentConfig, state: dict[str, int]):
    def make(n, seed, rng):
        policy = make_scripted_policy(ScriptedPolicy.RANDOM, n, env.protocol, rng)
        return _CountingPolicy(ScriptedAgentPolicy(policy), state)

    return make


def _cell(env: EnvironmentConfig, episodes: int) -> Cell:
    model = ModelSpec.from_dict("random", {"kind": "scripted", "policy": "random"})
    return Cell("random", 4, env, episodes, 5, 0, model.settings())


def _outputs(folder) -> CellOutputs:
    return CellOutputs(folder / "n4.parquet", folder / "n4.steps.parquet", folder / "n4.t.parquet")


def test_runner_decides_concurrently_within_and_across_episodes(tmp_path):
    env = _env("tools6", "simultaneous", history=0)
    state = {"now": 0, "peak": 0}
    factory = _counting_factory(env, state)
    asyncio.run(run_cell(_cell(env, 6), _outputs(tmp_path), factory, 3, False))
    # 3 episodes in flight x 4 philosophers deciding at once.
    assert state["peak"] == 12
    assert pl.read_parquet(tmp_path / "n4.parquet")["episode"].to_list() == list(range(6))


def test_runner_output_does_not_depend_on_concurrency(tmp_path):
    env = _env("tools6", "simultaneous", history=0)
    for in_flight in (1, 4):
        folder = tmp_path / f"in_flight_{in_flight}"
        factory = _counting_factory(env, {"now": 0, "peak": 0})
        asyncio.run(run_cell(_cell(env, 8), _outputs(folder), factory, in_flight, False))
    for name in ("n4.parquet", "n4.steps.parquet"):
        assert (tmp_path / "in_flight_1" / name).read_bytes() == (
            tmp_path / "in_flight_4" / name
        ).read_bytes()


def test_a_cell_left_unmerged_keeps_its_journal_and_resumes_without_replaying(tmp_path):
    # A run's validation: each checkpoint's cell journals outside the job's output folder and
    # is merged into it only when every cell is done; a rerun of a finished cell plays nothing.
    env = _env("tools6", "simultaneous", history=0)
    cell = dataclasses.replace(_cell(env, 2), checkpoint="step_0002")
    journal = CellOutputs.at(tmp_path / "validation.partial" / "step_0002")
    factory = _counting_factory(env, {"now": 0, "peak": 0})
    asyncio.run(run_cell(cell, journal, factory, 1, False, merge=False))
    assert journal.journal.is_dir()
    assert not journal.episodes.exists()

    def refuse(n, seed, rng):
        raise AssertionError("a journalled episode was played again")

    asyncio.run(run_cell(cell, journal, refuse, 1, False, merge=False))
    outputs = CellOutputs.at(tmp_path / "validation" / "step_0002")
    outputs.episodes.parent.mkdir()
    merge_journal(cell, outputs, journal=journal)
    episodes = pl.read_parquet(outputs.episodes)
    assert episodes["checkpoint"].to_list() == ["step_0002"] * 2
    assert episodes["episode"].to_list() == [0, 1]
    assert set(pl.read_parquet(outputs.steps)["episode"]) == {0, 1}
    assert not journal.journal.exists()


def test_runner_discards_a_journal_written_with_other_settings(tmp_path):
    env = _env("tools6", "simultaneous", history=0)
    outputs = _outputs(tmp_path)
    outputs.journal.mkdir()
    (outputs.journal / "fingerprint.json").write_text(json.dumps({"other": "settings"}))
    # A stale part that must not survive: it claims episode 0 with impossible content.
    stale = pl.DataFrame({"episode": [0]})
    stale.write_parquet(outputs.journal / "e000000.episodes.parquet")
    factory = _counting_factory(env, {"now": 0, "peak": 0})
    asyncio.run(run_cell(_cell(env, 3), outputs, factory, 1, False))
    episodes = pl.read_parquet(outputs.episodes)
    assert episodes["episode"].to_list() == [0, 1, 2]
    assert episodes["model"].to_list() == ["random"] * 3
    assert not outputs.journal.exists()


class _UnreachablePolicy:
    """Every call fails in transport, as against an endpoint that is down."""

    async def adecide(self, observation):
        return Decision(
            tool=None, no_call_reason=NoCallReason.TRANSPORT_ERROR, raw="APIConnectionError"
        )


def _factory_failing(env: EnvironmentConfig, failing: set[int], made: list[int]):
    """Scripted policies, but the episodes made in the places ``failing`` names fail."""
    healthy = _counting_factory(env, {"now": 0, "peak": 0})

    def make(n, seed, rng):
        made.append(seed)
        if len(made) - 1 in failing:
            return _UnreachablePolicy()
        return healthy(n, seed, rng)

    return make


def test_a_cell_with_too_many_error_episodes_fails_and_its_rerun_replays_only_them(tmp_path):
    env = _env("tools6", "simultaneous", history=0)
    outputs = _outputs(tmp_path)
    made: list[int] = []
    # One episode in flight: policies are made in episode order, so 1 and 4 fail.
    factory = _factory_failing(env, {1, 4}, made)
    with pytest.raises(CellErrors, match=r"2 of 6 episodes ended in error") as raised:
        asyncio.run(run_cell(_cell(env, 6), outputs, factory, 1, False, max_error_share=0.2))
    assert raised.value.errors == 2
    # Nobody holds a fork, so no deadlock ends an error episode: 5 rounds x 4 failed calls.
    assert raised.value.kinds == {"APIConnectionError": 40}
    assert "failed calls: 40 x APIConnectionError" in str(raised.value)
    assert not outputs.episodes.exists()
    kept = sorted(p.name for p in outputs.journal.glob("e*.episodes.parquet"))
    assert kept == [f"e{i:06d}.episodes.parquet" for i in (0, 2, 3, 5)]

    # The endpoint is back: the rerun plays exactly the two episodes that failed.
    replayed: list[int] = []
    asyncio.run(
        run_cell(_cell(env, 6), outputs, _factory_failing(env, set(), replayed), 1, False, 0.2)
    )
    assert replayed == [made[1], made[4]]
    episodes = pl.read_parquet(outputs.episodes)
    assert episodes["status"].to_list() == ["ok"] * 6
    # The same cell played at once, without failures, gives the same tables.
    clean = _outputs(tmp_path / "clean")
    asyncio.run(run_cell(_cell(env, 6), clean, _factory_failing(env, set(), []), 1, False))
    assert pl.read_parquet(clean.episodes).equals(episodes)


def test_a_cell_within_max_error_share_is_written_with_its_error_episodes(tmp_path, caplog):
    env = _env("tools6", "simultaneous", history=0)
    outputs = _outputs(tmp_path)
    factory = _factory_failing(env, {1, 4}, [])
    with caplog.at_level(logging.INFO, logger="coordgap.agents.runner"):
        asyncio.run(run_cell(_cell(env, 6), outputs, factory, 1, False, max_error_share=0.5))
    episodes = pl.read_parquet(outputs.episodes)
    assert episodes["status"].to_list() == ["ok", "error", "ok", "ok", "error", "ok"]
    # The job's log closes with what the cell holds.
    closing = caplog.records[-1].getMessage()
    assert closing.startswith(f"{_cell(env, 6).label}: done, 6 episodes (6 played in ")
    assert closing.endswith(
        f"0 resumed), 2 errors, {episodes['decisions'].sum()} decisions, "
        f"{episodes['meals_total'].sum()} meals"
    )
