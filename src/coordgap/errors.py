"""Expected failures: what a job stops on with its message alone, no traceback."""

from __future__ import annotations


class ExpectedFailure(Exception):
    """A failure whose message says everything the user needs: what failed and what to do.

    A refused key, an endpoint that is down, an invalid config or site file, a cell with too
    many error episodes: the cause lies outside the code, and the message names it and the fix.
    The code's lines a traceback would add help nobody, so ``coordgap.logs.job_log`` ends the
    job with the message and its log's path instead. An error that signals a bug (a replay
    that disagrees with its record) is no expected failure: its traceback is what to debug.

    Each subclass keeps the built-in base its callers catch it by, e.g.
    ``class ConfigError(ExpectedFailure, ValueError)``.
    """
