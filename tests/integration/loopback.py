"""An HTTP server on a free loopback port, serving from a background thread while in use.

The scripted servers of the integration tests (``fault_server``, ``provider_servers``) share
it: they differ in what they answer, not in how they listen, start and stop.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from types import TracebackType


class _HTTPServer(ThreadingHTTPServer):
    # The default backlog of 5 drops connections when 64 clients connect at once.
    request_queue_size = 256
    owner: Any


class LoopbackHandler(BaseHTTPRequestHandler):
    """A request handler of a ``LoopbackServer``; ``self.server.owner`` is that server."""

    # HTTP/1.1 keeps connections alive, as real model servers do; every answer has a length.
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; Nagle would hold the second back for an ACK.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: a test's output should be its own."""


class LoopbackServer:
    """Listens on ``127.0.0.1`` and serves requests while used as a context manager.

    Args:
        handler: The request handler class; it reaches this object as ``self.server.owner``.
        port: The port to listen on; 0 for a free one.
    """

    def __init__(self, handler: type[LoopbackHandler], port: int = 0) -> None:
        self._http = _HTTPServer(("127.0.0.1", port), handler)
        self._http.owner = self
        # A short poll interval makes shutdown, hence every test's teardown, quick.
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        """The loopback port the server listens on."""
        return self._http.server_address[1]

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving, close the socket and wait for the server thread."""
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()
