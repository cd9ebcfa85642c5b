"""Logging for pipeline jobs: every job writes its own log file, errors included."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

from coordgap.preemption import Preempted

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@contextmanager
def job_log(path: str | Path, job: str) -> Iterator[logging.Logger]:
    """Send the job's log records to ``path`` and record any exception before it propagates.

    Snakemake keeps a failed job's log, so the traceback is where the user looks first; a job
    that succeeded ends its log with its wall time. A job
    stopped by a signal (``coordgap.preemption.Preempted``) is no error to debug: it gets one
    line and exits with 128 + the signal number.

    Args:
        path: The rule's ``log:`` file.
        job: A name for the logger, usually the rule name.

    Yields:
        The job's logger.

    Raises:
        SystemExit: The job was preempted; its code is the signal's exit status.
    """
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
    except BaseException:
        logger.exception("job failed")
        raise
    finally:
        root.removeHandler(handler)
        handler.close()
