"""Experiment tracking against the real TensorBoard and MLflow stores, read back by their own
readers: a stream holds each step once however often its job ran, and nothing is sent."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from coordgap.tracking import EXPERIMENT, tracked

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.unit


def _row(step: int, attempt: int) -> dict:
    """A history-like row: numbers, the run's name, a null and a NaN (no trainable group)."""
    return {
        "run": "tiny-grpo",
        "step": step,
        "reward_mean": 0.1 * step + attempt,
        "episodes": 6,
        "probe_kl": None,
        "loss": math.nan,
    }


def _write_twice(store: Path, backend: str) -> None:
    """A job's stream written by a first attempt (three steps), then by its rerun (two), beside
    another job's stream."""
    config = {"tracking": backend}
    with tracked(config, "tiny-grpo", "train", settings={"steps": 3}, store=store) as stream:
        for step in range(3):
            stream.log(step, _row(step, attempt=0))
    with tracked(config, "tiny-grpo", "validation", store=store) as stream:
        stream.log(0, _row(0, attempt=5))
    with tracked(config, "tiny-grpo", "train", settings={"steps": 3}, store=store) as stream:
        for step in range(2):
            stream.log(step, _row(step, attempt=1))


def _tensorboard(store: Path, stream: str) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(store / "tensorboard" / "tiny-grpo" / stream)).Reload()
    return {
        tag: [(event.step, event.value) for event in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def _mlflow(store: Path) -> tuple[MlflowClient, dict[str, object]]:
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id])
    return client, {run.data.tags["coordgap.stream"]: run for run in runs}


def test_tensorboard_holds_each_step_once_from_the_last_attempt(tmp_path: Path) -> None:
    _write_twice(tmp_path, "tensorboard")
    train = _tensorboard(tmp_path, "train")
    # Numbers only: the run's name, the null and the NaN make no curve.
    assert set(train) == {"step", "reward_mean", "episodes"}
    assert [step for step, _ in train["reward_mean"]] == [0, 1]
    assert [value for _, value in train["reward_mean"]] == pytest.approx([1.0, 1.1])
    assert _tensorboard(tmp_path, "validation")["reward_mean"] == [(0, 5.0)]
    assert len(list((tmp_path / "tensorboard/tiny-grpo/train").iterdir())) == 1


def test_mlflow_holds_each_step_once_and_sends_nothing(tmp_path: Path) -> None:
    _write_twice(tmp_path, "mlflow")
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
    client, runs = _mlflow(tmp_path)
    # The first attempt's run is deleted: the experiment shows one run per stream.
    assert set(runs) == {"train", "validation"}
    train = runs["train"]
    assert train.info.run_name == "tiny-grpo/train"
    assert train.info.status == "FINISHED"
    assert train.data.params == {"steps": "3"}
    assert set(train.data.metrics) == {"step", "reward_mean", "episodes"}
    history = client.get_metric_history(train.info.run_id, "reward_mean")
    assert [point.step for point in history] == [0, 1]
    assert [point.value for point in history] == pytest.approx([1.0, 1.1])
    # The artifact store stays inside the tracking store, not the job's working folder.
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment.artifact_location.startswith(tmp_path.resolve().as_uri())


def test_a_failed_job_leaves_its_stream_marked_failed(tmp_path: Path) -> None:
    def job() -> None:
        with tracked({"tracking": "mlflow"}, "tiny-grpo", "train", store=tmp_path) as stream:
            stream.log(0, _row(0, attempt=0))
            raise RuntimeError("step 1 failed")

    with pytest.raises(RuntimeError, match="step 1 failed"):
        job()
    client, runs = _mlflow(tmp_path)
    assert runs["train"].info.status == "FAILED"
    logged = client.get_metric_history(runs["train"].info.run_id, "step")
    assert [point.step for point in logged] == [0]


def test_no_tracking_writes_nothing(tmp_path: Path) -> None:
    with tracked({"tracking": "none"}, "tiny-grpo", "train", store=tmp_path / "store") as stream:
        stream.log(0, _row(0, attempt=0))
    assert not (tmp_path / "store").exists()
