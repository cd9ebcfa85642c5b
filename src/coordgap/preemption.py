"""Preemption: SIGTERM and SIGINT stop a long job within seconds, with its saved state kept.

Who sends what, and why the job itself must listen:

- Slurm, on preemption, ``scancel`` or the time limit, sends SIGTERM to every process of the
  job (with the SLURM executor plugin that includes the Python process of the rule), then
  SIGKILL after ``KillWait`` (30 s by default).
- Ctrl-C in a terminal sends SIGINT to the whole foreground process group: Snakemake and the
  job processes it started.
- Snakemake itself forwards neither. Its own SIGTERM handler only stops scheduling new jobs and
  waits for the running ones, and a job that ignored the signal would run its cell to the end.

So each long job turns the signal into ``Preempted`` at a point where what it saved is
consistent, and exits non-zero: Snakemake then marks the job failed and deletes its declared
outputs, and the rerun continues from the state kept beside them (the episode journal, the
last complete checkpoint). ``coordgap.logs.job_log`` logs ``Preempted`` in one line and exits
with 128 + the signal number, as a shell reports a process the signal killed.

Two forms, for the two kinds of loop:

- Synchronous loops (training) use ``preemptible()``. The signal raises ``Preempted`` at once,
  wherever the main thread is, abandoning the step in progress, except inside
  ``guard.deferred()``, which holds the signal until the block ends: wrap each checkpoint
  write in it, so that a checkpoint is either complete or not started::

      with preemptible() as guard:
          for step in range(first, steps):
              batch = run(play_rollouts(step))     # async rollouts: see run() below
              loss = train_step(model, batch)      # a signal here abandons the step
              with guard.deferred():               # ...but never cuts a checkpoint in half
                  save_checkpoint(step)

  A long native call (one forward pass) delays the exception until it returns, as with
  Ctrl-C: Python runs signal handlers between bytecodes.
- asyncio jobs (episode generation) use ``run(main())`` in place of ``asyncio.run``. The signal
  cancels ``main`` at its current await; the synchronous code between two awaits is never cut,
  so a write done without awaiting is whole or not begun. Once ``main`` has unwound,
  ``Preempted`` is raised. ``run`` may be called inside ``preemptible()``: its handlers replace
  the outer ones while the loop runs and give them back after.

Both restore the previous handlers on exit. Python runs signal handlers in the main thread
only, so in another thread (a Snakemake ``run:`` block) both install nothing and stop nothing.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterator, Sequence
    from types import FrameType

T = TypeVar("T")

# What Slurm and a terminal send; SIGKILL cannot be caught, and needs the journal alone.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
    """A signal stopped the job at a safe point: saved state is consistent, a rerun continues.

    Args:
        signum: The signal that stopped the job.

    Attributes:
        signum: The signal that stopped the job.
        exit_code: 128 + ``signum``, the status a shell reports for a process the signal killed.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(
            f"stopped by {signal.Signals(signum).name}; saved state is kept and a rerun "
            "continues from it"
        )


class Guard:
    """The handle ``preemptible()`` yields: knows whether a signal came, defers it on request."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._deferring = 0

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold a signal while the block runs (a checkpoint write); raise it when the block ends.

        Raises:
            Preempted: At the end of the block, when a signal came before or during it.
        """
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        # Not in the finally: an error of the block itself goes first.
        if self._deferring == 0 and self.signum is not None:
            raise Preempted(self.signum)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signum = self.signum or signum
        if not self._deferring:
            raise Preempted(signum)


@contextmanager
def preemptible(signals: Sequence[signal.Signals] = STOP_SIGNALS) -> Iterator[Guard]:
    """Turn ``signals`` into ``Preempted`` in the main thread while the block runs.

    Args:
        signals: The signals that stop the job.

    Yields:
        The guard, whose ``deferred()`` protects writes that must not be cut.

    Raises:
        Preempted: Where the main thread is when a signal arrives, or at the end of a
            ``deferred()`` block that held it.
    """
    guard = Guard()
    previous = {sig: signal.signal(sig, guard._on_signal) for sig in _installable(signals)}
    try:
        yield guard
    finally:
        _restore(previous)


def run(main: Coroutine[Any, Any, T], signals: Sequence[signal.Signals] = STOP_SIGNALS) -> T:
    """Run ``main`` like ``asyncio.run``; ``signals`` cancel it, and it ends in ``Preempted``.

    Args:
        main: The job's coroutine.
        signals: The signals that stop the job.

    Returns:
        What ``main`` returns when no signal came.

    Raises:
        Preempted: After ``main`` unwound from the cancellation a signal caused.
    """
    signals = _installable(signals)
    previous = {sig: signal.getsignal(sig) for sig in signals}
    try:
        return asyncio.run(_cancelled_by(main, signals))
    finally:
        # The loop's remove_signal_handler resets to the defaults, not to what was there.
        _restore(previous)


def _installable(signals: Sequence[signal.Signals]) -> Sequence[signal.Signals]:
    """``signals`` in the main thread; none elsewhere, where no handler can be installed."""
    return signals if threading.current_thread() is threading.main_thread() else ()


def _restore(handlers: dict[signal.Signals, Any]) -> None:
    """Put back the handlers that were installed before ours."""
    for sig, handler in handlers.items():
        # None: a handler installed from C, which Python cannot reinstall; the default is the
        # nearest it can do.
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)


async def _cancelled_by(main: Coroutine[Any, Any, T], signals: Sequence[signal.Signals]) -> T:
    """Await ``main`` in the current task, which each of ``signals`` cancels."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    received: list[int] = []

    def stop(signum: int) -> None:
        received.append(signum)
        task.cancel()

    for sig in signals:
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await main
    except asyncio.CancelledError:
        if not received:
            raise
        raise Preempted(received[0]) from None
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
