"""Logging for pipeline jobs: every job writes its own log file, errors included."""

from __future__ import annotations

import atexit
import gc
import logging
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

from coordgap.errors import ExpectedFailure
from coordgap.preemption import Preempted

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@contextmanager
def job_log(path: str | Path, job: str) -> Iterator[logging.Logger]:
    """Send the job's log records to ``path`` and record how the job ended.

    A job that succeeded ends its log with its wall time. A job stopped by a signal
    (``coordgap.preemption.Preempted``) is no error to debug: it gets one line and exits with
    128 + the signal number. An expected failure (``coordgap.errors.ExpectedFailure``: a
    refused key, an endpoint that is down, an invalid config) says all the user needs in its
    message, so it gets one line too, and the job ends printing its class, its message and
    ``path``, without the traceback through the job's code (Snakemake would print it twice:
    the job's stderr, then the log). Any other exception is a bug to debug: its traceback
    goes to the log and it propagates.

    The process ends with its job, so its exit skips the garbage collection of everything the
    job loaded (``_exit_without_collecting``).

    Args:
        path: The rule's ``log:`` file.
        job: A name for the logger, usually the rule name.

    Yields:
        The job's logger.

    Raises:
        SystemExit: The job was preempted (its code is the signal's exit status) or met an
            expected failure (its code is the failure's text and the log's path, so the
            process prints them and exits with status 1).
    """
    _exit_without_collecting()
    handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logger = logging.getLogger(job)
    started = time.perf_counter()
    try:
        yield logger
        logger.info("job done in %.1f s", time.perf_counter() - started)
    except Preempted as stop:
        logger.warning("%s", stop)
        raise SystemExit(stop.exit_code) from None
    except ExpectedFailure as failure:
        logger.error("%s: %s", type(failure).__name__, failure)
        raise SystemExit(f"{type(failure).__name__}: {failure}\nThe job's log: {path}") from None
    except BaseException:
        logger.exception("job failed")
        raise
    finally:
        root.removeHandler(handler)
        handler.close()


def _exit_without_collecting() -> None:
    """Freeze the garbage collector as the process exits, after the libraries' exit handlers.

    Python's exit collects garbage over every object alive, about a million in a job with
    torch, transformers and MLflow loaded. A training job stopped by SIGTERM took 3.3 s from
    the signal to its exit on an idle 2-core machine, 2.2 s of them collecting (1.1 s with the
    collector frozen), and 5.9 s beside four busy processes (2.7 s frozen). Frozen objects are
    skipped and the operating system takes back their memory. Nothing is lost: a job's files are
    closed (or written atomically) before it ends, and every exit handler still runs; the
    handlers that libraries register after this one run before it (last in, first out).
    """
    # One registration however many job logs a process opens (a test session opens many).
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
