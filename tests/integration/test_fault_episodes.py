"""Whole episodes against a misbehaving OpenAI-compatible server, through the real pipeline.

The server answers with a rotating mix of valid calls, prose, empty replies, two calls,
hallucinated tools, invalid JSON arguments, 429 with Retry-After, 500s, hangs past the client
timeout, a proxy's HTML error page and a completion without choices. Every episode must
complete or be marked ``error``; no malformed reply may be counted as an action; and the API
key must appear in no output and no log. A refused key stops its own cell at once, and the
other cells go on (the default profile's ``keep-going``). A cell of error episodes (an
endpoint that is down) fails its job instead of passing as a result.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import polars as pl
import pytest

from coordgap.env.protocols import TOOLS, Protocol
from coordgap.policies.base import NoCallReason
from tests.conftest import copy_workflow, run
from tests.integration.fault_server import (
    FaultServer,
    api_model_entry,
    dead_endpoint,
    empty,
    failing,
    fixed_latency,
    hang,
    no_choices,
    ok,
    proxy_error_page,
    rate_limited,
    text_only,
    two_calls,
    unauthorized,
)

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRET = "sk-coordgap-test-7f3a9c1e5b"
KEY_VARIABLE = "COORDGAP_FAULT_TEST_KEY"

ROTATION = [
    ok("pick_up_left"),
    text_only(),
    ok("fly_to_the_moon"),
    failing(500),
    ok("pick_up_right"),
    empty(),
    rate_limited("0"),
    ok("eat", '{"fork": '),
    two_calls(),
    hang(3.0),
    ok("think"),
    ok("put_down_left", '{"fork": 1}'),
    proxy_error_page(),
    no_choices(),
]


def _config(tiny_config: dict, base_url: str, **settings: Any) -> dict:
    """One ``faulty`` openai model at N=3; ``settings`` override its entry."""
    config = dict(tiny_config)
    config["models"] = {
        "faulty": api_model_entry(
            base_url, model="faulty-model", api_key_env=KEY_VARIABLE, **settings
        )
    }
    # These tests are about each decision: their cells keep every error episode.
    config["experiment"] = {
        **config["experiment"],
        "sizes": [3],
        "episodes_per_cell": 6,
        "max_error_share": 1.0,
    }
    config["analysis"] = {
        **tiny_config["analysis"],
        "comparisons": [],
        "timeline": {"model": "faulty", "n": 3, "episode": 0},
    }
    return config


def _assert_steps_agree(episodes: pl.DataFrame, steps: pl.DataFrame) -> None:
    """Each episode's counts are its steps' counts, and only transport errors make ``error``."""
    per_episode = steps.group_by("episode").agg(
        decisions=pl.len(),
        no_call=(pl.col("outcome") == "no_call").sum(),
        transport=(pl.col("reason") == "transport_error").sum(),
    )
    checked = episodes.join(per_episode, on="episode", suffix="_steps")
    assert checked.height == episodes.height
    assert (checked["decisions"] == checked["decisions_steps"]).all()
    assert (checked["no_call"] == checked["no_call_steps"]).all()
    assert (checked["actions"] + checked["no_call"] == checked["decisions"]).all()
    # An episode with a transport failure is marked error, and only such episodes are.
    assert ((checked["transport"] > 0) == (checked["status"] == "error")).all()


def _assert_secret_nowhere(project: Path, *texts: str) -> None:
    """The key is in no file of the project, no string column of a table and no text given."""
    for text in texts:
        assert SECRET not in text
    for path in project.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    for path in project.rglob("*.parquet"):
        frame = pl.read_parquet(path)
        for column in frame.columns:
            if frame[column].dtype == pl.String:
                assert not frame[column].str.contains(SECRET, literal=True).any(), (path, column)


# The log of the one cell these tests run through Snakemake.
CELL_LOG = "logs/generate_api_episodes/faulty/n3.log"


def _assert_ends_with_its_message(output: str, failure: str, message: str) -> None:
    """The job ended on an expected failure: its class, its message and its log's path, and no
    traceback (neither on the job's stderr nor in the log Snakemake prints after it)."""
    assert "Traceback" not in output
    assert f"{failure}: {message}" in output
    assert f"The job's log: {CELL_LOG}" in output


def test_faulty_server_episodes_complete_or_fail_and_never_leak_the_key(
    tmp_path, tiny_config, monkeypatch
):
    monkeypatch.setenv(KEY_VARIABLE, SECRET)
    with FaultServer(ROTATION * 40) as server:
        project = copy_workflow(tmp_path / "project", _config(tiny_config, server.base_url))
        run(project, "snakemake", "--cores", "1", "all")
    # The key went to the server, as it should, and nowhere else.
    assert any(SECRET in value for r in server.requests for value in r.headers.values())

    folder = project / "results/episodes/faulty"
    episodes = pl.read_parquet(folder / "n3.parquet")
    steps = pl.read_parquet(folder / "n3.steps.parquet")
    assert episodes["episode"].to_list() == list(range(6))
    assert set(episodes["status"]) <= {"ok", "error"}

    tools = {tool.value for tool in TOOLS[Protocol.TOOLS6]}
    reasons = {reason.value for reason in NoCallReason}
    acted = steps.filter(pl.col("outcome") != "no_call")
    assert set(acted["tool"]) <= tools
    silent = steps.filter(pl.col("outcome") == "no_call")
    assert silent["tool"].null_count() == silent.height
    assert set(silent["reason"]) <= reasons
    # Each malformed shape of the rotation showed up and was recorded as no_call.
    assert {"no_call", "empty", "unknown_tool", "bad_arguments", "several_calls"} <= set(
        silent["reason"]
    )

    _assert_steps_agree(episodes, steps)
    # Every behaviour of the rotation was served, the two malformed replies included.
    assert len(server.requests) > len(ROTATION)

    summary = pl.read_csv(project / "results/stats/summary.csv")
    assert summary["errors"].item() == (episodes["status"] == "error").sum()
    assert summary["episodes"].item() == (episodes["status"] == "ok").sum()

    _assert_secret_nowhere(project)


def test_proxy_pages_and_empty_choices_are_error_episodes_not_a_crash(
    tmp_path, tiny_config, monkeypatch
):
    # The two replies that crashed the job before the boundary checked replies, alternating
    # with valid calls; no retries, so each decision meets exactly one of them.
    monkeypatch.setenv(KEY_VARIABLE, SECRET)
    script = [proxy_error_page(), ok("think"), no_choices(), ok("think")] * 100
    with FaultServer(script) as server:
        config = _config(tiny_config, server.base_url, max_retries=0)
        project = copy_workflow(tmp_path / "project", config)
        run(project, "snakemake", "--cores", "1", "results/episodes/faulty/n3.parquet")

    folder = project / "results/episodes/faulty"
    episodes = pl.read_parquet(folder / "n3.parquet")
    steps = pl.read_parquet(folder / "n3.steps.parquet")
    assert episodes["episode"].to_list() == list(range(6))
    assert set(episodes["status"]) == {"error"}
    _assert_steps_agree(episodes, steps)
    failures = steps.filter(pl.col("reason") == "transport_error")
    assert set(failures["raw"]) == {
        "MalformedReply (HTTP 200: body is not JSON)",
        "MalformedReply (HTTP 200: no choices)",
    }
    assert set(steps.filter(pl.col("outcome") != "no_call")["tool"]) == {"think"}
    _assert_secret_nowhere(project)


def test_a_refused_key_stops_its_cell_in_one_round_and_other_cells_go_on(
    tmp_path, tiny_config, monkeypatch
):
    monkeypatch.setenv(KEY_VARIABLE, SECRET)
    with FaultServer([unauthorized()]) as server:
        config = _config(tiny_config, server.base_url, timeout_s=5.0, max_retries=3)
        config["models"]["silent"] = {"kind": "scripted", "policy": "silent"}
        project = copy_workflow(tmp_path / "project", config)
        # The refused cell first: without keep-going, the silent cell would never start.
        result = run(
            project,
            "snakemake",
            "--cores",
            "1",
            "episodes",
            "--prioritize",
            "results/episodes/faulty/n3.parquet",
            check=False,
        )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    # One round of concurrent calls at most (2 episodes in flight x 3 philosophers), none
    # retried, and no episode played after the refusal.
    assert 1 <= len(server.requests) <= 2 * 3
    assert not (project / "results/episodes/faulty/n3.parquet").exists()
    assert pl.read_parquet(project / "results/episodes/silent/n3.parquet").height == 6
    # The failure is reported with its log, which names the variable and the endpoint.
    log = (project / CELL_LOG).read_text()
    for text in (log, output):
        assert f"check the API key in environment variable {KEY_VARIABLE}" in text
        assert f"{server.base_url} refused the request with HTTP 401" in text
    _assert_ends_with_its_message(
        output, "EndpointAuthError", f"{server.base_url} refused the request with HTTP 401"
    )
    _assert_secret_nowhere(project, output)


def test_a_cell_of_error_episodes_fails_its_job_naming_the_endpoint(
    tmp_path, tiny_config, monkeypatch
):
    monkeypatch.setenv(KEY_VARIABLE, SECRET)
    base_url = dead_endpoint()
    # A breaker that never trips: every decision is tried, and the cell's errors fail it.
    config = _config(tiny_config, base_url, max_retries=0, stop_after_failures=1000)
    config["experiment"]["max_error_share"] = 0.05
    project = copy_workflow(tmp_path / "project", config)
    result = run(
        project, "snakemake", "--cores", "1", "results/episodes/faulty/n3.parquet", check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert not (project / "results/episodes/faulty/n3.parquet").exists()
    log = (project / CELL_LOG).read_text()
    # The final message names the endpoint and the model, not only the warnings above it.
    errors = f"faulty n=3 ({base_url}, model 'faulty-model'): 6 of 6 episodes ended in error"
    assert errors in log
    _assert_ends_with_its_message(output, "CellErrors", errors)
    assert re.search(r"failed calls: \d+ x \w*ConnectionError", log)
    # The first failed call is a warning naming the endpoint and the model; the rest are
    # counted (at the 10th, 100th, ...), not logged one by one.
    assert log.count(f"{base_url}, model 'faulty-model': no decision after 1 attempt(s)") == 1
    assert f"{base_url}, model 'faulty-model': 10 calls have failed with" in log
    # Nothing was kept: a rerun plays all six again.
    journal = project / "results/episodes/faulty/n3.partial"
    assert not list(journal.glob("e*.parquet"))
    _assert_secret_nowhere(project, output)


def test_a_dead_endpoint_stops_its_job_after_a_few_calls(tmp_path, tiny_config, monkeypatch):
    monkeypatch.setenv(KEY_VARIABLE, SECRET)
    base_url = dead_endpoint()
    project = copy_workflow(tmp_path / "project", _config(tiny_config, base_url))
    result = run(
        project, "snakemake", "--cores", "1", "results/episodes/faulty/n3.parquet", check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    log = (project / CELL_LOG).read_text()
    stop = f"{base_url}, model 'faulty-model': 3 calls in a row went unanswered after their retries"
    assert stop in log
    _assert_ends_with_its_message(output, "EndpointUnavailable", stop)
    assert log.count("no decision after") == 1
    _assert_secret_nowhere(project, output)


def test_the_provider_slot_keeps_two_cells_of_one_provider_apart(tmp_path, tiny_config):
    """Two API models on one endpoint share its api_<provider> slot: with the profile's cap at
    one, the second cell's first request comes after the first cell's last; with a cap of two
    (or none) the two cores play both at once and their requests interleave."""
    with FaultServer([fixed_latency(500)]) as server:
        config = _config(tiny_config, server.base_url)
        config["models"] = {
            name: api_model_entry(server.base_url, model=name, episodes_per_cell=2, timeout_s=5)
            for name in ("first", "second")
        }
        config["analysis"]["timeline"]["model"] = "first"
        project = copy_workflow(tmp_path / "project", config)
        # The loopback endpoint's slot (its host 127.0.0.1), capped as the profiles cap one;
        # the two cells alone (their analysis holds no request).
        cells = [f"results/episodes/{name}/n3.parquet" for name in ("first", "second")]
        run(project, "snakemake", *cells, "--cores", "2", "--resources", "api_127_0_0_1=1")
    arrivals: dict[str, list[float]] = {}
    for request in server.requests:
        arrivals.setdefault(request.body["model"], []).append(request.received_s)
    spans = sorted((min(times), max(times)) for times in arrivals.values())
    assert len(spans) == 2, arrivals.keys()
    assert spans[0][1] < spans[1][0], spans
