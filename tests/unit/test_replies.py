"""How errors of providers other than openai are classified (their replies bypass the gate)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from langchain_core.exceptions import ModelAuthenticationError, ModelRateLimitError

from coordgap.policies.replies import (
    EndpointRequestError,
    Failure,
    MalformedReply,
    classify_error,
    provider_message,
)

pytestmark = pytest.mark.unit


class _ProviderError(Exception):
    """An SDK exception as anthropic's and others look: a status code, a message to hide."""

    def __init__(self, status_code: int) -> None:
        super().__init__("Invalid key: sk-must-stay-secret")
        self.status_code = status_code


def _raised(exc: Exception) -> Exception:
    """``exc`` with a traceback, as the backend catches it."""
    try:
        raise exc
    except Exception as caught:
        return caught


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (_ProviderError(401), Failure("_ProviderError (HTTP 401)", False, None, 401, True)),
        (_ProviderError(403), Failure("_ProviderError (HTTP 403)", False, None, 403, True)),
        (
            ModelAuthenticationError("no"),
            Failure("ModelAuthenticationError", False, None, None, True),
        ),
        # A server error and a lost connection are what a dead or hung endpoint gives: the
        # circuit breaker counts them (coordgap.policies.breaker).
        (
            _ProviderError(503),
            Failure("_ProviderError (HTTP 503)", True, None, 503, unanswered=True),
        ),
        # A status no retry changes refuses the request itself: the job stops.
        (_ProviderError(400), Failure("_ProviderError (HTTP 400)", False, None, 400)),
        (ModelRateLimitError("slow down"), Failure("ModelRateLimitError", True)),
        (ConnectionResetError(), Failure("ConnectionResetError", True, unanswered=True)),
        (
            MalformedReply(200, "no choices"),
            Failure("MalformedReply (HTTP 200: no choices)", True, None, 200),
        ),
        # What only an integration that could not read a reply raises: retried, and logged.
        (KeyError("choices"), Failure("KeyError (unreadable reply)", True)),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else "",
)
def test_every_error_is_a_failure_whose_label_hides_the_message(
    exc: Exception, expected: Failure, caplog: pytest.LogCaptureFixture
) -> None:
    failure = classify_error(_raised(exc))
    # Where an unreadable reply was raised is for the log; the rest must be exactly this.
    assert replace(failure, where=None) == expected
    assert failure.refused == (failure.status == 400)
    assert (failure.where is not None) == failure.label.endswith("(unreadable reply)")
    assert "sk-must-stay-secret" not in failure.label + caplog.text


def test_a_provider_message_is_quoted_without_the_key() -> None:
    key = "sk-proj-7c1e5b9a3d"
    said = _ProviderError(400)
    # Where openai's SDK keeps the provider's own words: the error object of the body.
    said.body = {"message": f"Bad request  from key {key} (also {key[:12]}...)\n  see the docs"}
    quoted = provider_message(said, key)
    assert quoted == "Bad request from key [key] (also [key] see the docs"
    assert provider_message(said, None).startswith("Bad request from key sk-proj")
    assert len(provider_message(ValueError("x" * 2000), None)) == 500


def test_a_malformed_reply_wrapped_by_an_sdk_is_still_named() -> None:
    try:
        try:
            raise MalformedReply(200, "body is not JSON")
        except MalformedReply as inner:
            raise ConnectionError("wrapped") from inner
    except ConnectionError as outer:
        failure = classify_error(outer)
    assert failure.label == "MalformedReply (HTTP 200: body is not JSON)"


@pytest.mark.parametrize(
    ("said", "quoted"),
    [
        # OpenAI's words for a refused top_p end with their own full stop.
        (
            "Unsupported parameter: 'top_p' is not supported with this model.",
            "Unsupported parameter: 'top_p' is not supported with this model. No retry",
        ),
        ("model gone fishing", "model gone fishing. No retry"),
        ("Is this model retired?", "Is this model retired? No retry"),
        ("", "no message. No retry"),
    ],
)
def test_a_refused_request_quotes_the_provider_in_one_sentence(said: str, quoted: str) -> None:
    message = str(EndpointRequestError(400, "https://api.example", "m", said, "EXAMPLE_KEY"))
    assert f"with HTTP 400: {quoted} can change that" in message
    assert ".." not in message
