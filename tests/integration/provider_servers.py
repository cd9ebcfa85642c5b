"""Scripted loopback servers that speak the wire formats of Anthropic, Gemini and OpenAI.

They let tests drive the real client libraries (the anthropic and google-genai SDKs under their
LangChain integrations, and the openai SDK under langchain-openai) against replies and errors
shaped like the providers' own, without a network or a key. Each server answers request after
request from a script of ``Reply`` values (the last one repeats once the script is used up)
and records every request's path, headers and JSON body.

In a test::

    with AnthropicServer([rate_limited("3"), call("eat")]) as server:
        ...  # point the client at server.base_url, then inspect server.requests

The shapes follow the providers' documented formats:

* ``AnthropicServer``: ``POST /v1/messages``. Replies are Messages API ``message`` objects;
  errors are ``{"type": "error", "error": {"type": ..., "message": ...}}`` with the status
  Anthropic uses for each type. Like Anthropic's newer models it refuses, with HTTP 400, a
  request that sets both ``temperature`` and ``top_p``.
* ``GeminiServer``: ``POST /{version}/models/{model}:generateContent``. Replies are
  ``GenerateContentResponse`` objects; errors are Google's ``{"error": {"code", "message",
  "status"}}``. A wrong key gets what Gemini answers to one: HTTP 400 ``INVALID_ARGUMENT``.
* ``OpenAIServer``: ``POST /v1/chat/completions``. Like GPT-5-class models it can refuse
  ``top_p`` with HTTP 400 ``unsupported_parameter`` (``refuse_top_p``).

Every server checks the presented key against ``expected_key`` when one is set.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from tests.integration.loopback import LoopbackHandler, LoopbackServer

if TYPE_CHECKING:
    from collections.abc import Sequence

PROMPT_TOKENS = 11
COMPLETION_TOKENS = 7
# The words of Anthropic's refusal of a request that sets both sampling parameters.
BOTH_SAMPLING_MESSAGE = (
    "`temperature` and `top_p` cannot both be specified for this model. Please use only one."
)
# What Gemini answers a key it does not know, with HTTP 400.
GEMINI_BAD_KEY_MESSAGE = "API key not valid. Please pass a valid API key."
# What an OpenAI reasoning model answers a request that sets top_p.
OPENAI_TOP_P_MESSAGE = "Unsupported parameter: 'top_p' is not supported with this model."

Kind = Literal["call", "text", "truncated", "error"]


@dataclass(frozen=True, slots=True)
class Reply:
    """How to answer one request, in whichever provider's format the server speaks.

    Attributes:
        kind: ``"call"`` (one tool call and no text), ``"text"`` (text and no call),
            ``"truncated"`` (the token limit hit: no call, little or no text) or ``"error"``.
        name: The called tool's name, for ``"call"``.
        text: The message text, for ``"text"`` (and the partial text of ``"truncated"``).
        status: The HTTP status of an ``"error"``.
        message: The error message; None for the provider's usual one for ``status``.
        retry_after: The Retry-After header of an ``"error"``.
    """

    kind: Kind = "call"
    name: str = "eat"
    text: str = "I would like to eat now."
    status: int = 200
    message: str | None = None
    retry_after: str | None = None


def call(name: str = "eat") -> Reply:
    """One tool call with no arguments."""
    return Reply(kind="call", name=name)


def text(words: str = "I would like to eat now.") -> Reply:
    """Text and no tool call."""
    return Reply(kind="text", text=words)


def truncated(words: str = "") -> Reply:
    """The completion token limit reached before any call: no call and ``words`` of text."""
    return Reply(kind="truncated", text=words)


def error(status: int, message: str | None = None, retry_after: str | None = None) -> Reply:
    """An error answer in the provider's error format."""
    return Reply(kind="error", status=status, message=message, retry_after=retry_after)


def rate_limited(retry_after: str | None = "3") -> Reply:
    """HTTP 429 with a Retry-After header (None: without one)."""
    return error(429, retry_after=retry_after)


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as a server saw it.

    Attributes:
        path: The request target, query string included.
        headers: The request headers, with their names lower-cased.
        body: The JSON body (an empty dict for none).
    """

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer: status, JSON payload and extra headers."""

    status: int
    payload: dict[str, Any]
    headers: tuple[tuple[str, str], ...] = ()


class ProviderServer(LoopbackServer):
    """A scripted loopback server, run in a background thread while used as a context manager.

    Subclasses define the route they serve and how a ``Reply`` looks in their format.

    Args:
        script: The replies, one per request; the last one repeats.
        expected_key: The key a request must present; None accepts any (or none).

    Attributes:
        requests: Every request received on the served route, in arrival order.
    """

    #: The path (a regular expression, matched whole) of the one route served.
    route: ClassVar[re.Pattern[str]]

    def __init__(self, script: Sequence[Reply], expected_key: str | None = None) -> None:
        if not script:
            raise ValueError("the script needs at least one reply")
        super().__init__(_Handler)
        self.requests: list[RecordedRequest] = []
        self.expected_key = expected_key
        self._script = list(script)
        self._served = 0
        self._lock = threading.Lock()

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:<port>``, with no path."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The base URL the provider's client library takes."""
        return self.origin

    def answer(self, request: RecordedRequest) -> Answer:
        """Record ``request`` and answer it: a refusal of the request, or the next reply."""
        with self._lock:
            self.requests.append(request)
            self._served += 1
            reply = self._script[min(self._served, len(self._script)) - 1]
        refusal = self.refuse(request)
        if refusal is not None:
            return refusal
        if reply.kind == "error":
            return self.error_answer(reply)
        return Answer(200, self.reply_payload(reply, request))

    def error_answer(self, reply: Reply) -> Answer:
        """The answer of an ``"error"`` reply: the error body, and Retry-After if asked."""
        headers = (("Retry-After", reply.retry_after),) if reply.retry_after else ()
        return Answer(reply.status, self.error_payload(reply.status, reply.message), headers)

    def refuse(self, request: RecordedRequest) -> Answer | None:
        """The answer to a request the provider would refuse whatever the script says."""
        raise NotImplementedError

    def reply_payload(self, reply: Reply, request: RecordedRequest) -> dict[str, Any]:
        """The body of a successful answer."""
        raise NotImplementedError

    def error_payload(self, status: int, message: str | None) -> dict[str, Any]:
        """The body of an error answer with ``status``."""
        raise NotImplementedError

    def not_found(self, path: str) -> Answer:
        """The answer to a request for a route the server does not serve."""
        return Answer(404, self.error_payload(404, f"no route {path}"))


class AnthropicServer(ProviderServer):
    """Anthropic's Messages API: ``POST /v1/messages``; ``base_url`` has no ``/v1``.

    Args:
        script: The replies, one per request; the last one repeats.
        expected_key: The key a request must present, as ``x-api-key`` or as a bearer token
            (the anthropic SDK 2 sends ``api_key`` as ``Authorization: Bearer``); a wrong one
            gets HTTP 401 ``authentication_error``.

    Like Anthropic for its newer models, it answers HTTP 400 to a request that sets both
    ``temperature`` and ``top_p``.
    """

    route = re.compile(r"/v1/messages")
    ERROR_TYPES: ClassVar[dict[int, str]] = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        529: "overloaded_error",
    }
    MESSAGES: ClassVar[dict[int, str]] = {
        400: "messages: field required",
        401: "invalid x-api-key",
        403: "Your API key does not have permission to use the specified resource.",
        404: "model: not found",
        429: "Number of request tokens has exceeded your per-minute rate limit",
        500: "Internal server error",
        529: "Overloaded",
    }

    def refuse(self, request: RecordedRequest) -> Answer | None:
        """A wrong key (401), or both sampling parameters (400)."""
        if self.expected_key is not None:
            bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
            if self.expected_key not in (request.headers.get("x-api-key"), bearer):
                return Answer(401, self.error_payload(401, None))
        body = request.body
        if "temperature" in body and "top_p" in body:
            return Answer(400, self.error_payload(400, BOTH_SAMPLING_MESSAGE))
        return None

    def reply_payload(self, reply: Reply, request: RecordedRequest) -> dict[str, Any]:
        """A Messages API ``message`` object."""
        if reply.kind == "call":
            content: list[dict[str, Any]] = [
                {"type": "tool_use", "id": "toolu_01", "name": reply.name, "input": {}}
            ]
            stop_reason = "tool_use"
        elif reply.kind == "text":
            content, stop_reason = [{"type": "text", "text": reply.text}], "end_turn"
        else:
            content = [{"type": "text", "text": reply.text}] if reply.text else []
            stop_reason = "max_tokens"
        return {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": request.body.get("model", "claude-test"),
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": COMPLETION_TOKENS},
        }

    def error_payload(self, status: int, message: str | None) -> dict[str, Any]:
        """Anthropic's error object: a type named after the status, and a message."""
        fallback = "api_error" if status >= 500 else "invalid_request_error"
        kind = self.ERROR_TYPES.get(status, fallback)
        words = message or self.MESSAGES.get(status, f"scripted HTTP {status}")
        return {"type": "error", "error": {"type": kind, "message": words}}


class GeminiServer(ProviderServer):
    """Gemini's ``POST /{version}/models/{model}:generateContent``; ``base_url`` has no path.

    google-genai 3.6 puts its API version (``v1`` by default for the Gemini Developer API,
    ``GOOGLE_GENAI_API_VERSION`` or ``api_version`` otherwise) before ``models/``; any
    version is served.

    Args:
        script: The replies, one per request; the last one repeats.
        expected_key: The key a request must present as ``x-goog-api-key``; a wrong one gets
            HTTP 400 ``INVALID_ARGUMENT``, as from Gemini.
    """

    route = re.compile(r"/(v1|v1beta|v1alpha)/models/[^/:]+:generateContent")
    STATUSES: ClassVar[dict[int, tuple[str, str]]] = {
        400: ("INVALID_ARGUMENT", "Request contains an invalid argument."),
        401: ("UNAUTHENTICATED", "Request had invalid authentication credentials."),
        403: ("PERMISSION_DENIED", "The caller does not have permission"),
        404: ("NOT_FOUND", "models/unknown is not found for API version v1beta."),
        429: ("RESOURCE_EXHAUSTED", "You exceeded your current quota."),
        500: ("INTERNAL", "An internal error has occurred."),
        503: ("UNAVAILABLE", "The model is overloaded. Please try again later."),
    }

    def refuse(self, request: RecordedRequest) -> Answer | None:
        """A wrong key: HTTP 400 ``INVALID_ARGUMENT`` with the reason ``API_KEY_INVALID``."""
        if self.expected_key is None or request.headers.get("x-goog-api-key") == self.expected_key:
            return None
        payload = self.error_payload(400, GEMINI_BAD_KEY_MESSAGE)
        payload["error"]["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "API_KEY_INVALID",
                "domain": "googleapis.com",
                "metadata": {"service": "generativelanguage.googleapis.com"},
            }
        ]
        return Answer(400, payload)

    def error_answer(self, reply: Reply) -> Answer:
        """The error, with a ``RetryInfo`` detail besides the header when a wait is asked.

        Gemini states its wait only as ``retryDelay`` in the body's details; the header is
        kept so that a test can show what a client does with either.
        """
        answer = ProviderServer.error_answer(self, reply)
        if reply.retry_after is not None and reply.retry_after.isdigit():
            answer.payload["error"]["details"] = [
                {
                    "@type": "type.googleapis.com/google.rpc.RetryInfo",
                    "retryDelay": f"{reply.retry_after}s",
                }
            ]
        return answer

    def reply_payload(self, reply: Reply, request: RecordedRequest) -> dict[str, Any]:
        """A ``GenerateContentResponse`` with one candidate."""
        if reply.kind == "call":
            parts: list[dict[str, Any]] = [{"functionCall": {"name": reply.name, "args": {}}}]
            finish = "STOP"
        elif reply.kind == "text":
            parts, finish = [{"text": reply.text}], "STOP"
        else:
            parts, finish = ([{"text": reply.text}] if reply.text else []), "MAX_TOKENS"
        content: dict[str, Any] = {"role": "model"}
        if parts:
            content["parts"] = parts
        return {
            "candidates": [{"content": content, "finishReason": finish, "index": 0}],
            "usageMetadata": {
                "promptTokenCount": PROMPT_TOKENS,
                "candidatesTokenCount": COMPLETION_TOKENS,
                "totalTokenCount": PROMPT_TOKENS + COMPLETION_TOKENS,
            },
            "modelVersion": "gemini-test",
            "responseId": "resp-01",
        }

    def error_payload(self, status: int, message: str | None) -> dict[str, Any]:
        """Google's error object: the status code, a message and the canonical status name."""
        name, words = self.STATUSES.get(status, ("UNKNOWN", f"scripted HTTP {status}"))
        return {"error": {"code": status, "message": message or words, "status": name}}


class OpenAIServer(ProviderServer):
    """OpenAI's ``POST /v1/chat/completions``; ``base_url`` ends in ``/v1``.

    Args:
        script: The replies, one per request; the last one repeats.
        expected_key: The bearer token a request must present; a wrong one gets HTTP 401
            whose message quotes the presented key, as bait for leaks downstream.
        refuse_top_p: Answer HTTP 400 ``unsupported_parameter`` to a request that sets
            ``top_p``, as OpenAI's GPT-5-class reasoning models do.
    """

    route = re.compile(r"/v1/chat/completions")
    TYPES: ClassVar[dict[int, str]] = {
        400: "invalid_request_error",
        401: "invalid_request_error",
        404: "invalid_request_error",
        429: "rate_limit_exceeded",
        500: "server_error",
    }

    def __init__(
        self,
        script: Sequence[Reply],
        expected_key: str | None = None,
        refuse_top_p: bool = False,
    ) -> None:
        super().__init__(script, expected_key)
        self.refuse_top_p = refuse_top_p

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``: the openai SDK appends ``/chat/completions``."""
        return f"{self.origin}/v1"

    def refuse(self, request: RecordedRequest) -> Answer | None:
        """A wrong key (401), or ``top_p`` when it is refused (400)."""
        if self.expected_key is not None:
            presented = request.headers.get("authorization", "").removeprefix("Bearer ")
            if presented != self.expected_key:
                message = f"Incorrect API key provided: {presented}."
                payload = self.error_payload(401, message)
                payload["error"]["code"] = "invalid_api_key"
                return Answer(401, payload)
        if self.refuse_top_p and "top_p" in request.body:
            payload = self.error_payload(400, OPENAI_TOP_P_MESSAGE)
            payload["error"].update(param="top_p", code="unsupported_parameter")
            return Answer(400, payload)
        return None

    def reply_payload(self, reply: Reply, request: RecordedRequest) -> dict[str, Any]:
        """A chat completion with one choice."""
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if reply.kind == "call":
            message["tool_calls"] = [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": reply.name, "arguments": "{}"},
                }
            ]
            finish = "tool_calls"
        elif reply.kind == "text":
            message["content"], finish = reply.text, "stop"
        else:
            message["content"], finish = reply.text, "length"
        return {
            "id": "chatcmpl-01",
            "object": "chat.completion",
            "created": 0,
            "model": request.body.get("model", "gpt-test"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": COMPLETION_TOKENS,
                "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
            },
        }

    def error_payload(self, status: int, message: str | None) -> dict[str, Any]:
        """OpenAI's error object: message, type, param and code."""
        kind = self.TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        words = message or f"scripted HTTP {status}"
        return {"error": {"message": words, "type": kind, "param": None, "code": None}}


class _Handler(LoopbackHandler):
    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            body = json.loads(data or b"{}")
        except ValueError:
            body = {"_unparsed": data.decode("utf-8", "replace")}
        provider = self.server.owner
        route = self.path.split("?", 1)[0]
        if provider.route.fullmatch(route) is None:
            self._send(provider.not_found(self.path))
            return
        headers = {name.lower(): value for name, value in self.headers.items()}
        self._send(provider.answer(RecordedRequest(self.path, headers, body)))

    def _send(self, answer: Answer) -> None:
        data = json.dumps(answer.payload).encode()
        try:
            self.send_response(answer.status)
            self.send_header("Content-Type", "application/json")
            for name, value in answer.headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True
