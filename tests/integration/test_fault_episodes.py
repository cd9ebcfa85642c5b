"""Whole episodes against a misbehaving OpenAI-compatible server, through the real pipeline.

The server answers with a rotating mix of valid calls, prose, empty replies, two calls,
hallucinated tools, invalid JSON arguments, 429 with Retry-After, 500s and hangs past the
client timeout. Every episode must complete or be marked ``error``; no malformed reply may be
counted as an action; and the API key must appear in no output and no log.
"""

from __future__ import annotations

import polars as pl
import pytest

from coordgap.env.protocols import TOOLS, Protocol
from coordgap.policies.base import NoCallReason
from tests.conftest import copy_workflow, run
from tests.integration.fault_server import (
    FaultServer,
    empty,
    failing,
    hang,
    ok,
    rate_limited,
    text_only,
    two_calls,
)

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
]


def _config(tiny_config: dict, base_url: str) -> dict:
    config = dict(tiny_config)
    config["models"] = {
        "faulty": {
            "kind": "openai",
            "provider": "openai",
            "base_url": base_url,
            "model": "faulty-model",
            "api_key_env": KEY_VARIABLE,
            "temperature": 0.7,
            "top_p": 1.0,
            "max_tokens": 64,
            "extra_body": {},
            "tool_choice": "auto",
            "timeout_s": 0.5,
            "max_retries": 1,
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
            "max_in_flight": 2,
            "episodes_per_cell": 6,
        }
    }
    config["experiment"] = {"sizes": [3], "episodes_per_cell": 6}
    config["analysis"] = {
        **tiny_config["analysis"],
        "comparisons": [],
        "timeline": {"model": "faulty", "n": 3, "episode": 0},
    }
    return config


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

    per_episode = steps.group_by("episode").agg(
        decisions=pl.len(),
        no_call=(pl.col("outcome") == "no_call").sum(),
        transport=(pl.col("reason") == "transport_error").sum(),
    )
    checked = episodes.join(per_episode, on="episode", suffix="_steps")
    assert (checked["decisions"] == checked["decisions_steps"]).all()
    assert (checked["no_call"] == checked["no_call_steps"]).all()
    assert (checked["actions"] + checked["no_call"] == checked["decisions"]).all()
    # An episode with a transport failure is marked error, and only such episodes are.
    assert ((checked["transport"] > 0) == (checked["status"] == "error")).all()

    summary = pl.read_csv(project / "results/stats/summary.csv")
    assert summary["errors"].item() == (episodes["status"] == "error").sum()
    assert summary["episodes"].item() == (episodes["status"] == "ok").sum()

    for path in project.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    for path in project.rglob("*.parquet"):
        frame = pl.read_parquet(path)
        for column in frame.columns:
            if frame[column].dtype == pl.String:
                assert not frame[column].str.contains(SECRET, literal=True).any(), (path, column)
