"""The OpenAI-compatible backend against a real HTTP server that misbehaves on script."""

from __future__ import annotations

import asyncio
import email.utils
import gzip
import itertools
import json
import logging
import re
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any

import pytest

from coordgap.env.protocols import TOOLS, Protocol, Tool
from coordgap.policies.base import Decision, NoCallReason
from coordgap.policies.remote import KEYLESS_PLACEHOLDER, MissingAPIKeyError, OpenAICompatible
from coordgap.policies.replies import MAX_REPLY_BYTES, EndpointAuthError, EndpointRequestError
from tests.integration.fault_server import (
    Behaviour,
    FaultServer,
    all_at_once,
    completion_body,
    cut_off,
    empty,
    failing,
    hang,
    message_body,
    no_choices,
    ok,
    proxy_error_page,
    rate_limited,
    raw,
    text_only,
    two_calls,
    unauthorized,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

pytestmark = pytest.mark.integration

TOOLS6 = TOOLS[Protocol.TOOLS6]
MESSAGES = [
    {"role": "system", "content": "You are philosopher 0 at a table of 5."},
    {"role": "user", "content": "Both your forks are free. Call exactly one tool."},
]
# Retries in these tests wait milliseconds, unless a test is about the wait.
FAST = {"timeout_s": 5.0, "max_retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.05}


def backend(server: FaultServer, **settings: Any) -> OpenAICompatible:
    return OpenAICompatible(model="fault-model", base_url=server.base_url, **(FAST | settings))


def play(
    script: Sequence[Behaviour], calls: int = 1, **settings: Any
) -> tuple[list[Decision], FaultServer, OpenAICompatible, float]:
    """Run ``calls`` decisions one after another; return them, the server, backend and time."""
    with FaultServer(script) as server:
        model = backend(server, **settings)

        async def run() -> list[Decision]:
            return [await model.decide(MESSAGES, TOOLS6, seed) for seed in range(calls)]

        start = time.perf_counter()
        decisions = asyncio.run(run())
        return decisions, server, model, time.perf_counter() - start


@pytest.mark.parametrize(
    ("behaviour", "tool", "reason"),
    [
        (ok("eat"), Tool.EAT, None),
        (ok("think", "{ }"), Tool.THINK, None),
        (text_only(), None, NoCallReason.NO_CALL),
        (empty(), None, NoCallReason.EMPTY),
        (two_calls(), None, NoCallReason.SEVERAL_CALLS),
        (two_calls("eat", "eat"), None, NoCallReason.SEVERAL_CALLS),
        (ok("fly_away"), None, NoCallReason.UNKNOWN_TOOL),
        (ok("grab_left"), None, NoCallReason.UNKNOWN_TOOL),  # a tool of the other protocol
        (ok("eat", '{"fork": "left"'), None, NoCallReason.BAD_ARGUMENTS),
        (ok("eat", '{"fork": "left"}'), None, NoCallReason.BAD_ARGUMENTS),
    ],
)
def test_each_reply_maps_to_its_decision(
    behaviour: Behaviour, tool: Tool | None, reason: NoCallReason | None
) -> None:
    (decision,), server, model, _ = play([behaviour])
    assert (decision.tool, decision.no_call_reason) == (tool, reason)
    assert len(server.requests) == 1
    assert model.stats.retries == 0
    for name, _arguments in behaviour.calls:
        assert name in decision.raw
    if behaviour.content:
        assert behaviour.content in decision.raw


def test_arguments_that_are_json_but_no_object_are_bad_arguments() -> None:
    # LangChain fails on these before a message exists, so raw keeps only the arguments.
    (decision,), _, _, _ = play([ok("eat", "[1]")])
    assert (decision.tool, decision.no_call_reason) == (None, NoCallReason.BAD_ARGUMENTS)
    assert "[1]" in decision.raw


def _reply(message: Any, **fields: Any) -> bytes:
    """A 200 body: one choice holding ``message``, with ``fields`` set at the top level."""
    body = completion_body("fault-model", [{"index": 0, "message": message}])
    return json.dumps(body | fields).encode()


VALID_MESSAGE = message_body(None, [("eat", "{}")])
LONE_SURROGATE = b'{"choices": [{"message": {"role": "assistant", "content": "\\ud800"}}]}'
# Each reply that is no chat completion, with the check it fails. Before the boundary's checks,
# the first two crashed the job (LangChain: ValueError on the page, IndexError on no choices).
MALFORMED = {
    "proxy-error-page": (proxy_error_page(), "body is not JSON"),
    "empty-choices": (no_choices(), "no choices"),
    "no-choices-key": (raw(b'{"id": "x", "object": "chat.completion"}'), "no choices"),
    "message-null": (raw(_reply(None)), "no message in the first choice"),
    "message-no-role": (raw(_reply({"content": "hi"})), "message role is not 'assistant'"),
    "content-parts": (
        raw(_reply({"role": "assistant", "content": [{"type": "text", "text": "hi"}]})),
        "message content is neither text nor null",
    ),
    "tool-calls-text": (
        raw(_reply({"role": "assistant", "tool_calls": "eat"})),
        "tool_calls is not a list",
    ),
    "tool-call-no-function": (
        raw(_reply({"role": "assistant", "tool_calls": [{"id": "c", "function": None}]})),
        "a tool call has no function object",
    ),
    "arguments-number": (
        raw(_reply(message_body(None, [("eat", 5)]))),
        "non-text tool-call arguments",
    ),
    "arguments-object": (
        raw(_reply(message_body(None, [("eat", {})]))),
        "non-text tool-call arguments",
    ),
    "name-number": (
        raw(_reply(message_body(None, [(7, "{}")]))),
        "non-text tool-call name",
    ),
    "not-utf8": (raw(b'{"choices": [{"message": {"content": "\xff"}}]}'), "body is not UTF-8"),
    "lone-surrogate": (raw(LONE_SURROGATE), "message content is neither text nor null"),
    "truncated-json": (raw(_reply(VALID_MESSAGE)[:40]), "body is not JSON"),
    "json-array": (raw(b"[]"), "body is not a JSON object"),
    "usage-text": (raw(_reply(VALID_MESSAGE, usage="many")), "usage is not an object"),
    "usage-negative": (
        raw(_reply(VALID_MESSAGE, usage={"prompt_tokens": -1})),
        "usage.prompt_tokens is not a non-negative integer",
    ),
    "error-in-200": (
        raw(json.dumps({"error": {"message": "overloaded"}}).encode()),
        "error object in a successful reply",
    ),
    "no-content-204": (raw(b"", status=204), "body is not JSON"),
    "oversized": (raw(b" " * (MAX_REPLY_BYTES + 1)), f"body over {MAX_REPLY_BYTES} bytes"),
    "gzip-bomb": (
        raw(gzip.compress(b" " * (4 * MAX_REPLY_BYTES)), headers={"Content-Encoding": "gzip"}),
        f"body over {MAX_REPLY_BYTES} bytes",
    ),
}


@pytest.mark.parametrize(("behaviour", "check"), MALFORMED.values(), ids=MALFORMED.keys())
def test_a_reply_that_is_no_chat_completion_is_retried_then_a_transport_error(
    behaviour: Behaviour, check: str
) -> None:
    (decision,), server, model, _ = play([behaviour])
    assert (decision.tool, decision.no_call_reason) == (None, NoCallReason.TRANSPORT_ERROR)
    assert decision.raw == f"MalformedReply (HTTP {behaviour.status}: {check})"
    assert len(server.requests) == FAST["max_retries"] + 1
    assert (model.stats.retries, model.stats.transport_errors) == (FAST["max_retries"], 1)


def test_a_proxy_page_then_a_reply_is_a_decision_after_a_retry() -> None:
    (decision,), server, model, _ = play([proxy_error_page(), no_choices(), ok("eat")])
    assert decision.tool is Tool.EAT
    assert model.stats.retries == 2
    assert len(server.requests) == 3


def test_a_reply_cut_off_in_transit_is_a_lost_connection() -> None:
    (decision,), server, _, _ = play([raw(_reply(VALID_MESSAGE), cut_after=30)])
    assert decision.no_call_reason is NoCallReason.TRANSPORT_ERROR
    assert decision.raw.endswith("ConnectionError")
    assert len(server.requests) == FAST["max_retries"] + 1


def test_fields_the_backend_does_not_read_never_reach_langchain() -> None:
    # Each of these crashes langchain-openai when it reads them; the canonical copy leaves
    # them out, so the reply is the valid call it carries.
    odd = {
        "role": "assistant",
        "content": None,
        "function_call": 5,
        "audio": "x",
        "tool_calls": [{"id": "c", "type": 3, "function": {"name": "eat", "arguments": "{}"}}],
    }
    body = json.loads(_reply(odd, service_tier=[1], system_fingerprint={}))
    body["usage"] = {"prompt_tokens": 3, "completion_tokens": 2, "prompt_tokens_details": 9}
    body["choices"].append("not a choice")
    (decision,), _, _, _ = play([raw(json.dumps(body).encode())])
    assert decision.tool is Tool.EAT
    assert (decision.tokens_in, decision.tokens_out) == (3, 2)


@pytest.mark.parametrize("arguments", [None, ""], ids=["null", "empty"])
def test_null_or_empty_arguments_are_no_arguments(arguments: str | None) -> None:
    # LangChain reads them as {}: what a tool without parameters takes.
    (decision,), _, _, _ = play([raw(_reply(message_body(None, [("think", arguments)])))])
    assert decision.tool is Tool.THINK


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_stops_naming_the_variable_and_endpoint_never_the_key(
    status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-coordgap-test-0b7d5e1f93"
    monkeypatch.setenv("COORDGAP_TEST_KEY", secret)
    with FaultServer([Behaviour(status=status, echo_key=True), ok("eat")]) as server:
        model = backend(server, api_key_env="COORDGAP_TEST_KEY")
        with pytest.raises(EndpointAuthError) as caught:
            asyncio.run(model.decide(MESSAGES, TOOLS6, 0))
    # Not retried: a refused key stays refused.
    assert len(server.requests) == 1
    message = str(caught.value)
    assert "COORDGAP_TEST_KEY" in message
    assert server.base_url in message
    assert f"HTTP {status}" in message
    # The server's message quoted the key; the traceback a job log shows must not.
    assert secret not in "".join(traceback.format_exception(caught.value))


def test_a_refused_keyless_request_says_to_configure_a_key() -> None:
    with FaultServer([unauthorized()]) as server:
        model = backend(server)
        with pytest.raises(EndpointAuthError, match="sets no api_key_env"):
            asyncio.run(model.decide(MESSAGES, TOOLS6, 0))


def test_a_valid_call_records_usage_raw_and_latency() -> None:
    (decision,), _, _, elapsed = play([ok("eat", delay_s=0.2)])
    assert decision.tool is Tool.EAT
    assert (decision.tokens_in, decision.tokens_out) == (11, 7)
    assert decision.raw == '[{"name": "eat", "arguments": "{}"}]'
    assert 0.2 <= decision.latency_s <= elapsed


def test_the_request_carries_tools_sampling_seed_and_extra_body() -> None:
    extra = {"chat_template_kwargs": {"enable_thinking": False}}
    _, server, _, _ = play([ok("eat")], temperature=0.7, top_p=0.9, max_tokens=64, extra_body=extra)
    body = server.requests[0].body
    assert [tool["function"]["name"] for tool in body["tools"]] == [t.value for t in TOOLS6]
    assert body["tools"][0]["function"]["parameters"]["additionalProperties"] is False
    assert body["tool_choice"] == "auto"
    assert body["seed"] == 0
    assert (body["temperature"], body["top_p"]) == (0.7, 0.9)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["messages"] == MESSAGES


def test_a_named_tool_choice_is_sent_as_a_function_choice() -> None:
    (decision,), server, _, _ = play([ok("think")], tool_choice="think")
    assert decision.tool is Tool.THINK
    assert server.requests[0].body["tool_choice"] == {
        "type": "function",
        "function": {"name": "think"},
    }


def test_a_tool_choice_outside_the_tools_is_refused() -> None:
    with pytest.raises(ValueError, match="grab_left"):
        play([ok("think")], tool_choice="grab_left")


@pytest.mark.parametrize(
    "retry_after",
    # Callables, so that the date is taken when the test runs, not when it is collected.
    [lambda: "1", lambda: "1.0", lambda: email.utils.formatdate(time.time() + 2, usegmt=True)],
    ids=["seconds", "float-seconds", "http-date"],
)
def test_429_waits_as_long_as_retry_after_says(retry_after: Callable[[], str]) -> None:
    (decision,), server, model, elapsed = play(
        [rate_limited(retry_after()), ok("eat")], backoff_max_s=5.0
    )
    assert decision.tool is Tool.EAT
    assert model.stats.retries == 1
    assert len(server.requests) == 2
    # An HTTP date has one-second resolution, so its wait is between 1 and 2 seconds.
    assert 0.9 <= elapsed < 3.0


def test_retry_after_is_capped_at_backoff_max() -> None:
    (decision,), _, _, elapsed = play([rate_limited("120"), ok("eat")], backoff_max_s=0.3)
    assert decision.tool is Tool.EAT
    assert 0.25 <= elapsed < 2.0


def test_a_500_then_a_reply_is_a_decision_after_a_retry() -> None:
    (decision,), server, model, _ = play([failing(500), ok("eat")])
    assert decision.tool is Tool.EAT
    assert model.stats.retries >= 1
    assert model.stats.transport_errors == 0
    assert len(server.requests) == 2


def test_persistent_5xx_ends_as_a_transport_error_naming_class_and_status() -> None:
    (decision,), server, model, _ = play([failing(503)], max_retries=3)
    assert decision.tool is None
    assert decision.no_call_reason is NoCallReason.TRANSPORT_ERROR
    assert re.fullmatch(r"\w+Error \(HTTP 503\)", decision.raw)
    assert len(server.requests) == 4
    assert (model.stats.retries, model.stats.transport_errors) == (3, 1)


@pytest.mark.parametrize("status", [400, 404, 422])
def test_a_refused_request_stops_at_once_naming_endpoint_model_and_message(status: int) -> None:
    with pytest.raises(EndpointRequestError) as raised:
        play([failing(status), ok("eat")])
    message = str(raised.value)
    assert f"refused the request for model 'fault-model' with HTTP {status}" in message
    assert f"scripted HTTP {status}" in message  # what the provider said
    assert "http://127.0.0.1:" in message
    assert raised.value.__suppress_context__


def test_a_refused_request_never_quotes_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # The server quotes the presented Authorization header in its 400's message.
    monkeypatch.setenv("COORDGAP_TEST_KEY", "sk-refused-4c1d9e")
    with pytest.raises(EndpointRequestError) as raised:
        play([Behaviour(status=400, echo_key=True)], api_key_env="COORDGAP_TEST_KEY")
    message = str(raised.value)
    assert "sk-refused" not in message
    assert "Bearer [key]" in message
    assert "COORDGAP_TEST_KEY" in message


def test_null_sampling_settings_are_left_out_of_the_request() -> None:
    _, server, _, _ = play([ok("eat")], temperature=None, top_p=None)
    body = server.requests[0].body
    assert "temperature" not in body
    assert "top_p" not in body
    _, server, _, _ = play([ok("eat")], temperature=0.3, top_p=None)
    assert server.requests[0].body["temperature"] == 0.3
    assert "top_p" not in server.requests[0].body


def test_model_kwargs_reach_the_request_and_may_not_repeat_the_entry() -> None:
    _, server, _, _ = play([ok("eat")], model_kwargs={"reasoning_effort": "low"})
    assert server.requests[0].body["reasoning_effort"] == "low"
    with pytest.raises(ValueError, match="model_kwargs may not set temperature"):
        OpenAICompatible(model="m", model_kwargs={"temperature": 0.5})


def test_a_reply_cut_off_by_the_token_limit_is_truncated_not_a_no_call() -> None:
    decisions, _, _, _ = play([cut_off(), cut_off(""), cut_off(None, "eat")], calls=3)
    assert [d.no_call_reason for d in decisions[:2]] == [NoCallReason.TRUNCATED] * 2
    # A valid call that happens to end at the limit is still the call.
    assert decisions[2].tool is Tool.EAT


def test_a_hang_times_out_retries_and_ends_in_bounded_time() -> None:
    timeout_s, max_retries = 0.3, 2
    (decision,), server, model, elapsed = play(
        [hang(30.0)], timeout_s=timeout_s, max_retries=max_retries
    )
    assert decision.no_call_reason is NoCallReason.TRANSPORT_ERROR
    assert decision.raw.endswith("TimeoutError")
    assert len(server.requests) == max_retries + 1
    assert model.stats.retries == max_retries
    # Every attempt waits its timeout; the backoffs add at most backoff_max_s each.
    attempts_s = (max_retries + 1) * timeout_s
    assert attempts_s <= elapsed < attempts_s + max_retries * FAST["backoff_max_s"] + 1.0


def test_a_refused_connection_is_retried_then_a_transport_error() -> None:
    with FaultServer([ok("eat")]) as server:
        url = server.base_url
    # The server is gone, so its port refuses connections.
    model = OpenAICompatible(model="fault-model", base_url=url, **FAST)
    decision = asyncio.run(model.decide(MESSAGES, TOOLS6, 0))
    assert decision.no_call_reason is NoCallReason.TRANSPORT_ERROR
    assert decision.raw.endswith("ConnectionError")
    assert model.stats.retries == FAST["max_retries"]


def test_the_same_seed_draws_the_same_backoffs(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def record(delay: float) -> None:
        waits.append(delay)

    monkeypatch.setattr("coordgap.policies.remote.asyncio.sleep", record)
    for _ in range(2):
        play([failing(500)], max_retries=3, backoff_base_s=1.0, backoff_max_s=10.0)
    assert waits[:3] == waits[3:]
    assert all(0 <= wait <= bound for wait, bound in zip(waits, [1, 2, 4, 1, 2, 4], strict=True))


def test_concurrent_decisions_overlap() -> None:
    in_flight = 32
    # The server answers none until all 32 requests wait at once; a client that sent them one
    # after another would time out on the first, and without retries its decision fails.
    with FaultServer([all_at_once(in_flight)]) as server:
        model = backend(server, max_retries=0)

        async def run() -> list[Decision]:
            calls = (model.decide(MESSAGES, TOOLS6, seed) for seed in range(in_flight))
            return await asyncio.gather(*calls)

        decisions = asyncio.run(run())
    assert all(decision.tool is Tool.THINK for decision in decisions)
    assert len(server.requests) == in_flight


def test_requests_per_second_spaces_the_requests_of_concurrent_decisions() -> None:
    calls, rate = 6, 5.0
    with FaultServer([ok("think")]) as server:
        model = backend(server, requests_per_second=rate)

        async def run() -> list[Decision]:
            return await asyncio.gather(
                *(model.decide(MESSAGES, TOOLS6, seed) for seed in range(calls))
            )

        start = time.perf_counter()
        decisions = asyncio.run(run())
        elapsed = time.perf_counter() - start
        arrivals = sorted(request.received_s for request in server.requests)
    assert all(decision.tool is Tool.THINK for decision in decisions)
    # A bucket of one: the first request at once, then one every 1/rate seconds.
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert min(gaps) > 0.8 / rate, gaps
    assert elapsed >= (calls - 1) / rate


def test_a_rate_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="requests_per_second must be positive"):
        OpenAICompatible(model="m", base_url="http://127.0.0.1:9/v1", requests_per_second=0)


def test_one_backend_serves_successive_event_loops() -> None:
    # Connections opened on one loop die with it; the backend must not reuse them on the next.
    with FaultServer([ok("eat")]) as server:
        model = backend(server)
        for seed in range(3):
            decision = asyncio.run(model.decide(MESSAGES, TOOLS6, seed))
            assert decision.tool is Tool.EAT
    assert model.stats.transport_errors == 0


def test_a_missing_key_fails_at_construction_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COORDGAP_TEST_KEY", raising=False)
    with pytest.raises(MissingAPIKeyError, match="COORDGAP_TEST_KEY") as caught:
        OpenAICompatible(
            model="m", base_url="http://127.0.0.1:9/v1", api_key_env="COORDGAP_TEST_KEY"
        )
    assert caught.value.env_var == "COORDGAP_TEST_KEY"
    monkeypatch.setenv("COORDGAP_TEST_KEY", "")
    with pytest.raises(MissingAPIKeyError, match="COORDGAP_TEST_KEY"):
        OpenAICompatible(
            model="m", base_url="http://127.0.0.1:9/v1", api_key_env="COORDGAP_TEST_KEY"
        )


def test_a_keyless_server_gets_the_placeholder_not_openai_api_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-stay-home")
    _, server, _, _ = play([ok("eat")])
    assert server.requests[0].headers["authorization"] == f"Bearer {KEYLESS_PLACEHOLDER}"


def test_another_provider_without_langchain_names_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A None entry makes the import fail, as if the package were not installed.
    monkeypatch.setitem(sys.modules, "langchain", None)
    monkeypatch.setitem(sys.modules, "langchain.chat_models", None)
    with pytest.raises(ImportError, match=r"'langchain'.*langchain-anthropic"):
        OpenAICompatible(model="claude", provider="anthropic")


def test_extra_body_needs_provider_openai() -> None:
    with pytest.raises(ValueError, match="extra_body"):
        OpenAICompatible(model="m", provider="anthropic", extra_body={"x": 1})


def test_the_key_reaches_the_server_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    secret = "sk-coordgap-test-4f1e9a7c2b6d8e03"
    monkeypatch.setenv("COORDGAP_TEST_KEY", secret)
    # DEBUG everywhere, including the HTTP stack's own loggers, which may set their own levels.
    caplog.set_level(logging.DEBUG)
    for name in ("openai", "httpx", "httpcore", "httpx2", "httpcore2", "langchain_openai"):
        caplog.set_level(logging.DEBUG, logger=name)
    script = [
        ok("eat"),
        failing(500),
        failing(500),
        failing(500),
        rate_limited("0"),
        text_only(),
        ok("eat", "{bad"),
        ok("eat", "[1]"),
        proxy_error_page(),
        hang(30.0),
        ok("eat"),
        # The last behaviour repeats: every call after the ones above meets a 401 quoting the key.
        unauthorized(),
    ]
    errors: list[BaseException] = []
    with FaultServer(script) as server:
        model = backend(server, api_key_env="COORDGAP_TEST_KEY", timeout_s=0.3)
        refusing_choice = OpenAICompatible(
            model="m",
            base_url=server.base_url,
            api_key_env="COORDGAP_TEST_KEY",
            tool_choice="release",
        )

        async def run() -> list[Decision]:
            decisions = [await model.decide(MESSAGES, TOOLS6, seed) for seed in range(6)]
            for failing_call in (model, refusing_choice):
                try:
                    await failing_call.decide(MESSAGES, TOOLS6, 6)
                except (EndpointAuthError, ValueError) as error:
                    errors.append(error)
            return decisions

        decisions = asyncio.run(run())
    assert all(
        request.headers["authorization"] == f"Bearer {secret}" for request in server.requests
    )
    reasons = {decision.no_call_reason for decision in decisions}
    assert NoCallReason.TRANSPORT_ERROR in reasons
    assert None in reasons
    assert [type(error) for error in errors] == [EndpointAuthError, ValueError]
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    logged = "\n".join(formatter.format(record) for record in caplog.records)
    # The scan proves something only if the HTTP stack's own DEBUG records were captured.
    assert any(r.name.startswith(("openai", "httpx", "httpcore")) for r in caplog.records)
    out, err = capfd.readouterr()
    for place, text in {
        "decisions": repr(decisions),
        "log records": logged,
        "stdout/stderr": out + err,
        "exceptions and their tracebacks": "\n".join(
            "".join(traceback.format_exception(error)) for error in errors
        ),
        "backend repr": repr(model),
    }.items():
        assert secret not in text, f"the API key leaked into {place}"
