"""GRPO training through Snakemake: every step's checkpoint, threads, resume after a kill.

The run is the tiny trained study of ``tests.conftest.trained_study``: SmolLM2 trains for 2
steps of 2 episodes at N = 3. Resumption is checked the way issue and design ask: a run stopped
at any moment (SIGTERM, a preemption; SIGKILL, a lost node) and rerun ends with the
uninterrupted run's history, rollouts and adapters, tensor for tensor.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
from typing import TYPE_CHECKING

import polars as pl
import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from coordgap.config.training import TrainingRunConfig
from coordgap.env.protocols import Tool
from coordgap.tracking import EXPERIMENT
from coordgap.training.history import rollout_rewards
from tests.conftest import (
    RUN_OUTPUT,
    TRAINED_HISTORY,
    copy_workflow,
    run,
    trained_study_config,
)
from tests.integration.processes import EXIT_WITHIN_S, signal_when

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN = "results/train/tiny-grpo"
TARGET = TRAINED_HISTORY
JOB_LOG = "logs/train_grpo/tiny-grpo.log"
# Timing columns differ between any two runs; everything else must not.
TIMING = ("seconds_rollout", "seconds_update", "seconds")


def _committed(project: Path) -> int:
    """The last checkpoint the run has committed (-1 before the first)."""
    state = project / RUN / ".resume" / "state.json"
    try:
        return json.loads(state.read_text())["step"]
    except (FileNotFoundError, json.JSONDecodeError):
        return -1


@pytest.fixture(scope="module")
def config(smollm2_dir: Path) -> dict:
    """The trained study's config, for the runs that are stopped on their way to its result."""
    return trained_study_config(smollm2_dir)


def _tracked(project: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """The MLflow store's curves of the run's streams: stream -> metric -> (step, value)."""
    client = MlflowClient(f"sqlite:///{project / 'results/tracking/mlflow.db'}")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return {
        found.data.tags["coordgap.stream"]: {
            metric: [
                (point.step, point.value)
                for point in client.get_metric_history(found.info.run_id, metric)
            ]
            for metric in found.data.metrics
        }
        for found in client.search_runs([experiment.experiment_id])
    }


def _assert_tracked_history(project: Path) -> None:
    """The train stream holds each committed step once, as the history table has it."""
    history = pl.read_parquet(project / TARGET)
    curve = _tracked(project)["train"]["reward_mean"]
    assert curve == list(zip(history["step"], history["reward_mean"], strict=True))


def _assert_same_run(resumed: Path, uninterrupted: Path) -> None:
    history = pl.read_parquet(resumed / TARGET).drop(TIMING)
    assert history.equals(pl.read_parquet(uninterrupted / TARGET).drop(TIMING))
    for path in sorted((uninterrupted / RUN / "rollouts").glob("*.parquet")):
        expected = pl.read_parquet(path).drop("latency_s", strict=False)
        actual = pl.read_parquet(resumed / RUN / "rollouts" / path.name)
        assert actual.drop("latency_s", strict=False).equals(expected), path.name
    for step in range(3):
        name = f"checkpoints/step_{step:04d}/adapter_model.safetensors"
        a, b = load_file(resumed / RUN / name), load_file(uninterrupted / RUN / name)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), name
        # Written by other processes, whose string hashing (PEFT's set of target modules)
        # differs: the same adapter is the same bytes, so DVC hashes it the same.
        config = f"checkpoints/step_{step:04d}/adapter_config.json"
        assert (resumed / RUN / config).read_bytes() == (uninterrupted / RUN / config).read_bytes()
    assert not (resumed / RUN / ".resume").exists()


def test_every_step_is_a_checkpoint_and_the_job_uses_the_rules_threads(
    trained_study: Path, config: dict
) -> None:
    for step in range(3):
        folder = trained_study / RUN / "checkpoints" / f"step_{step:04d}"
        assert {"adapter_model.safetensors", "adapter_config.json"} <= {
            p.name for p in folder.iterdir()
        }
    step_0 = load_file(trained_study / RUN / "checkpoints/step_0000/adapter_model.safetensors")
    # The untrained adapter: B = 0, so it acts exactly like the base model.
    assert all(torch.count_nonzero(v) == 0 for k, v in step_0.items() if "lora_B" in k)
    history = pl.read_parquet(trained_study / TARGET)
    assert history["step"].to_list() == [0, 1]
    assert history["n"].to_list() == [3, 3]
    # The training curve is rebuilt from the rollout tables alone.
    run_config = TrainingRunConfig.from_dict("tiny-grpo", config["training"]["runs"]["tiny-grpo"])
    trained_rows = 0
    for row in history.iter_rows(named=True):
        episodes = pl.read_parquet(trained_study / RUN / f"rollouts/step_{row['step']:04d}.parquet")
        rebuilt = rollout_rewards(episodes, run_config)
        assert rebuilt["reward_mean"] == pytest.approx(row["reward_mean"])
        assert rebuilt["episodes"] == row["episodes"] == 2
        # What the update did: the rollouts' choices, and how far mu moved on the probe set.
        assert sum(row[f"actions_{tool}"] for tool in Tool) == pytest.approx(1.0)
        assert row["entropy_mean"] > 0
        trained_rows += row["rows"]
        # The untrained adapter is the base model exactly; any update moves mu.
        assert (row["probe_kl"] > 0) == (trained_rows > 0)
        # The control reward's exact expectation at the step's N, whatever the run trains on.
        assert 0 < row["r1_exact_base"] < 1
        if trained_rows == 0:
            assert row["r1_exact"] == row["r1_exact_base"]
    # Snakemake gave the job two threads, and torch used exactly those.
    output = "".join((trained_study / name).read_text() for name in RUN_OUTPUT)
    assert re.search(r"rule train_grpo:.*?threads: 2", output, flags=re.DOTALL)
    assert "torch threads: 2" in (trained_study / JOB_LOG).read_text()


def test_a_run_stopped_then_killed_resumes_each_time_to_the_uninterrupted_result(
    tmp_path: Path, config: dict, trained_study: Path
) -> None:
    """A preemption (SIGTERM) mid-step, then a lost node (SIGKILL) once the rerun has resumed:
    each rerun resumes at the step committed last, and the run ends as the uninterrupted one.

    One run takes both stops, each where its own test used to stop a run of its own.
    """
    stopped = copy_workflow(tmp_path / "stopped", config)
    rollouts = stopped / RUN / ".resume" / "rollouts"

    # SIGTERM mid-step: step 0 is committed and step 1 under way (its rollouts not committed).
    def mid_step() -> bool:
        return _committed(stopped) == 1 and not (rollouts / "step_0001.parquet").exists()

    status, seconds = signal_when(stopped, TARGET, mid_step, signal.SIGTERM, cores=2, timeout_s=600)
    assert status != 0
    assert seconds < EXIT_WITHIN_S
    assert _committed(stopped) == 1
    log = (stopped / JOB_LOG).read_text()
    assert "stopped by SIGTERM" in log
    assert "Traceback" not in log

    # SIGKILL once the rerun has resumed step 1 (its job's log is written anew).
    def resumed() -> bool:
        log = stopped / JOB_LOG
        return log.exists() and "resuming at step 1 of 2" in log.read_text()

    signal_when(stopped, TARGET, resumed, signal.SIGKILL, cores=2, timeout_s=600)
    assert _committed(stopped) == 1
    assert not (stopped / TARGET).exists()
    # A SIGKILLed Snakemake leaves its lock behind; --unlock is the documented way back.
    run(stopped, "snakemake", "--unlock")
    run(stopped, "snakemake", "--cores", "2", TARGET)
    assert "resuming at step 1 of 2" in (stopped / JOB_LOG).read_text()
    _assert_same_run(stopped, trained_study)
    # The resumed jobs logged the step committed before each stop again, and only once.
    _assert_tracked_history(stopped)


def test_the_study_trains_evaluates_selects_tests_and_reports(trained_study: Path) -> None:
    results = trained_study / "results"
    # Every checkpoint played its validation episodes, each in one file, all in one job and
    # on the same scenarios; the job's journal is gone.
    folder = results / "eval/tiny-grpo/validation"
    tables = sorted(folder.glob("step_????.parquet"))
    assert [path.name for path in tables] == [
        "step_0000.parquet",
        "step_0001.parquet",
        "step_0002.parquet",
    ]
    validation = pl.concat([pl.read_parquet(path) for path in tables])
    assert validation["checkpoint"].unique(maintain_order=True).to_list() == [
        path.stem for path in tables
    ]
    assert len({tuple(pl.read_parquet(path)["scenario"]) for path in tables}) == 1
    assert not (results / "eval/tiny-grpo/validation.partial").exists()
    selection = json.loads((results / "eval/tiny-grpo/selection.json").read_text())
    assert selection["choices"]["last"]["step"] == 2
    chosen = selection["choices"]["best_val"]["step"]
    tested = pl.read_parquet(results / "test/tiny-grpo@best_val/n3.parquet")
    assert tested["model"].unique().to_list() == ["tiny-grpo@best_val"]
    assert tested["checkpoint"].unique().to_list() == [f"step_{chosen:04d}"]
    # The test grid plays the base model's scenarios, which no training or validation saw.
    base = pl.read_parquet(results / "episodes/llm/n3.parquet")
    assert tested["scenario"].to_list() == base["scenario"].to_list()
    seen = {*validation["scenario"]}
    for path in (results / "train/tiny-grpo/rollouts").glob("step_????.parquet"):
        seen |= {*pl.read_parquet(path)["scenario"]}
    assert not seen & {*base["scenario"]}
    # Tracked: the training curve, each validated checkpoint, each test cell at its step.
    _assert_tracked_history(trained_study)
    tracked = _tracked(trained_study)
    assert [step for step, _ in tracked["validation"]["reward_mean"]] == [0, 1, 2]
    assert tracked["validation"]["episodes"] == [(0, 2.0), (1, 2.0), (2, 2.0)]
    assert tracked["test/best_val/n3"]["episodes"] == [(chosen, 2.0)]
    assert set(tracked) == {"train", "validation", "test/last/n3", "test/best_val/n3"}
    comparisons = pl.read_csv(results / "stats/comparisons.csv")
    families = set(comparisons["family"])
    assert {"tiny-grpo: selected vs base", "tiny-grpo: selected vs last"} <= families
    pairs = comparisons.filter(pl.col("family") == "tiny-grpo: selected vs base")
    assert set(pairs["model_a"]) == {"tiny-grpo@last", "tiny-grpo@best_val"}
    assert set(pairs["model_b"]) == {"llm"}
    report = (results / "report.md").read_text()
    assert "## Training and checkpoint selection" in report
    assert "training_tiny-grpo.png" in report
    assert "tiny-grpo@best_val" in report
    assert (results / "figures/training_tiny-grpo.csv").exists()
    # Shared data: every output (tables, adapters, figures) as readable as the umask allows,
    # none private to the user who ran the study.
    umask = os.umask(0)
    os.umask(umask)
    private = [
        path
        for path in results.rglob("*")
        if stat.S_IMODE(path.stat().st_mode) != (0o777 if path.is_dir() else 0o666) & ~umask
    ]
    assert not private, private[:5]
