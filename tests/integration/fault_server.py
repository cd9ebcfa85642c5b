"""A scripted OpenAI-compatible chat server on loopback, for fault-injection tests and benchmarks.

Each request to ``POST /v1/chat/completions`` is answered by the next behaviour of a script;
the last one repeats once the script is used up. Every request's headers and body are recorded.

In a test::

    with FaultServer([rate_limited("1"), ok("eat")]) as server:
        ...  # point a client at server.base_url, then inspect server.requests

From a shell (serves one behaviour, forever, and prints its port first)::

    python -m tests.integration.fault_server --latency-ms 100
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.integration.loopback import LoopbackHandler, LoopbackServer

if TYPE_CHECKING:
    from collections.abc import Sequence

USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How to answer one request.

    Attributes:
        status: The HTTP status; not 200 sends an OpenAI-style error body.
        calls: The tool calls of a 200 answer, as ``(name, arguments JSON text)``.
        content: The message text of a 200 answer (None is JSON null).
        delay_s: Seconds to wait before answering.
        retry_after: The Retry-After header of an error answer.
        echo_key: Quote the presented API key in the error message, as OpenAI's 401 does.
        body: Bytes sent as they are, with ``status``, instead of a scripted JSON answer.
        headers: Extra headers of a ``body`` answer (Content-Type, Content-Encoding, ...).
        cut_after: Send only this many bytes of ``body`` (its full length declared), then
            close the connection: a reply cut off in transit.
        finish_reason: The finish_reason of a 200 answer; None for what its content implies.
        together: Hold every answer until this many requests have reached a ``together``
            behaviour since the script began (0: answer at once): a client that never keeps
            that many in flight gets no answer.
    """

    status: int = 200
    calls: tuple[tuple[str, str], ...] = ()
    content: str | None = None
    delay_s: float = 0.0
    retry_after: str | None = None
    echo_key: bool = False
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    cut_after: int | None = None
    finish_reason: str | None = None
    together: int = 0


def ok(name: str, arguments: str = "{}", delay_s: float = 0.0) -> Behaviour:
    """One tool call; also the hallucinated-name and bad-arguments cases, by their inputs."""
    return Behaviour(calls=((name, arguments),), delay_s=delay_s)


def fixed_latency(ms: float, name: str = "think") -> Behaviour:
    """A valid call after ``ms`` milliseconds: a model server of known speed, for benchmarks."""
    return ok(name, delay_s=ms / 1000)


def all_at_once(count: int, name: str = "think") -> Behaviour:
    """A valid call, answered once ``count`` requests wait at once: proof of concurrency that
    no machine's load can fake or spoil, as a wall-clock bound can."""
    return Behaviour(calls=((name, "{}"),), together=count)


def text_only(text: str = "I would like to eat now.") -> Behaviour:
    """Text and no tool call."""
    return Behaviour(content=text)


def cut_off(content: str | None = "Let me think about the forks", *calls: str) -> Behaviour:
    """A reply that ended at the completion token limit (``finish_reason: length``)."""
    return Behaviour(
        content=content, calls=tuple((name, "{}") for name in calls), finish_reason="length"
    )


def empty() -> Behaviour:
    """Neither text nor tool call."""
    return Behaviour(content="")


def two_calls(first: str = "pick_up_left", second: str = "pick_up_right") -> Behaviour:
    """Two tool calls in one message."""
    return Behaviour(calls=((first, "{}"), (second, "{}")))


def rate_limited(retry_after: str | None = "1") -> Behaviour:
    """HTTP 429, with a Retry-After of seconds or an HTTP date (None: no header)."""
    return Behaviour(status=429, retry_after=retry_after)


def failing(status: int = 500) -> Behaviour:
    """An error status with an OpenAI-style error body."""
    return Behaviour(status=status)


def unauthorized() -> Behaviour:
    """HTTP 401 whose message quotes the key, as OpenAI's does: bait for leaks downstream."""
    return Behaviour(status=401, echo_key=True)


def raw(
    body: bytes,
    status: int = 200,
    content_type: str = "application/json",
    cut_after: int | None = None,
    headers: dict[str, str] | None = None,
) -> Behaviour:
    """Any bytes with any status: the replies of proxies, gateways and broken servers."""
    pairs = (("Content-Type", content_type), *(headers or {}).items())
    return Behaviour(status=status, body=body, headers=pairs, cut_after=cut_after)


def proxy_error_page() -> Behaviour:
    """HTTP 200 with an HTML error page, as a proxy in front of an overloaded server sends."""
    page = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
    return raw(page, content_type="text/html")


def no_choices() -> Behaviour:
    """HTTP 200 with a chat completion whose ``choices`` list is empty."""
    return raw(json.dumps(completion_body("fault", choices=[])).encode())


def hang(seconds: float = 30.0) -> Behaviour:
    """Answer only after ``seconds``, past any sensible client timeout."""
    return ok("think", delay_s=seconds)


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the server saw it."""

    headers: dict[str, str]
    body: dict[str, Any]
    # time.perf_counter() at arrival, for tests of request pacing.
    received_s: float = field(default_factory=time.perf_counter)


def dead_endpoint() -> str:
    """The base URL of a loopback port nobody listens on: every call is refused, as by a dead
    server (the port was free a moment ago; nothing here binds it again)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/v1"


def api_model_entry(base_url: str, **settings: Any) -> dict[str, Any]:
    """A config entry of a hosted-API model (kind openai, no serve:) that plays against
    ``base_url`` with the short timeouts and retries of these tests; ``settings`` override."""
    return {
        "kind": "openai",
        "provider": "openai",
        "base_url": base_url,
        "model": "fault-model",
        "api_key_env": None,
        "temperature": 0.7,
        "top_p": 1.0,
        "max_tokens": 64,
        "extra_body": {},
        "model_kwargs": {},
        "tool_choice": "auto",
        "timeout_s": 0.5,
        "max_retries": 1,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.05,
        "requests_per_second": None,
        "max_in_flight": 2,
        "serve": None,
        "episodes_per_cell": 6,
    } | settings


class FaultServer(LoopbackServer):
    """The scripted server, run in a background thread while used as a context manager.

    Attributes:
        requests: Every chat-completion request received, in arrival order.
    """

    def __init__(self, script: Sequence[Behaviour], port: int = 0) -> None:
        if not script:
            raise ValueError("the script needs at least one behaviour")
        super().__init__(_Handler, port)
        self.requests: list[RecordedRequest] = []
        self._script = list(script)
        # Requests answered from the current script (restart begins a new one).
        self._served = 0
        self._lock = threading.Lock()
        # Set on shutdown so that delayed answers (hang) stop waiting at once.
        self._stopping = threading.Event()
        # Requests that reached a ``together`` behaviour, and their waiting room.
        self._gathered = 0
        self._gathering = threading.Condition()

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of the server, ``http://127.0.0.1:<port>/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        """Stop serving; delayed answers (hang) stop waiting at once."""
        self._stopping.set()
        with self._gathering:
            self._gathering.notify_all()
        super().close()

    def restart(self, script: Sequence[Behaviour]) -> None:
        """Answer from the next request on with ``script``, from its first behaviour.

        The recorded requests are kept; requests already waiting (a hang) keep their answer.
        """
        if not script:
            raise ValueError("the script needs at least one behaviour")
        with self._lock:
            self._script = list(script)
            self._served = 0
        with self._gathering:
            self._gathered = 0

    def _next(self, request: RecordedRequest) -> Behaviour:
        """Record ``request`` and return the behaviour that answers it."""
        with self._lock:
            self.requests.append(request)
            self._served += 1
            return self._script[min(self._served, len(self._script)) - 1]

    def _gather(self, count: int) -> bool:
        """Wait until ``count`` requests have come here; False if the server stopped first."""
        with self._gathering:
            self._gathered += 1
            self._gathering.notify_all()
            self._gathering.wait_for(lambda: self._gathered >= count or self._stopping.is_set())
            return not self._stopping.is_set()


class _Handler(LoopbackHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        fault = self.server.owner
        behaviour = fault._next(RecordedRequest(dict(self.headers.items()), body))
        if behaviour.delay_s and fault._stopping.wait(behaviour.delay_s):
            return
        if behaviour.together and not fault._gather(behaviour.together):
            return
        if behaviour.body is not None:
            self._send_bytes(
                behaviour.status, behaviour.body, behaviour.headers, behaviour.cut_after
            )
        elif behaviour.status != 200:
            self._send_error(behaviour)
        else:
            self._send(200, _completion(behaviour, body.get("model", "fault")))

    def _send_error(self, behaviour: Behaviour) -> None:
        message = f"scripted HTTP {behaviour.status}"
        if behaviour.echo_key:
            message = f"Incorrect API key provided: {self.headers.get('Authorization', '')}"
        headers = {"Retry-After": behaviour.retry_after} if behaviour.retry_after else {}
        self._send(behaviour.status, {"error": {"message": message, "type": "fault"}}, headers)

    def _send(
        self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        pairs = (("Content-Type", "application/json"), *(headers or {}).items())
        self._send_bytes(status, json.dumps(payload).encode(), pairs)

    def _send_bytes(
        self,
        status: int,
        data: bytes,
        headers: Sequence[tuple[str, str]],
        cut_after: int | None = None,
    ) -> None:
        try:
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:cut_after])
        except OSError:
            # The client gave up (its timeout) and closed the connection: nothing to answer.
            self.close_connection = True
        if cut_after is not None:
            self.close_connection = True


def message_body(content: str | None, calls: Sequence[tuple[object, object]]) -> dict[str, Any]:
    """An assistant message with ``content`` and ``(name, arguments)`` calls, as JSON values.

    A well-formed call has a string name and its arguments as JSON text; other values make
    the malformed calls of broken servers.
    """
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}
            for i, (name, args) in enumerate(calls)
        ]
    return message


def completion_body(model: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    """An OpenAI chat-completion body with the given ``choices`` and fixed usage."""
    return {
        "id": "chatcmpl-fault",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": choices,
        "usage": USAGE,
    }


def _completion(behaviour: Behaviour, model: str) -> dict[str, Any]:
    """Return the OpenAI chat-completion body of a 200 behaviour."""
    choice = {
        "index": 0,
        "message": message_body(behaviour.content, behaviour.calls),
        "finish_reason": behaviour.finish_reason or ("tool_calls" if behaviour.calls else "stop"),
    }
    return completion_body(model, [choice])


def main() -> None:
    """Serve a fixed-latency valid call until killed; print the port first, on its own line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--tool", default="think")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with FaultServer([fixed_latency(args.latency_ms, args.tool)], port=args.port) as server:
        print(server.port, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
