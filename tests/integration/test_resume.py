"""A generation job stopped mid-cell resumes from its journal: nothing lost, nothing twice.

SIGKILL (a lost node) gives the job no say. SIGTERM (Slurm's preemption, ``scancel``, the time
limit) and SIGINT (Ctrl-C) reach every process of the job, as Slurm and a terminal send them:
the test signals the whole process group of a real Snakemake run. Snakemake itself only stops
scheduling on SIGTERM; the job's own process stops within seconds, drops the episodes in
flight, exits non-zero, and leaves Snakemake unlocked for the rerun.
"""

from __future__ import annotations

import signal
from pathlib import Path

import polars as pl
import pytest
import yaml

from tests.conftest import TINY_CONFIG, copy_workflow, run
from tests.integration.fault_server import FaultServer, hang, ok
from tests.integration.processes import EXIT_WITHIN_S, signal_when

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TARGET = "results/episodes/random/n6.parquet"
JOB_LOG = "logs/generate_episodes/random/n6.log"


def _config() -> dict:
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config["models"] = {"random": {"kind": "scripted", "policy": "random"}}
    config["experiment"] = {**config["experiment"], "sizes": [6], "episodes_per_cell": 300}
    config["analysis"] = {
        **config["analysis"],
        "comparisons": [],
        "timeline": {"model": "random", "n": 6, "episode": 0},
    }
    return config


def _journalled(journal: Path) -> int:
    return len(list(journal.glob("*.episodes.parquet")))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cell played in one go: what every interrupted run must end up with."""
    clean = copy_workflow(tmp_path_factory.mktemp("clean"), _config())
    run(clean, "snakemake", "--cores", "1", TARGET)
    return clean


def _assert_same_tables(resumed: Path, uninterrupted: Path) -> None:
    for suffix in (".parquet", ".steps.parquet"):
        table = Path(TARGET).with_suffix("").with_suffix(suffix)
        assert (resumed / table).read_bytes() == (uninterrupted / table).read_bytes(), suffix
    assert pl.read_parquet(resumed / TARGET)["episode"].to_list() == list(range(300))
    assert not (resumed / "results/episodes/random/n6.partial").exists()


def test_killed_generation_resumes_to_the_uninterrupted_result(tmp_path, uninterrupted):
    killed = copy_workflow(tmp_path / "killed", _config())
    journal = killed / "results/episodes/random/n6.partial"
    signal_when(killed, TARGET, lambda: _journalled(journal) >= 20, signal.SIGKILL)
    journalled = _journalled(journal)
    assert 20 <= journalled < 300
    assert not (killed / TARGET).exists()

    # A SIGKILLed Snakemake leaves its lock behind; --unlock is the documented way back.
    run(killed, "snakemake", "--unlock")
    run(killed, "snakemake", "--cores", "1", TARGET)
    log = (killed / JOB_LOG).read_text()
    assert f"{journalled} journalled, {300 - journalled} to play" in log
    _assert_same_tables(killed, uninterrupted)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_ends_generation_within_seconds_and_the_rerun_matches(
    tmp_path, uninterrupted, signum
):
    stopped = copy_workflow(tmp_path / "stopped", _config())
    journal = stopped / "results/episodes/random/n6.partial"
    status, seconds = signal_when(stopped, TARGET, lambda: _journalled(journal) >= 20, signum)
    assert status != 0
    assert seconds < EXIT_WITHIN_S
    journalled = _journalled(journal)
    assert 20 <= journalled < 300
    assert not list(journal.glob(".*.tmp")), "a journal part was left half-written"
    log = (stopped / JOB_LOG).read_text()
    assert f"cancelled: {journalled} of 300 episodes journalled" in log
    assert f"stopped by {signum.name}" in log
    assert "Traceback" not in log

    # A clean stop leaves no lock: the same command continues.
    run(stopped, "snakemake", "--cores", "1", TARGET)
    log = (stopped / JOB_LOG).read_text()
    assert f"{journalled} journalled, {300 - journalled} to play" in log
    _assert_same_tables(stopped, uninterrupted)


def test_a_stop_signal_drops_the_calls_in_flight_and_the_rerun_plays_only_those(
    tmp_path, tiny_config
):
    # Two episodes in flight, 3 philosophers, 3 rounds of `think`: 9 calls per episode. The
    # first 18 calls are answered at once, enough to finish one or two episodes; every later
    # call hangs, far past the exit bound, until the signal. The rerun is answered at once.
    calls_per_episode, in_flight, episodes = 9, 2, 8
    quick = calls_per_episode * in_flight
    config = dict(tiny_config)
    config["experiment"] = {**config["experiment"], "sizes": [3], "episodes_per_cell": episodes}
    config["analysis"] = {
        **tiny_config["analysis"],
        "comparisons": [],
        "timeline": {"model": "slow", "n": 3, "episode": 0},
    }
    target = "results/episodes/slow/n3.parquet"
    with FaultServer([*[ok("think")] * quick, hang(120.0)]) as server:
        config["models"] = {
            "slow": {
                "kind": "openai",
                "provider": "openai",
                "base_url": server.base_url,
                "model": "slow-model",
                "api_key_env": None,
                "temperature": 1.0,
                "top_p": 1.0,
                "max_tokens": 16,
                "extra_body": {},
                "model_kwargs": {},
                "tool_choice": "auto",
                "timeout_s": 300.0,
                "max_retries": 0,
                "backoff_base_s": 0.01,
                "backoff_max_s": 0.05,
                "requests_per_second": None,
                "max_in_flight": in_flight,
                "serve": None,
                "episodes_per_cell": episodes,
            }
        }
        project = copy_workflow(tmp_path / "project", config)
        journal = project / "results/episodes/slow/n3.partial"
        status, seconds = signal_when(
            project,
            target,
            lambda: _journalled(journal) >= 1 and len(server.requests) > quick,
            signal.SIGTERM,
        )
        assert status != 0
        assert seconds < EXIT_WITHIN_S
        journalled = _journalled(journal)
        assert 1 <= journalled <= in_flight
        log = (project / "logs/generate_api_episodes/slow/n3.log").read_text()
        assert f"cancelled: {journalled} of {episodes} episodes journalled" in log

        server.restart([ok("think")])
        before = len(server.requests)
        run(project, "snakemake", "--cores", "1", target)
        replayed = len(server.requests) - before
    # Journalled episodes were not played again, and the dropped ones were played whole.
    assert replayed == (episodes - journalled) * calls_per_episode
    table = pl.read_parquet(project / target)
    assert table["episode"].to_list() == list(range(episodes))
    assert set(table["status"]) == {"ok"}
    assert (table["decisions"] == calls_per_episode).all()
