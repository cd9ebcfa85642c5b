"""The circuit breaker: a dead or hung endpoint stops its cell after a few calls, not all of them.

Each cell is played in process (``generate_cell``, as its job plays it) against a loopback
server that refuses connections, one that never answers, or one that fails intermittently.
A cell that stops must stop within about ``stop_after_failures`` calls' worth of attempts,
however many episodes it holds; the intermittent server must never trip the breaker.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from coordgap.agents.generate import generate_cell
from coordgap.agents.runner import CellOutputs
from coordgap.config.play import EnvironmentConfig, ModelSpec
from coordgap.env.observation import PromptTemplates
from coordgap.policies.breaker import EndpointUnavailable
from tests.integration.fault_server import (
    FaultServer,
    api_model_entry,
    dead_endpoint,
    failing,
    hang,
    ok,
)

pytestmark = pytest.mark.integration

PROMPTS = Path(__file__).resolve().parents[2] / "config" / "prompts"
SECRET = "sk-coordgap-breaker-5e2b7d"
KEY_VARIABLE = "COORDGAP_BREAKER_TEST_KEY"
N, ROUNDS, IN_FLIGHT = 3, 5, 2
# Enough episodes that trying each decision would take far longer than the bound.
EPISODES = 20
TIMEOUT_S, MAX_RETRIES, BACKOFF_MAX_S, STOP_AFTER = 0.3, 1, 0.05, 3
# One call's worst case: every attempt waits its timeout, every retry its longest backoff.
CALL_S = (MAX_RETRIES + 1) * TIMEOUT_S + MAX_RETRIES * BACKOFF_MAX_S
# The stop may take stop_after such calls one after another; the rest is start-up (building
# the client, the first connections), which does not grow with the cell.
BOUND_S = STOP_AFTER * CALL_S + 1.5
# What trying every decision of a hung endpoint would cost: each round of each episode waits
# one call, IN_FLIGHT episodes at a time.
UNBROKEN_S = EPISODES / IN_FLIGHT * ROUNDS * (MAX_RETRIES + 1) * TIMEOUT_S


def _env(turn_order: str) -> EnvironmentConfig:
    return EnvironmentConfig.from_dict(
        {
            "protocol": "tools6",
            "turn_order": turn_order,
            "tie_break": "random",
            "rounds": ROUNDS,
            "deadlock_terminal": True,
            "history": 0,
        }
    )


def _outputs(folder: Path) -> CellOutputs:
    return CellOutputs.at(folder / f"n{N}")


def _play(
    base_url: str,
    folder: Path,
    turn_order: str = "simultaneous",
    episodes: int = EPISODES,
    **settings: Any,
) -> tuple[float, EndpointUnavailable | None]:
    """Play the cell against ``base_url``; return the seconds it took and what stopped it."""
    entry = api_model_entry(
        base_url,
        api_key_env=KEY_VARIABLE,
        timeout_s=TIMEOUT_S,
        max_retries=MAX_RETRIES,
        backoff_base_s=0.01,
        backoff_max_s=BACKOFF_MAX_S,
        stop_after_failures=STOP_AFTER,
        max_in_flight=IN_FLIGHT,
    )
    start = time.perf_counter()
    try:
        generate_cell(
            model=ModelSpec.from_dict("dead", entry | settings),
            n=N,
            env=_env(turn_order),
            episodes=episodes,
            base_seed=7,
            first_scenario=0,
            outputs=_outputs(folder),
            templates=PromptTemplates.load(PROMPTS),
            progress=False,
            max_error_share=1.0,
        )
    except EndpointUnavailable as stop:
        return time.perf_counter() - start, stop
    return time.perf_counter() - start, None


def _journalled(folder: Path) -> int:
    return len(list(_outputs(folder).journal.glob("e*.episodes.parquet")))


def _failure_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "no decision after" in r.getMessage()]


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(KEY_VARIABLE, SECRET)
    caplog.set_level(logging.WARNING)


def _assert_names_the_endpoint(stop: EndpointUnavailable | None, base_url: str, kind: str) -> None:
    """The stop names the endpoint, the model, the kind and the count; never the key."""
    assert stop is not None
    message = str(stop)
    assert message.startswith(f"{base_url}, model 'fault-model': {STOP_AFTER} calls in a row")
    # The kind as the client library names it (LangChain wraps openai's errors in its own).
    assert re.search(rf"\({STOP_AFTER} x {kind}\)", message), message
    assert SECRET not in message


def test_a_refused_port_stops_the_cell_after_stop_after_calls(tmp_path, caplog):
    base_url = dead_endpoint()
    # Refused connections fail at once: the backoffs are the whole wait.
    elapsed, stop = _play(base_url, tmp_path, backoff_base_s=BACKOFF_MAX_S)
    _assert_names_the_endpoint(stop, base_url, r"\w*ConnectionError")
    assert elapsed < BOUND_S, elapsed
    # One warning for the kind, not one per decision.
    assert len(_failure_warnings(caplog)) == 1
    assert _journalled(tmp_path) == 0


def test_a_hung_endpoint_stops_the_cell_keeping_finished_episodes(tmp_path, caplog):
    # Two episodes' worth of calls (15 each: 5 rounds of `think` at 3 seats) are answered,
    # then the server accepts every request and never answers.
    per_episode = N * ROUNDS
    quick = IN_FLIGHT * per_episode
    with FaultServer([*[ok("think")] * quick, hang(60.0)]) as server:
        elapsed, stop = _play(server.base_url, tmp_path)
        after_stop = len(server.requests)
        _assert_names_the_endpoint(stop, server.base_url, r"\w*TimeoutError")
        assert elapsed < BOUND_S, elapsed
        assert elapsed < UNBROKEN_S / 10, (elapsed, UNBROKEN_S)
        # No request after the stop: the calls in flight were cancelled, not retried.
        assert after_stop <= quick + IN_FLIGHT * N * (MAX_RETRIES + 1)
        assert len(_failure_warnings(caplog)) == 1
        journalled = _journalled(tmp_path)
        assert 1 <= journalled <= IN_FLIGHT

        # Once the endpoint answers, the rerun plays only the episodes not journalled.
        server.restart([ok("think")])
        _, stop = _play(server.base_url, tmp_path)
        replayed = len(server.requests) - after_stop
    assert stop is None
    assert replayed == (EPISODES - journalled) * per_episode
    table = pl.read_parquet(_outputs(tmp_path).episodes)
    assert table["episode"].to_list() == list(range(EPISODES))
    assert set(table["status"]) == {"ok"}


def test_an_intermittent_endpoint_never_trips_the_breaker(tmp_path, caplog):
    # One decision at a time (seats in turn, one episode in flight), no retries: every third
    # call is answered, so the longest run of unanswered calls is two, one short of the stop.
    script = [failing(503), failing(503), ok("think")]
    episodes = 4
    with FaultServer(script * (episodes * N * ROUNDS)) as server:
        _, stop = _play(
            server.base_url,
            tmp_path,
            turn_order="sequential",
            episodes=episodes,
            max_retries=0,
            max_in_flight=1,
        )
    assert stop is None
    steps = pl.read_parquet(_outputs(tmp_path).steps)
    assert steps.height == episodes * N * ROUNDS
    assert (steps["reason"] == "transport_error").sum() == steps.height * 2 // 3
    # Counted, not logged per call: one warning for the kind, then one at the 10th, ...
    assert len(_failure_warnings(caplog)) == 1
    assert any("10 calls have failed with" in r.getMessage() for r in caplog.records)


def test_the_same_intermittent_endpoint_trips_a_breaker_of_two(tmp_path):
    # The count is of calls in a row: two unanswered calls trip a breaker set to two.
    with FaultServer([failing(503), failing(503), ok("think")]) as server:
        elapsed, stop = _play(
            server.base_url,
            tmp_path,
            turn_order="sequential",
            max_retries=0,
            max_in_flight=1,
            stop_after_failures=2,
        )
        requests = len(server.requests)
    assert stop is not None
    assert "2 calls in a row" in str(stop)
    assert "(stop_after_failures = 2)" in str(stop)
    assert requests == 2
    assert elapsed < BOUND_S
