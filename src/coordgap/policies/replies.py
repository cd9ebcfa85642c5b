"""The model boundary: whatever an endpoint answers becomes a message to parse or a failure.

A reply of a chat endpoint passes three stages, and nothing raised on the way escapes as an
exception except a rejected key:

1. ``GatedHttpClient``, the HTTP client of provider ``openai``, reads each body with a size cap
   (``MAX_REPLY_BYTES``, after decompression) and checks every 2xx body with
   ``canonical_completion``: UTF-8 JSON, an object without ``error``, a non-empty ``choices``
   list whose first entry holds an assistant message with string-or-null ``content`` and
   well-formed ``tool_calls``, token counts that are non-negative integers, strings that are
   valid Unicode. The client library and LangChain then read a canonical copy holding only
   those fields, so no other field of a reply, however odd, reaches their parsers. A body that
   fails raises ``MalformedReply``.
2. ``classify_error`` turns whatever the chat model raised into a ``Failure``: by HTTP status
   (401 and 403 reject the key; 408, 429 and 5xx may pass on retry; any other status refuses
   the request itself), as a lost connection or timeout, as a ``MalformedReply``, or, for
   anything else a provider's integration raises on a reply it could not read, as an
   unreadable reply. Retryable failures are retried by the backend and end as
   ``TRANSPORT_ERROR`` decisions. A rejected key (``EndpointAuthError``) and a refused request
   (``EndpointRequestError``: a setting the model does not accept, an unknown model) stop the
   job: every later call would fail the same way, and a cell of error episodes is no result.
   ``unrepresentable_call`` recognises the one error that is a decision: LangChain refusing
   tool-call arguments that are JSON but no object.
3. ``coordgap.policies.parsing.parse_ai_message`` turns the message into a tool, or into the
   reason there is none.

Labels of failures name only classes, statuses and which check failed: exception messages and
bodies may quote request details, such as the key a 401 rejected. Only a refused request
quotes the provider's message, which says what to change, with the key taken out of it.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import openai
from langchain_core.exceptions import (
    ModelAuthenticationError,
    ModelError,
    ModelPermissionDeniedError,
)
from pydantic import ValidationError

from coordgap.errors import ExpectedFailure

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

# A chat completion of one tool call is a few kilobytes; even thousands of tokens of prose stay
# far below this. A larger body is a proxy's or server's fault, and reading it whole could
# exhaust memory.
MAX_REPLY_BYTES = 8 * 2**20
# 408 is a server-side timeout, 429 a rate limit, 5xx a server fault: all may pass on retry.
_RETRYABLE_STATUS = frozenset({408, 429})
# The key was refused: no later request with it can succeed.
_AUTH_STATUS = frozenset({401, 403})
# Failures of the connection itself, found anywhere in an exception's cause chain: the SDKs
# (openai, anthropic, ...) wrap their HTTP library's errors, which wrap the socket's. Python
# 3.11's asyncio.TimeoutError, raised by asyncio.timeout, is the built-in TimeoutError.
_CONNECTION_FAILURES = (TimeoutError, ConnectionError, openai.APIConnectionError)
# Headers that described the body as it came over the wire, not the decoded copy passed on.
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})

_E = TypeVar("_E", bound=BaseException)


class MalformedReply(Exception):
    """A reply that is no chat completion (or too large to read); ``reason`` says which check.

    Args:
        status: The reply's HTTP status.
        reason: The failed check, safe to store and log: it never quotes the body.
    """

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status}: {reason}")
        self.status = status
        self.reason = reason


class EndpointAuthError(ExpectedFailure, RuntimeError):
    """The endpoint refused the API key (HTTP 401 or 403): the job cannot succeed, so it stops.

    The message names the environment variable and the endpoint, never the key.

    Args:
        status: The HTTP status; None when a provider's error carried none.
        endpoint: The base URL, or a description of the provider's default endpoint.
        env_var: The variable the key was read from; None for a keyless model.
    """

    def __init__(self, status: int | None, endpoint: str, env_var: str | None) -> None:
        if env_var is None:
            advice = "the model sets no api_key_env: name the variable that holds its key"
        else:
            advice = f"check the API key in environment variable {env_var}"
        refused = f"{endpoint} refused the request" + (f" with HTTP {status}" if status else "")
        super().__init__(f"{refused}: {advice}")
        self.status = status
        self.endpoint = endpoint
        self.env_var = env_var


class EndpointRequestError(ExpectedFailure, RuntimeError):
    """The endpoint refused a request in a way no retry changes (HTTP 400, 404, 422, ...).

    A setting the model does not accept (Claude Opus 4.x: temperature with top_p; GPT-5.2:
    top_p), a model name the endpoint does not know, a key some providers refuse with a 400
    (Gemini): every call of the job would be refused the same way, so the job stops at the
    first. The message names the endpoint, the model and what the provider said, never the key.

    Args:
        status: The HTTP status; None when a provider's error carried none.
        endpoint: The base URL, or a description of the provider's default endpoint.
        model: The model name the request asked for.
        message: The provider's message, the key already taken out (``provider_message``).
        env_var: The variable the key was read from; None for a keyless model.
    """

    def __init__(
        self,
        status: int | None,
        endpoint: str,
        model: str,
        message: str,
        env_var: str | None,
    ) -> None:
        refused = f"{endpoint} refused the request for model {model!r}" + (
            f" with HTTP {status}" if status else ""
        )
        key = "" if env_var is None else f" (the key is read from {env_var})"
        said = message or "no message"
        # Providers mostly end their message with a full stop: one mark ends it, not two.
        if not said.endswith((".", "!", "?")):
            said += "."
        super().__init__(
            f"{refused}: {said} No retry can change that: fix the model's "
            f"entry in models: (a setting the model does not accept, its name) or its key{key}."
        )
        self.status = status
        self.endpoint = endpoint
        self.model = model


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt as the retry loop sees it.

    Attributes:
        label: The error class, HTTP status or failed check; safe to store and log.
        retryable: Whether the same request may succeed later.
        retry_after_s: The wait the server asked for, if it did and a retry makes sense.
        status: The HTTP status, when the failure had one.
        rejected_key: The endpoint refused the credentials (401, 403).
        where: For an unreadable reply, the file and line that raised (the integration's).
        unanswered: The endpoint gave no answer (a refused or lost connection, a timeout) or
            a server error (5xx): what a dead or hung endpoint does, as opposed to a reply
            that came back wrong or a rate limit. The circuit breaker counts only these.
    """

    label: str
    retryable: bool
    retry_after_s: float | None = None
    status: int | None = None
    rejected_key: bool = False
    where: str | None = None
    unanswered: bool = False

    @property
    def refused(self) -> bool:
        """The endpoint refused the request itself: no retry and no later call can succeed."""
        return not self.retryable and not self.rejected_key


class GatedHttpClient(openai.DefaultAsyncHttpxClient):
    """The openai SDK's default async HTTP client, with every reply read and checked whole.

    It keeps the SDK's defaults (connection limits, redirects, proxies from the environment)
    and overrides only ``send``: the body is read under ``MAX_REPLY_BYTES``, a 2xx body is
    replaced by its ``canonical_completion``, and the SDK gets a response whose body is
    already in memory. The backend never streams, so a whole body is always what it wants.

    Raises:
        MalformedReply: From ``send``, for an oversized body or a 2xx body that is no chat
            completion. The SDK lets errors that are not its HTTP library's pass unchanged.
    """

    async def send(self, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
        """Send ``request`` and return its response, read, checked and made canonical."""
        response = await super().send(request, stream=True, **kwargs)
        try:
            body = await _read_capped(response)
        finally:
            await response.aclose()
        if response.is_success:
            body = canonical_completion(response.status_code, body)
        headers = [(k, v) for k, v in response.headers.multi_items() if k not in _WIRE_HEADERS]
        # type(response): the HTTP library the SDK uses (httpx2 since openai 3, httpx before).
        return type(response)(
            response.status_code,
            headers=headers,
            content=body,
            request=request,
            extensions=response.extensions,
        )


async def _read_capped(response: Any) -> bytes:
    """Read a streamed response's decoded body, refusing it past ``MAX_REPLY_BYTES``."""
    chunks = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_REPLY_BYTES:
            raise MalformedReply(response.status_code, f"body over {MAX_REPLY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def canonical_completion(status: int, body: bytes) -> bytes:
    """Check that ``body`` is a chat completion; return a copy with only the fields we read.

    The copy has the first choice's message (role, content, tool calls with their id, name and
    arguments), its sampled tokens' log-probs when they are well formed (a trainer reads them;
    malformed ones are left out rather than failing the decision), and the token counts.
    Whatever else the reply held (more choices, reasoning text, vendor fields) is left out:
    the backend uses none of it.

    Args:
        status: The reply's HTTP status, for the error's label.
        body: The reply's body, decompressed.

    Returns:
        The canonical chat completion, as UTF-8 JSON.

    Raises:
        MalformedReply: ``body`` is no chat completion; ``reason`` names the first check
            that failed.
    """
    try:
        reply = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise MalformedReply(status, "body is not UTF-8") from None
    # ValueError covers malformed JSON and integers too long to convert; RecursionError, nesting
    # too deep for the parser.
    except (ValueError, RecursionError):
        raise MalformedReply(status, "body is not JSON") from None
    if not isinstance(reply, dict):
        raise MalformedReply(status, "body is not a JSON object")
    if reply.get("error") is not None:
        raise MalformedReply(status, "error object in a successful reply")
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedReply(status, "no choices")
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        raise MalformedReply(status, "no message in the first choice")
    if message.get("role") != "assistant":
        raise MalformedReply(status, "message role is not 'assistant'")
    content = message.get("content")
    if not _is_text(content, nullable=True):
        raise MalformedReply(status, "message content is neither text nor null")
    canonical: dict[str, Any] = {"role": "assistant", "content": content}
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise MalformedReply(status, "tool_calls is not a list")
        canonical["tool_calls"] = [_canonical_call(status, call) for call in calls]
    # Kept for what it says of truncation ("length"); any other value than text is dropped.
    finish_reason = choices[0].get("finish_reason")
    choice: dict[str, Any] = {
        "index": 0,
        "message": canonical,
        "finish_reason": finish_reason if _is_text(finish_reason, nullable=True) else None,
    }
    if (logprobs := _canonical_logprobs(choices[0].get("logprobs"))) is not None:
        choice["logprobs"] = logprobs
    completion: dict[str, Any] = {"object": "chat.completion", "choices": [choice]}
    usage = reply.get("usage")
    if usage is not None:
        completion["usage"] = _canonical_usage(status, usage)
    return json.dumps(completion).encode()


def _canonical_call(status: int, call: object) -> dict[str, Any]:
    """One entry of ``tool_calls``: an object with a function's string name and arguments.

    Arguments may be null or absent: LangChain reads those as no arguments, which is what the
    philosophers' tools take. Arguments of another type than a string are the server's
    encoding error, not the model's choice, so they fail the reply rather than the call.
    """
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise MalformedReply(status, "a tool call has no function object")
    for value, what, nullable in (
        (function.get("name"), "name", False),
        (function.get("arguments"), "arguments", True),
        (call.get("id"), "id", True),
    ):
        if not _is_text(value, nullable):
            raise MalformedReply(status, f"non-text tool-call {what}")
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": function["name"], "arguments": function.get("arguments")},
    }


def _canonical_logprobs(logprobs: object) -> dict[str, Any] | None:
    """The sampled tokens and their log-probs, or None unless every entry is well formed."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content:
        return None
    tokens = []
    for entry in content:
        token = entry.get("token") if isinstance(entry, dict) else None
        logprob = entry.get("logprob") if isinstance(entry, dict) else None
        if not _is_text(token, nullable=False) or type(logprob) not in (int, float):
            return None
        tokens.append({"token": token, "logprob": logprob, "bytes": None, "top_logprobs": []})
    return {"content": tokens}


def _canonical_usage(status: int, usage: object) -> dict[str, int]:
    """The token counts: absent ones are 0, and present ones must be non-negative integers."""
    if not isinstance(usage, dict):
        raise MalformedReply(status, "usage is not an object")
    counts = {}
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key, 0)
        # bool is an int subclass, and JSON true is no count.
        if type(value) is not int or value < 0:
            raise MalformedReply(status, f"usage.{key} is not a non-negative integer")
        counts[key] = value
    return {**counts, "total_tokens": counts["prompt_tokens"] + counts["completion_tokens"]}


def _is_text(value: object, nullable: bool) -> bool:
    """Whether ``value`` is a string of valid Unicode (or None, when ``nullable``).

    JSON escapes can spell lone UTF-16 surrogates, which no UTF-8 file can store.
    """
    if value is None:
        return nullable
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unrepresentable_call(exc: Exception) -> str | None:
    """The raw output of a call LangChain decoded but could not represent; None for other errors.

    langchain-openai decodes each call's arguments, then builds the message outside its error
    handling: arguments that are JSON but no object (``"[1]"``) fail the message's validation
    instead of becoming an invalid call. That is the model's choice, a ``BAD_ARGUMENTS``
    decision, not a transport failure; but the message that would carry the token counts is
    never built, so such a decision counts no tokens.
    """
    if not isinstance(exc, ValidationError):
        return None
    errors = exc.errors()
    if not all(error["loc"][:1] == ("tool_calls",) for error in errors):
        return None
    arguments = json.dumps([error["input"] for error in errors], default=str)
    return f"tool-call arguments that are no JSON object: {arguments}"


def classify_error(exc: Exception) -> Failure:
    """Describe a failed attempt: every exception of a chat model's call is one kind of failure.

    In order: a ``MalformedReply`` anywhere in the cause chain; a refused key (HTTP 401 or
    403, or LangChain's provider-neutral authentication errors); LangChain's ``ModelError``
    with its own ``is_retryable``; any other HTTP status of an SDK exception (openai,
    anthropic and others carry ``status_code``; google-genai's ``code``, which
    langchain-google-genai keeps as the cause); a connection failure or timeout in the cause
    chain; and last, anything else, which only a reply the integration could not read raises
    and which is retried like a malformed reply (with where it was raised). A failure with a
    status that is not retryable is ``refused``; a 5xx, or a connection failure or timeout
    without a status, is ``unanswered``.

    Args:
        exc: What the chat model's call raised.

    Returns:
        The failure; its label names the class and status or the failed check, never a message.
    """
    malformed = _in_chain(exc, MalformedReply)
    if malformed is not None:
        return Failure(f"MalformedReply ({malformed})", retryable=True, status=malformed.status)
    status = http_status(exc)
    label = type(exc).__name__ if status is None else f"{type(exc).__name__} (HTTP {status})"
    if (
        status in _AUTH_STATUS
        or isinstance(exc, ModelAuthenticationError | ModelPermissionDeniedError)
        or _google_reason(exc) == "API_KEY_INVALID"
    ):
        return Failure(label, retryable=False, status=status, rejected_key=True)
    if isinstance(exc, ModelError):
        retryable = exc.is_retryable
    elif status is not None:
        retryable = status in _RETRYABLE_STATUS or status >= 500
    elif _in_chain(exc, _CONNECTION_FAILURES) is not None:
        retryable = True
    else:
        frame = traceback.extract_tb(exc.__traceback__)[-1:]
        where = f"{frame[0].filename}:{frame[0].lineno}" if frame else "unknown place"
        return Failure(f"{type(exc).__name__} (unreadable reply)", retryable=True, where=where)
    return Failure(
        label,
        retryable=retryable,
        retry_after_s=_asked_wait(exc) if retryable else None,
        status=status,
        unanswered=status >= 500
        if status is not None
        else _in_chain(exc, _CONNECTION_FAILURES) is not None,
    )


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from, outermost first."""
    cause: BaseException | None = exc
    while cause is not None:
        yield cause
        cause = cause.__cause__ or cause.__context__


def _google_details(exc: BaseException) -> list[dict[str, Any]]:
    """The ``error.details`` entries of a google-genai error in the chain (Google's body)."""
    for cause in _causes(exc):
        body = getattr(cause, "details", None)
        error = body.get("error") if isinstance(body, dict) else None
        details = error.get("details") if isinstance(error, dict) else None
        if isinstance(details, list):
            return [entry for entry in details if isinstance(entry, dict)]
    return []


def _google_reason(exc: BaseException) -> str | None:
    """The ``ErrorInfo`` reason of a Google error: a refused key is a 400 with API_KEY_INVALID."""
    return next((e["reason"] for e in _google_details(exc) if "reason" in e), None)


def _asked_wait(exc: BaseException) -> float | None:
    """The wait a refused attempt asks for: a Retry-After header, or Google's retryDelay.

    The SDKs keep the HTTP response on their exception; langchain-google-genai raises its own
    error from google-genai's, so the response may sit further down the chain.
    """
    for cause in _causes(exc):
        headers = getattr(getattr(cause, "response", None), "headers", None)
        if headers is not None and (wait := retry_after_s(headers)) is not None:
            return wait
    for entry in _google_details(exc):
        delay = entry.get("retryDelay")
        if isinstance(delay, str) and delay.endswith("s"):
            return _non_negative(delay[:-1])
    return None


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an SDK's exception carries, on it or on an exception it wraps.

    openai and anthropic name it ``status_code``; google-genai's ``APIError`` names it
    ``code``, and langchain-google-genai raises its own error with that one as the cause.
    """
    for cause in _causes(exc):
        for attribute in ("status_code", "code"):
            status = getattr(cause, attribute, None)
            # bool is an int, and no status.
            if type(status) is int and 100 <= status <= 599:
                return status
    return None


# Runs of whitespace, folded to one space in a quoted message.
_SPACE = re.compile(r"\s+")
# The most of a provider's message an error quotes.
_MESSAGE_CHARS = 500


def provider_message(exc: BaseException, secret: str | None) -> str:
    """What the provider said about a refused request, with ``secret`` taken out of it.

    The provider's own words, where an SDK keeps them apart: anthropic's ``api_message``, the
    ``message`` of openai's error ``body``, google-genai's ``message`` (the cause of
    langchain-google-genai's error); otherwise the exception's text. A key is never meant to be
    in it, but a provider may quote the request (OpenAI's 401 quotes the key), so every
    occurrence of the key, and of any word that starts with its first 8 characters, is
    replaced.

    Args:
        exc: What the chat model's call raised.
        secret: The API key sent, or None.

    Returns:
        The message on one line, at most ``_MESSAGE_CHARS`` characters.
    """
    text = str(exc)
    for cause in _causes(exc):
        body = getattr(cause, "body", None)
        said = [
            getattr(cause, "api_message", None),
            body.get("message") if isinstance(body, dict) else None,
            # google-genai's errors keep Google's body as details, its message apart.
            getattr(cause, "message", None)
            if isinstance(getattr(cause, "details", None), dict)
            else None,
        ]
        if found := next((m for m in said if isinstance(m, str) and m), None):
            text = found
            break
    if secret:
        text = text.replace(secret, "[key]")
        text = re.sub(re.escape(secret[:8]) + r"\S*", "[key]", text)
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


def _in_chain(exc: BaseException, kind: type[_E] | tuple[type[_E], ...]) -> _E | None:
    """The first exception of ``kind`` in ``exc``'s cause chain, ``exc`` included."""
    return next((cause for cause in _causes(exc) if isinstance(cause, kind)), None)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Return the wait a response asks for, in seconds; None without a usable header.

    Reads OpenAI's ``retry-after-ms`` first, then ``Retry-After`` as seconds or an HTTP date.
    """
    millis = _non_negative(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _non_negative(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _non_negative(text: str | None) -> float | None:
    """Return ``text`` as a number clipped at 0, or None when it is absent or not a number."""
    if text is None:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        return None
