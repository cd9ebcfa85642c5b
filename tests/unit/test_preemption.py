"""The preemption guards with real signals sent to this process, and how the job log ends."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from coordgap import preemption
from coordgap.config.keys import ConfigError
from coordgap.logs import job_log
from coordgap.preemption import Preempted, preemptible

pytestmark = pytest.mark.unit


def _send(signum: signal.Signals) -> None:
    os.kill(os.getpid(), signum)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_block_at_once_and_the_handlers_come_back(
    signum: signal.Signals,
) -> None:
    before = signal.getsignal(signum)
    reached = []

    def step() -> None:
        with preemptible():
            _send(signum)
            reached.append("after the signal")

    with pytest.raises(Preempted) as caught:
        step()
    assert not reached
    assert caught.value.signum == signum
    assert caught.value.exit_code == 128 + signum
    assert signal.getsignal(signum) is before


def test_a_deferred_block_finishes_before_the_signal_is_raised() -> None:
    written = []

    def steps() -> None:
        with preemptible() as guard:
            with guard.deferred():
                _send(signal.SIGTERM)
                written.append("checkpoint")
            written.append("next step")

    with pytest.raises(Preempted):
        steps()
    assert written == ["checkpoint"]


def test_an_error_inside_a_deferred_block_is_not_masked() -> None:
    def failing_write() -> None:
        with preemptible() as guard, guard.deferred():
            _send(signal.SIGTERM)
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        failing_write()


def test_no_signal_no_preemption() -> None:
    with preemptible() as guard:
        with guard.deferred():
            pass
        assert guard.signum is None


def test_run_cancels_the_coroutine_lets_it_clean_up_then_raises() -> None:
    cleaned = []

    async def job() -> None:
        asyncio.get_running_loop().call_later(0.05, _send, signal.SIGTERM)
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append(True)

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted) as caught:
        preemption.run(job())
    assert cleaned == [True]
    assert caught.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_run_returns_what_the_coroutine_returns() -> None:
    async def job() -> int:
        await asyncio.sleep(0)
        return 7

    assert preemption.run(job()) == 7


def test_outside_the_main_thread_the_guards_install_nothing() -> None:
    async def job() -> int:
        await asyncio.sleep(0)
        return 7

    def in_a_thread() -> int:
        with preemptible():
            return preemption.run(job())

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(in_a_thread).result() == 7


def test_run_inside_preemptible_gives_the_outer_handlers_back() -> None:
    async def job() -> None:
        await asyncio.sleep(0)

    def rollouts_then_a_signal() -> None:
        with preemptible():
            preemption.run(job())
            # The outer guard handles signals again once the loop is gone.
            _send(signal.SIGTERM)

    with pytest.raises(Preempted):
        rollouts_then_a_signal()


def test_a_job_log_that_succeeded_ends_with_its_wall_time(tmp_path) -> None:
    path = tmp_path / "job.log"
    with job_log(path, "job") as log:
        log.info("working")
    lines = path.read_text().splitlines()
    assert "job: working" in lines[0]
    assert re.search(r"INFO job: job done in \d+\.\d s$", lines[-1])


def test_the_job_log_records_a_preemption_in_one_line_and_exits_with_its_code(tmp_path) -> None:
    path = tmp_path / "job.log"
    with pytest.raises(SystemExit) as caught, job_log(path, "job"):
        raise Preempted(signal.SIGTERM)
    assert caught.value.code == 143
    log = path.read_text()
    assert "stopped by SIGTERM" in log
    assert "Traceback" not in log


def test_the_job_log_ends_an_expected_failure_with_its_message_and_no_traceback(tmp_path) -> None:
    path = tmp_path / "job.log"
    message = "config key 'models.gpt': no such model"
    with pytest.raises(SystemExit) as caught, job_log(path, "job"):
        raise ConfigError(message)
    # A string code: Python prints it to stderr and exits with status 1.
    assert caught.value.code == f"ConfigError: {message}\nThe job's log: {path}"
    assert caught.value.__suppress_context__
    log = path.read_text()
    assert f"ERROR job: ConfigError: {message}" in log
    assert "Traceback" not in log


def test_the_job_log_keeps_an_unexpected_error_s_traceback(tmp_path) -> None:
    path = tmp_path / "job.log"
    with pytest.raises(ValueError, match="a bug"), job_log(path, "job"):
        raise ValueError("a bug")
    log = path.read_text()
    assert "ERROR job: job failed" in log
    assert "Traceback" in log
    assert "ValueError: a bug" in log


def test_a_job_s_exit_skips_collecting_the_garbage_of_what_it_loaded(tmp_path) -> None:
    # An exit handler registered before the job's log runs after the log's own (last in,
    # first out): by then the collector must have frozen every object alive.
    job = (
        "import atexit, gc\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count()))\n"
        "from coordgap.logs import job_log\n"
        f"with job_log({str(tmp_path / 'job.log')!r}, 'job'):\n"
        "    pass\n"
    )
    done = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True, check=True)
    frozen = int(done.stdout.split()[-1])
    assert frozen > 1000, done.stdout
