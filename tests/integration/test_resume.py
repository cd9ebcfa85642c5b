"""A generation job killed with SIGKILL resumes from its journal: nothing lost, nothing twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import copy_workflow, run, tool_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TARGET = "results/episodes/random/n6.parquet"


def _config(tiny_config: dict) -> dict:
    config = dict(tiny_config)
    config["models"] = {"random": {"kind": "scripted", "policy": "random"}}
    config["experiment"] = {"sizes": [6], "episodes_per_cell": 300}
    config["analysis"] = {**tiny_config["analysis"], "comparisons": []}
    return config


def _kill_when_journalled(project: Path, parts: int) -> int:
    """Start the cell's job, SIGKILL its whole process group once ``parts`` episodes are in."""
    journal = project / "results/episodes/random/n6.partial"
    job = subprocess.Popen(
        [str(Path(sys.executable).parent / "snakemake"), "--cores", "1", TARGET],
        cwd=project,
        env=tool_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while len(list(journal.glob("*.episodes.parquet"))) < parts:
        assert job.poll() is None, "the job ended before it could be killed"
        assert time.monotonic() < deadline, "no journal appeared"
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    return len(list(journal.glob("*.episodes.parquet")))


def test_killed_generation_resumes_to_the_uninterrupted_result(tmp_path, tiny_config):
    config = _config(tiny_config)
    killed = copy_workflow(tmp_path / "killed", config)
    journalled = _kill_when_journalled(killed, parts=20)
    assert 20 <= journalled < 300
    assert not (killed / TARGET).exists()

    # A SIGKILLed Snakemake leaves its lock behind; --unlock is the documented way back.
    run(killed, "snakemake", "--unlock")
    run(killed, "snakemake", "--cores", "1", TARGET)
    log = (killed / "logs/generate_episodes/random/n6.log").read_text()
    assert f"{journalled} journalled, {300 - journalled} to play" in log

    clean = copy_workflow(tmp_path / "clean", config)
    run(clean, "snakemake", "--cores", "1", TARGET)
    for suffix in (".parquet", ".steps.parquet"):
        resumed = (killed / TARGET).with_suffix("").with_suffix(suffix)
        uninterrupted = (clean / TARGET).with_suffix("").with_suffix(suffix)
        assert resumed.read_bytes() == uninterrupted.read_bytes(), suffix
    episodes = pl.read_parquet(killed / TARGET)
    assert episodes["episode"].to_list() == list(range(300))
    assert not (killed / "results/episodes/random/n6.partial").exists()
