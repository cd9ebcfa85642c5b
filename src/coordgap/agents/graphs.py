"""LangGraph agents: one graph per philosopher (decide -> act), one graph per table.

A philosopher graph wraps any policy: ``decide`` asks the policy for a tool call (a scripted
rule, or an LLM with the protocol's tools bound) and ``act`` applies it to the table when the
philosopher moves alone (sequential rounds). In simultaneous rounds nobody may act before all
have decided, so ``act`` leaves the call for the table graph's ``resolve`` node.

The table graph drives the rounds: ``observe`` opens a round, ``decide`` runs the philosopher
graphs (concurrently in simultaneous mode, in seat order in sequential mode), ``resolve``
applies simultaneous calls, and ``check`` looks for a deadlock and the end of the episode.

Graph state carries live objects (the table, the policy, the recorder). The graphs run
without a checkpointer, so nothing is serialised; resuming happens per episode in the runner.
"""

from __future__ import annotations

import asyncio
from functools import cache
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from langgraph.graph import END, START, StateGraph

# LangGraph evaluates the state annotations at run time, so their types are real imports.
from coordgap.env.observation import Observation  # noqa: TC001
from coordgap.env.table import Result, Table, TurnOrder
from coordgap.episodes import EpisodeRecorder
from coordgap.policies.base import AsyncPolicy, Decision  # noqa: TC001

if TYPE_CHECKING:
    from collections.abc import Awaitable

    import numpy as np
    from langgraph.graph.state import CompiledStateGraph

    from coordgap.config.play import EnvironmentConfig
    from coordgap.episodes import EpisodeLog

T = TypeVar("T")


async def gather_or_cancel(*awaitables: Awaitable[T]) -> list[T]:
    """Await all of ``awaitables``; when one raises, cancel the rest before raising it.

    ``asyncio.gather`` leaves the others running when one raises: calls to an endpoint that
    stopped the job (``EndpointUnavailable``) would go on waiting on it, and episodes go on
    playing, until the event loop closes.

    Returns:
        Their results, in order.
    """
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class PhilosopherState(TypedDict):
    """State of one philosopher's decision."""

    observation: Observation
    policy: AsyncPolicy
    table: Table
    acts_alone: bool
    decision: Decision | None
    result: Result | None


class TableState(TypedDict):
    """State of one episode."""

    recorder: EpisodeRecorder
    policy: AsyncPolicy
    decisions: list[Decision]
    done: bool


async def _decide(state: PhilosopherState) -> dict[str, Any]:
    return {"decision": await state["policy"].adecide(state["observation"])}


def _act(state: PhilosopherState) -> dict[str, Any]:
    if not state["acts_alone"]:
        return {}
    seat = state["observation"].philosopher
    return {"result": state["table"].act(seat, state["decision"].tool)}


@cache
def philosopher_graph() -> CompiledStateGraph:
    """The compiled philosopher graph (decide -> act), shared by every seat."""
    graph = StateGraph(PhilosopherState)
    graph.add_node("decide", _decide)
    graph.add_node("act", _act)
    graph.add_edge(START, "decide")
    graph.add_edge("decide", "act")
    graph.add_edge("act", END)
    return graph.compile()


def _philosopher_input(
    state: TableState, observation: Observation, acts_alone: bool
) -> PhilosopherState:
    return {
        "observation": observation,
        "policy": state["policy"],
        "table": state["recorder"].table,
        "acts_alone": acts_alone,
        "decision": None,
        "result": None,
    }


def _observe(state: TableState) -> dict[str, Any]:
    state["recorder"].start_round()
    return {}


async def _decide_together(state: TableState) -> dict[str, Any]:
    recorder = state["recorder"]
    # Every observation is taken before any decision is made: all see the same table.
    inputs = [
        _philosopher_input(state, recorder.observe(seat), acts_alone=False)
        for seat in range(recorder.table.n)
    ]
    outputs = await gather_or_cancel(*(philosopher_graph().ainvoke(i) for i in inputs))
    return {"decisions": [out["decision"] for out in outputs]}


def _resolve(state: TableState) -> dict[str, Any]:
    recorder = state["recorder"]
    decisions = state["decisions"]
    results = recorder.table.resolve_simultaneous([d.tool for d in decisions])
    for seat, (decision, result) in enumerate(zip(decisions, results, strict=True)):
        recorder.record(seat, seat, decision, result)
    return {}


async def _take_turns(state: TableState) -> dict[str, Any]:
    recorder = state["recorder"]
    for turn, seat in enumerate(recorder.table.seat_order()):
        out = await philosopher_graph().ainvoke(
            _philosopher_input(state, recorder.observe(seat), acts_alone=True)
        )
        recorder.record(turn, seat, out["decision"], out["result"])
    return {}


def _check(state: TableState) -> dict[str, Any]:
    return {"done": state["recorder"].end_round()}


def _next(state: TableState) -> str:
    return END if state["done"] else "observe"


@cache
def table_graph(turn_order: TurnOrder) -> CompiledStateGraph:
    """The compiled table graph for a turn order (observe -> decide [-> resolve] -> check)."""
    graph = StateGraph(TableState)
    graph.add_node("observe", _observe)
    graph.add_node("check", _check)
    graph.add_edge(START, "observe")
    if turn_order is TurnOrder.SIMULTANEOUS:
        graph.add_node("decide", _decide_together)
        graph.add_node("resolve", _resolve)
        graph.add_edge("observe", "decide")
        graph.add_edge("decide", "resolve")
        graph.add_edge("resolve", "check")
    else:
        graph.add_node("decide", _take_turns)
        graph.add_edge("observe", "decide")
        graph.add_edge("decide", "check")
    graph.add_conditional_edges("check", _next, ["observe", END])
    return graph.compile()


async def play_episode_graph(
    env: EnvironmentConfig, n: int, policy: AsyncPolicy, table_rng: np.random.Generator
) -> EpisodeLog:
    """Play one episode through the table graph.

    Args:
        env: The table rules.
        n: Number of philosophers.
        policy: Decides for one philosopher per call; fresh per episode.
        table_rng: The table's generator (tie-breaks, sequential order).

    Returns:
        The episode's row (without identity columns), step rows and transcripts.
    """
    recorder = EpisodeRecorder(env, Table(n, env.protocol, env.tie_break, table_rng))
    state: TableState = {"recorder": recorder, "policy": policy, "decisions": [], "done": False}
    # Four nodes per round at most; LangGraph counts every node run against this limit.
    await table_graph(env.turn_order).ainvoke(state, {"recursion_limit": 4 * env.rounds + 8})
    return recorder.finish()
