"""Optional experiment tracking: training curves and evaluations in TensorBoard or MLflow.

The config's ``tracking`` (``none``, ``tensorboard`` or ``mlflow``) chooses where the model jobs
also log what they write to their tables: ``train_grpo`` each step's history row as the step
commits, ``evaluate_checkpoints`` each validated checkpoint, ``test_checkpoint`` each test cell
of a selected checkpoint. Validation and test cells are summarized in the history's own reward
columns (``coordgap.training.history.rollout_rewards``), so a run's training and validation
curves share their names and overlay in either tool.

The store is local, under ``results/tracking/``: TensorBoard event files in
``tensorboard/<run>/<stream>/``, MLflow's SQLite database ``mlflow.db`` (experiment
``coordgap``, one MLflow run per stream, tagged ``coordgap.run`` and ``coordgap.stream``) with
MLflow's telemetry off, so nothing leaves the machine. A stream is the unit a job writes:
``train``, ``validation`` or ``test/<policy>/n<N>``. A job rewrites its stream whole each time
it runs, and a resumed training job logs its committed steps again first, so a rerun or a
resume never leaves a point twice.

Tracking is a view: the tables under ``results/`` are the record. Jobs read ``tracking`` from
the config, not from their params, so switching it never reruns a job; it logs the jobs that
run after the switch.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from coordgap.resume import share_as_umask

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

logger = logging.getLogger(__name__)

# Where the tracking store lives, relative to the workflow folder that jobs run in.
STORE = Path("results/tracking")
EXPERIMENT = "coordgap"


class Stream(Protocol):
    """Where a job logs its numbers: one curve per metric, indexed by training step."""

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Log the numeric values of ``metrics`` at ``step``; None, NaN and text are skipped."""


def numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The values of a row that a tracker can plot: finite or infinite numbers, not NaN.

    A history row holds the run's name and null or NaN where a step had nothing to measure
    (no trainable group: no loss); a curve skips those steps instead of drawing a zero.
    """
    return {
        key: float(value)
        for key, value in metrics.items()
        if isinstance(value, int | float) and not math.isnan(value)
    }


class _Untracked:
    """``tracking: none``: nothing is logged."""

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        del step, metrics


class _TensorBoard:
    """A stream's event files in ``<store>/tensorboard/<run>/<stream>/``."""

    def __init__(self, folder: Path, settings: Mapping[str, Any] | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        shutil.rmtree(folder, ignore_errors=True)
        self.writer = SummaryWriter(log_dir=str(folder))
        if settings:
            self.writer.add_text("settings", f"```\n{json.dumps(settings, indent=2)}\n```")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for key, value in numbers(metrics).items():
            self.writer.add_scalar(key, value, global_step=step)
        # Flushed at once, so that TensorBoard shows a running job's curve as it grows.
        self.writer.flush()

    def close(self, failed: bool) -> None:
        del failed
        self.writer.close()


class _MLflow:
    """A stream as an MLflow run in ``<store>/mlflow.db``, the one before it deleted.

    Jobs running at once share the database: a lock file serializes their writes, since
    SQLite's own locking gives up after a few seconds and two jobs that create the database
    at once would both try to create its tables.
    """

    def __init__(
        self, store: Path, run: str, stream: str, settings: Mapping[str, Any] | None
    ) -> None:
        # Before MLflow is imported: its telemetry would send usage data on every call.
        os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
        from mlflow.tracking import MlflowClient

        self.lock = store / "mlflow.lock"
        database = store / "mlflow.db"
        with self._locked():
            self.client = MlflowClient(f"sqlite:///{database.resolve()}")
            experiment = self.client.get_experiment_by_name(EXPERIMENT)
            # SQLite creates its file 0644 whatever the umask: a group's shared results.
            share_as_umask(database)
            experiment_id = (
                experiment.experiment_id
                if experiment
                else self.client.create_experiment(
                    EXPERIMENT, artifact_location=(store / "mlflow-artifacts").resolve().as_uri()
                )
            )
            earlier = self.client.search_runs(
                [experiment_id],
                filter_string=f"tags.`coordgap.run` = '{run}' "
                f"and tags.`coordgap.stream` = '{stream}'",
            )
            for previous in earlier:
                self.client.delete_run(previous.info.run_id)
            self.run_id = self.client.create_run(
                experiment_id,
                run_name=f"{run}/{stream}",
                tags={"coordgap.run": run, "coordgap.stream": stream},
            ).info.run_id
            for key, value in (settings or {}).items():
                self.client.log_param(self.run_id, key, json.dumps(value, default=str))

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self.lock.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(key, value, stamp, step) for key, value in numbers(metrics).items()]
        with self._locked():
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self, failed: bool) -> None:
        with self._locked():
            self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def _tensorboard(
    store: Path, run: str, stream: str, settings: Mapping[str, Any] | None
) -> _TensorBoard:
    return _TensorBoard(store / "tensorboard" / run / stream, settings)


# How a job's stream opens in each tracker that keeps a store (``tracking: none`` keeps none):
# the schema's ``tracking`` enum is tested against these keys and ``none``.
TRACKERS: dict[str, Callable[..., _TensorBoard | _MLflow]] = {
    "tensorboard": _tensorboard,
    "mlflow": _MLflow,
}


@contextmanager
def tracked(
    config: Mapping[str, Any],
    run: str,
    stream: str,
    settings: Mapping[str, Any] | None = None,
    store: Path = STORE,
) -> Iterator[Stream]:
    """A job's stream in the tracker the config names, closed (as failed, on an error) after.

    Args:
        config: The validated config; its ``tracking`` names the tracker.
        run: The training run the job belongs to.
        stream: What the job logs: ``train``, ``validation`` or ``test/<policy>/n<N>``.
        settings: The run's settings, recorded with the stream (text in TensorBoard, params in
            MLflow).
        store: The tracking store.

    Yields:
        The stream; its earlier contents, from an earlier run of the job, are gone.
    """
    backend = config["tracking"]
    if backend == "none":
        yield _Untracked()
        return
    store.mkdir(parents=True, exist_ok=True)
    opened = TRACKERS[backend](store, run, stream, settings)
    logger.info("tracking %s/%s in %s (%s)", run, stream, store, backend)
    try:
        yield opened
    except BaseException:
        opened.close(failed=True)
        raise
    opened.close(failed=False)
