"""Model servers started inside a job: start, wait for health, play, stop by PID.

A model entry of kind ``openai`` with a ``serve:`` block is played through a server that its
own job starts (vLLM on a GPU node; llama.cpp's server in the tests): ``launch`` takes any
server command, so nothing here is specific to one server. The server:

- listens on a free port of the loopback address by default, or of the node's own address
  when the job's profile asks (``serve_host: node``);
- requires a random API key made for this job alone. The key reaches the server through the
  environment variable the server reads it from (``serve.key_env``) and the ``openai``
  backend through ``SERVED_KEY_ENV``; it is never on a command line (``ps`` shows those), and
  it is struck out of every line of server output before that line reaches the job's log or
  an error message;
- keeps its caches (vLLM's, Triton's, the hub's) under the site file's scratch folder, as a
  training job does (``coordgap.site.cache_variables``), and runs with the model hub offline
  (``HF_HUB_OFFLINE=1``): its weights were prepared at a pinned commit before any GPU job
  (``coordgap.models.prepare``), so a server that would still fetch something from the hub
  fails at once instead of spending GPU time on an unpinned download;
- is ready when its health path answers 200 to a request carrying the key. A server that
  exits first, or is not ready within ``start_timeout_s``, stops the job with a
  ``ServerStartError`` holding the last lines of the server's output;
- is stopped when the block ends, however it ends (an error, ``Preempted`` from SIGTERM or
  SIGINT): SIGTERM to its process group, then SIGKILL after a grace period. It runs in a
  session of its own, so that group is the server and whatever it started (vLLM's engine
  processes), and on Linux the kernel sends it SIGTERM when the job's process dies, so a
  SIGKILLed job leaves no server behind either.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import os
import secrets
import signal
import socket
import string
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordgap.config.play import ModelSpec
from coordgap.errors import ExpectedFailure
from coordgap.site import cache_variables, load_site

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

logger = logging.getLogger(__name__)

# The variable the openai backend reads the job's key from while its server runs.
SERVED_KEY_ENV = "COORDGAP_SERVED_API_KEY"
# Where a server listens: the loopback address, or the node's own (for clients elsewhere).
SERVE_HOSTS = ("loopback", "node")
# Lines of server output kept for the error message of a failed start.
TAIL_LINES = 40
# How long a stopped server may take to shut down before it is killed.
STOP_GRACE_S = 30.0
_REDACTED = "[job key]"
_PR_SET_PDEATHSIG = 1


class ServerStartError(ExpectedFailure, RuntimeError):
    """A model server exited, or did not become healthy, before the job could use it."""


def listen_address(serve_host: str) -> str:
    """The address a server binds: 127.0.0.1 for ``loopback``, this node's for ``node``.

    Args:
        serve_host: ``loopback`` or ``node``.

    Returns:
        An IPv4 address.

    Raises:
        ValueError: ``serve_host`` is neither.
    """
    if serve_host == "loopback":
        return "127.0.0.1"
    if serve_host == "node":
        return socket.gethostbyname(socket.gethostname())
    raise ValueError(f"serve_host must be one of {', '.join(SERVE_HOSTS)}, not {serve_host!r}")


def free_port(host: str) -> int:
    """A port of ``host`` that was free a moment ago; the server binds it right after."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A running server, as its clients see it.

    Attributes:
        base_url: ``http://<host>:<port>/v1``.
        pid: The server's process id (its process group's id too).
        key_env: The variable of this process that holds the server's key.
    """

    base_url: str
    pid: int
    key_env: str


@contextmanager
def launch(
    command: Sequence[str],
    *,
    key_env: str,
    health: str,
    start_timeout_s: float,
    host: str = "127.0.0.1",
    fields: Mapping[str, str] | None = None,
    environment: Mapping[str, str] | None = None,
) -> Iterator[Endpoint]:
    """Start a server command, wait until it is healthy, yield its endpoint, stop it.

    Args:
        command: The server's command line, a template: ``{host}`` and ``{port}`` are filled
            in here, the other placeholders from ``fields``.
        key_env: The environment variable the server reads its API key from.
        health: The path polled, with the key, until it answers 200 (e.g. ``/health``).
        start_timeout_s: How long the server may take to become healthy.
        host: The address to listen on.
        fields: Values of the template's other placeholders.
        environment: Variables the server runs with beside this process's (cache folders).

    Yields:
        The endpoint. While the block runs, ``SERVED_KEY_ENV`` holds the key in this process.

    Raises:
        ServerStartError: The server exited or was not healthy in time; the message has the
            last lines of its output.
    """
    port = free_port(host)
    argv = [arg.format(**(fields or {}), host=host, port=port) for arg in command]
    key = secrets.token_urlsafe(32)
    # The key by environment, never by argument: command lines are visible to every user.
    server_env = {**os.environ, **(environment or {}), "HF_HUB_OFFLINE": "1", key_env: key}
    server_env.pop(SERVED_KEY_ENV, None)
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=server_env,
        start_new_session=True,
        preexec_fn=_die_with_parent(os.getpid()),
    )
    pump = _OutputPump(process, key)
    logger.info("started %s (pid %d) on %s:%d", Path(argv[0]).name, process.pid, host, port)
    previous = os.environ.get(SERVED_KEY_ENV)
    os.environ[SERVED_KEY_ENV] = key
    try:
        base = f"http://{host}:{port}"
        _wait_until_healthy(process, pump, f"{base}{health}", key, start_timeout_s)
        yield Endpoint(f"{base}/v1", process.pid, SERVED_KEY_ENV)
    finally:
        if previous is None:
            os.environ.pop(SERVED_KEY_ENV, None)
        else:
            os.environ[SERVED_KEY_ENV] = previous
        stop(process)
        pump.join()


@contextmanager
def serve_model(model: ModelSpec, weights: Path | None, serve_host: str) -> Iterator[ModelSpec]:
    """Start a served model's server; yield the model pointed at it (see ``serve_models``).

    Args:
        model: An ``openai`` model with a ``serve`` block, or a checkpoint of one.
        weights: Its prepared weights folder (``serve.source``), or None.
        serve_host: ``loopback`` or ``node`` (see ``listen_address``).

    Yields:
        The model with ``base_url``, ``api_key_env`` and ``model`` set to its server's.

    Raises:
        ServerStartError: The server did not start.
    """
    with serve_models([model], weights, serve_host) as (served,):
        yield served


@contextmanager
def serve_models(
    models: Sequence[ModelSpec], weights: Path | None, serve_host: str
) -> Iterator[list[ModelSpec]]:
    """Start one server for models that share a base model; yield them pointed at it.

    The models are the base model itself, or checkpoints of it (entries whose ``adapter`` is
    set, see ``coordgap.evaluation.checkpoints.checkpoint_model``). Checkpoints are served as
    LoRA modules of the one base model, with ``serve.lora`` appended to the command (see
    ``lora_arguments``), and each is asked for by its module's name: a run's validation plays
    all its checkpoints through one server, paying the server's start once.

    Args:
        models: The first model's ``serve`` block starts the server; all have the same one.
        weights: The base model's prepared weights folder (``serve.source``), or None.
        serve_host: ``loopback`` or ``node`` (see ``listen_address``).

    Yields:
        The models, in order, with ``base_url``, ``api_key_env`` and ``model`` set to their
        server's and ``serve`` cleared (their server runs: nothing is left to start).

    Raises:
        ServerStartError: The server did not start.
        ValueError: A checkpoint's base model has no ``serve.lora``, or the models do not
            share one server.
    """
    first = models[0]
    serve = first.entry["serve"]
    if any(model.entry["serve"] != serve for model in models):
        raise ValueError(f"models {[m.name for m in models]} do not share one server")
    entries = [dict(model.entry) for model in models]
    adapters = [entry.get("adapter") for entry in entries]  # set on checkpoints only
    command = list(serve["command"])
    if any(adapter is not None for adapter in adapters):
        if serve["lora"] is None:
            raise ValueError(f"model '{first.name}': a checkpoint needs serve.lora to be served")
        if None in adapters:
            raise ValueError("a server serves either its base model or checkpoints, not both")
        command += lora_arguments(serve["lora"], [Path(adapter) for adapter in adapters])
        for entry, adapter in zip(entries, adapters, strict=True):
            entry["model"] = Path(adapter).name
    fields = {"model": first.entry["model"], "weights": str(weights.resolve()) if weights else ""}
    with launch(
        command,
        key_env=serve["key_env"],
        health=serve["health"],
        start_timeout_s=serve["start_timeout_s"],
        host=listen_address(serve_host),
        fields=fields,
        # vLLM's, Triton's and the hub's caches under the site's scratch folder, as ART's.
        environment=cache_variables(load_site().scratch),
    ) as endpoint:
        running = {"base_url": endpoint.base_url, "api_key_env": endpoint.key_env, "serve": None}
        yield [
            ModelSpec.from_dict(model.name, entry | running)
            for model, entry in zip(models, entries, strict=True)
        ]


def lora_arguments(template: Sequence[str], adapters: Sequence[Path]) -> list[str]:
    """``serve.lora`` filled in for adapters: each item with a placeholder once per adapter.

    Items without a placeholder (``--enable-lora``, ``--lora-modules``) appear once; an item
    with ``{adapter_name}`` (the folder's name, which the model is asked for as) or
    ``{adapter}`` (its resolved path) is repeated in place for every adapter, so vLLM's
    ``--lora-modules "{adapter_name}={adapter}"`` becomes ``--lora-modules a=... b=...``.

    Args:
        template: The ``serve.lora`` items.
        adapters: The adapter folders, in order.

    Returns:
        The arguments.
    """
    arguments = []
    for item in template:
        fields = {field for _, field, _, _ in string.Formatter().parse(item) if field}
        arguments += [
            item.format(adapter=str(adapter.resolve()), adapter_name=adapter.name)
            for adapter in (adapters if fields else adapters[:1])
        ]
    return arguments


def stop(process: subprocess.Popen[Any], grace_s: float = STOP_GRACE_S) -> None:
    """Stop a server and what it started: SIGTERM to its process group, then SIGKILL.

    Args:
        process: A process started in a session of its own (``start_new_session=True``).
        grace_s: Seconds the server has to shut down before it is killed.
    """
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        logger.warning("server (pid %d) ignored SIGTERM for %.0f s", process.pid, grace_s)
    # Whatever is left of the group: the server if it lingered, processes it left behind.
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()
    logger.info("server (pid %d) stopped with status %s", process.pid, process.returncode)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to a process group, if any process of it is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _die_with_parent(parent: int) -> Any:
    """A ``preexec_fn`` asking the kernel to SIGTERM the child when this process dies.

    ``prctl`` is looked up here, in the parent, so that the child only makes the call. Only
    Linux has it; elsewhere the server is stopped only by ``stop``.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        # The parent may have died before the request: then nothing would ever come.
        if os.getppid() != parent:
            os._exit(1)

    return preexec


class _OutputPump:
    """Copies a server's output into the job's log, its key struck out; keeps the last lines.

    A pipe nobody read would fill up and block the server, so a thread reads it to the end.
    """

    def __init__(self, process: subprocess.Popen[bytes], key: str) -> None:
        self._key = key
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._thread = threading.Thread(
            target=self._copy, args=(process.stdout,), name="server-output", daemon=True
        )
        self._thread.start()

    def _copy(self, stream: Any) -> None:
        for raw in stream:
            line = raw.decode("utf-8", errors="replace").rstrip().replace(self._key, _REDACTED)
            self.tail.append(line)
            logger.info("server: %s", line)
        stream.close()

    def text(self) -> str:
        """The last lines of output, one per line."""
        return "\n".join(self.tail)

    def join(self) -> None:
        """Wait for the output to end (the server has exited)."""
        self._thread.join(timeout=10)


def _wait_until_healthy(
    process: subprocess.Popen[bytes], pump: _OutputPump, url: str, key: str, timeout_s: float
) -> None:
    """Poll ``url`` with the key until it answers 200; raise if the server dies or is late."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            pump.join()
            raise ServerStartError(
                f"the model server exited with status {process.returncode} before it was "
                f"ready. Its last lines:\n{pump.text()}"
            )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    logger.info("server ready at %s", url)
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet, or not ready (vLLM answers 503 while loading)
        if time.monotonic() > deadline:
            raise ServerStartError(
                f"the model server was not ready within {timeout_s:.0f} s (serve."
                f"start_timeout_s). Its last lines:\n{pump.text()}"
            )
        time.sleep(0.5)
