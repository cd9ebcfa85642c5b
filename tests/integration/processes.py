"""Helpers for the servers that integration tests and benchmarks start as subprocesses."""

from __future__ import annotations

import subprocess


def stop(process: subprocess.Popen) -> None:
    """Stop a server we started, by its own PID: terminate, then kill if it lingers."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
