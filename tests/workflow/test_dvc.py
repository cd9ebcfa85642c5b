"""DVC over Snakemake: a real repo in a temporary folder, repro, no-op, and a reward change."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from tests.conftest import copy_workflow, run

pytestmark = [pytest.mark.workflow, pytest.mark.slow]


def _episode_jobs(output: str) -> int:
    """How many generate_episodes jobs a Snakemake run reported starting."""
    return len(re.findall(r"^rule generate_episodes:", output, flags=re.MULTILINE))


def _git(repo, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=ci@coordgap.test", "-c", "user.name=ci", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


@pytest.fixture
def dvc_repo(tmp_path, tiny_config):
    """A git + DVC repository holding the workflow with the tiny design, committed."""
    repo = copy_workflow(tmp_path / "repo", tiny_config)
    (repo / ".gitignore").write_text(".snakemake/\nlogs/\n")
    _git(repo, "init", "-q")
    run(repo, "dvc", "init", "-q")
    run(repo, "dvc", "config", "core.analytics", "false")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "workflow")
    return repo


def test_repro_builds_then_noop_then_reward_change_reruns_only_analysis(dvc_repo):
    first = run(dvc_repo, "dvc", "repro")
    assert (dvc_repo / "results" / "report.md").exists()
    assert (dvc_repo / "dvc.lock").exists()
    episodes = sorted((dvc_repo / "results" / "episodes").rglob("*.parquet"))
    assert len(episodes) == 3 * 3 * 2  # episode, step and transcript tables, 3 models x 2 sizes
    assert "Running stage 'episodes'" in first.stdout

    second = run(dvc_repo, "dvc", "repro")
    assert "Running stage" not in second.stdout, second.stdout
    assert run(dvc_repo, "dvc", "status").stdout.strip().endswith("up to date.")

    mtimes = {path: path.stat().st_mtime_ns for path in episodes}
    report_before = (dvc_repo / "results" / "report.md").read_text()
    config_path = dvc_repo / "config" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["reward"]["weights"]["idle"] = 0.5
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    third = run(dvc_repo, "dvc", "repro")
    assert "Stage 'episodes' didn't change" in third.stdout, third.stdout
    assert "Running stage 'analysis'" in third.stdout, third.stdout
    assert _episode_jobs(third.stdout + third.stderr) == 0
    assert {path: path.stat().st_mtime_ns for path in episodes} == mtimes
    assert (dvc_repo / "results" / "report.md").read_text() != report_before
