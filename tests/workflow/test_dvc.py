"""DVC over Snakemake: real repos in temporary folders; what each config change reruns."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, planned, run, tool_env

pytestmark = [pytest.mark.workflow, pytest.mark.slow]


def _jobs(output: str, rule: str) -> int:
    """How many jobs of ``rule`` a Snakemake run reported starting."""
    return len(re.findall(rf"^(local)?rule {rule}:", output, flags=re.MULTILINE))


def _episode_jobs(output: str) -> int:
    """How many generate_episodes jobs a Snakemake run reported starting."""
    return _jobs(output, "generate_episodes")


def _git(repo, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=ci@coordgap.test", "-c", "user.name=ci", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def _repo(repo, ignored: tuple[str, ...] = ()):
    """Make the workflow copy ``repo`` a git + DVC repository (its Makefile and DVC plot
    templates too), committed, with ``ignored`` besides Snakemake's records out of git."""
    shutil.copy2(ROOT / "Makefile", repo / "Makefile")
    (repo / ".gitignore").write_text(
        "".join(f"{path}\n" for path in (".snakemake/", "logs/", *ignored))
    )
    _git(repo, "init", "-q")
    run(repo, "dvc", "init", "-q")
    run(repo, "dvc", "config", "core.analytics", "false")
    shutil.copytree(ROOT / ".dvc" / "plots", repo / ".dvc" / "plots")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "workflow")
    return repo


def _edit(repo, change) -> None:
    """Apply ``change`` to the repo's config/config.yaml."""
    path = repo / "config" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    change(config)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def _make_all(repo) -> None:
    """Run the Makefile's ``all`` recipe in ``repo`` with this venv (already installed)."""
    venv = Path(sys.executable).parents[1]
    make = ["make", "all", f"VENV={venv}", "CORES=2", "-o", str(venv / ".installed")]
    result = subprocess.run(
        make, cwd=repo, env=tool_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{make}:\n{result.stdout}\n{result.stderr}"


def test_make_all_leaves_repro_nothing_to_do_then_a_reward_change_reruns_only_analysis(
    finished_tiny,
):
    # The tiny design after its `snakemake all` (tiny_study); `make all` runs it again, which
    # finds nothing to do, and records it with `dvc commit`. Outputs stay out of git, as DVC's
    # outputs are.
    dvc_repo = _repo(finished_tiny, ignored=("results/", "resources/"))
    _make_all(dvc_repo)
    assert (dvc_repo / "results" / "report.md").exists()
    assert (dvc_repo / "dvc.lock").exists()
    episodes = sorted((dvc_repo / "results" / "episodes").rglob("*.parquet"))
    assert len(episodes) == 3 * 3 * 2  # episode, step and transcript tables, 3 models x 2 sizes

    second = run(dvc_repo, "dvc", "repro")
    assert "Running stage" not in second.stdout, second.stdout
    assert run(dvc_repo, "dvc", "status").stdout.strip().endswith("up to date.")
    # A row per model in `dvc metrics show`, and no other (Snakemake's .snakemake_timestamp of a
    # directory output was one); the summary's plots draw a line per model.
    metrics = run(dvc_repo, "dvc", "metrics", "show").stdout
    rows = re.findall(r"^(results/metrics/\S+)\s", metrics, re.M)
    assert sorted(rows) == [
        f"results/metrics/{model}.json" for model in ("left_first", "resource_hierarchy", "silent")
    ], metrics
    plots = json.loads(run(dvc_repo, "dvc", "plots", "show", "--json").stdout)["data"]
    (summary,) = plots["results/stats/summary.csv"]
    assert summary["content"]["encoding"]["color"]["field"] == "model"

    mtimes = {path: path.stat().st_mtime_ns for path in episodes}
    report_before = (dvc_repo / "results" / "report.md").read_text()
    config_path = dvc_repo / "config" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["reward"]["weights"]["idle"] = 0.5
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    # A cluster's run names its workflow profile (here a copy of the default); which one ran
    # changes no stage.
    shutil.copytree(dvc_repo / "profiles" / "default", dvc_repo / "profiles" / "site")
    profile = {"COORDGAP_WORKFLOW_PROFILE": "profiles/site"}
    third = run(dvc_repo, "dvc", "repro", env=profile)
    assert "Using workflow specific profile profiles/site" in third.stdout + third.stderr
    assert "Stage 'episodes' didn't change" in third.stdout, third.stdout
    assert "Running stage 'analysis'" in third.stdout, third.stdout
    assert _episode_jobs(third.stdout + third.stderr) == 0
    assert {path: path.stat().st_mtime_ns for path in episodes} == mtimes
    assert (dvc_repo / "results" / "report.md").read_text() != report_before


def test_selection_and_learning_rate_changes_rerun_exactly_what_depends_on_them(
    tmp_path, trained_study
):
    # The trained study as `make all` leaves it: Snakemake ran it, `dvc commit` recorded it.
    # Its outputs stay out of git, as DVC's outputs are.
    project = shutil.copytree(trained_study, tmp_path / "repo", symlinks=True)
    repo = _repo(project, ignored=("results/", "resources/"))
    run(repo, "dvc", "commit", "--force", "--quiet")
    first = run(repo, "dvc", "repro")
    assert "Running stage" not in first.stdout, first.stdout
    episodes = sorted((repo / "results" / "episodes").rglob("*.parquet"))
    validation = sorted((repo / "results" / "eval").rglob("step_*.parquet"))
    mtimes = {path: path.stat().st_mtime_ns for path in episodes + validation}

    # Another selection policy: selection and the new policy's tests, no checkpoint replayed.
    _edit(repo, lambda c: c["evaluation"]["policies"].append("lcb_val"))
    reselected = run(repo, "dvc", "repro")
    output = reselected.stdout + reselected.stderr
    assert "Stage 'train' didn't change" in output, output
    assert "Running stage 'evaluate'" in output, output
    assert _jobs(output, "train_grpo") == _jobs(output, "evaluate_checkpoints") == 0
    assert _jobs(output, "select_checkpoint") == 1  # lcb_val's own; the others are kept
    assert _jobs(output, "test_checkpoint") == 1  # lcb_val at the one size
    assert {path: path.stat().st_mtime_ns for path in mtimes} == mtimes

    # A learning-rate change retrains and reruns what follows, never an untrained model's cell:
    # checked against this finished run as DVC and Snakemake plan it (a real retrain costs
    # the whole training again; the reselection above already ran a real partial repro).
    _edit(repo, lambda c: c["training"]["runs"]["tiny-grpo"].update(learning_rate=1e-4))
    status = run(repo, "dvc", "status").stdout
    stale = {line.removesuffix(":") for line in status.splitlines() if re.match(r"^\w+:$", line)}
    assert "train" in stale, status
    assert not {"models", "episodes"} & stale, status
    plan = planned(run(repo, "snakemake", "-n", "--cores", "1", "all").stdout)
    assert plan["train_grpo"] == 1
    assert plan["evaluate_checkpoints"] == 1
    assert plan["test_checkpoint"] == 3  # last, best_val and lcb_val at the one size
    assert "generate_episodes" not in plan
    assert "prepare_model" not in plan
