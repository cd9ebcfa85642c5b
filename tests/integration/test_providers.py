"""The chat backend with the real Anthropic, Gemini and OpenAI client libraries, on loopback.

Each server speaks its provider's wire format and refuses what the provider refuses
(``tests.integration.provider_servers``): Anthropic's newer models refuse temperature with
top_p, GPT-5-class models refuse top_p, Gemini answers a bad key with a 400 and its client
errors carry no ``status_code``. The backend must send only what a model accepts, stop the
job on a refusal no retry can change (naming endpoint, model and the provider's words, never
the key), retry what may pass with the wait the provider asks for, and see truncation.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING, Any

import pytest

from coordgap.env.protocols import TOOLS, Protocol, Tool
from coordgap.policies.base import NoCallReason
from coordgap.policies.remote import OpenAICompatible
from coordgap.policies.replies import EndpointAuthError, EndpointRequestError
from tests.integration.provider_servers import (
    BOTH_SAMPLING_MESSAGE,
    COMPLETION_TOKENS,
    OPENAI_TOP_P_MESSAGE,
    PROMPT_TOKENS,
    AnthropicServer,
    GeminiServer,
    OpenAIServer,
    call,
    error,
    rate_limited,
    text,
    truncated,
)

if TYPE_CHECKING:
    from coordgap.policies.base import Decision
    from tests.integration.provider_servers import ProviderServer

pytestmark = pytest.mark.integration

KEY = "sk-test-0123456789abcdef"
KEY_ENV = "COORDGAP_PROVIDER_TEST_KEY"
TOOLS6 = TOOLS[Protocol.TOOLS6]
MESSAGES = [
    {"role": "system", "content": "You are philosopher 0 at a table of 5."},
    {"role": "user", "content": "Both your forks are free. Call exactly one tool."},
]
ANTHROPIC_MODEL = "claude-test"
GEMINI_MODEL = "gemini-2.5-flash"
# Variables the three libraries read: keys they would send in place of a missing one, base
# URLs and API versions that would redirect a request, a switch to Vertex AI, extra headers,
# gateways and proxies. None may reach a test.
_PROVIDER_ENV = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_API_URL",
    "ANTHROPIC_CUSTOM_HEADERS",
    "ANTHROPIC_PROXY",
    "ANTHROPIC_PROFILE",
    "ANTHROPIC_CONFIG_DIR",
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_GENAI_USE_VERTEXAI",
    "GOOGLE_GENAI_API_VERSION",
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_CLOUD_LOCATION",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_ORG_ID",
    "OPENAI_PROJECT_ID",
    "OPENAI_PROXY",
    "LANGSMITH_GATEWAY",
    "LANGSMITH_GATEWAY_API_KEY",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
)


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No provider key, URL or proxy from the environment; the test key in ``KEY_ENV``."""
    for name in _PROVIDER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv(KEY_ENV, KEY)


def backend(provider: str, model: str, server: ProviderServer, **settings: Any) -> OpenAICompatible:
    """The backend of ``provider`` pointed at ``server``, retrying in milliseconds."""
    fast = {"timeout_s": 5.0, "max_retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.05}
    return OpenAICompatible(
        model=model,
        provider=provider,
        base_url=server.base_url,
        api_key_env=KEY_ENV,
        **(fast | settings),
    )


def decide(model: OpenAICompatible, calls: int = 1) -> list[Decision]:
    """``calls`` decisions, one after another on one event loop."""

    async def run() -> list[Decision]:
        return [await model.decide(MESSAGES, TOOLS6, seed) for seed in range(calls)]

    return asyncio.run(run())


# (provider, the server that speaks its format, a model name): the backend is the same.
PROVIDERS = [
    pytest.param("anthropic", AnthropicServer, ANTHROPIC_MODEL, id="anthropic"),
    pytest.param("google_genai", GeminiServer, GEMINI_MODEL, id="google_genai"),
    pytest.param("openai", OpenAIServer, "gpt-test", id="openai"),
]


@pytest.mark.parametrize(("provider", "server_class", "name"), PROVIDERS)
def test_each_provider_s_replies_become_decisions(
    provider: str, server_class: type[ProviderServer], name: str
) -> None:
    script = [call("eat"), text(), truncated(), truncated("Let me weigh the forks")]
    with server_class(script, expected_key=KEY) as server:
        decisions = decide(backend(provider, name, server, top_p=None), calls=4)
    assert decisions[0].tool is Tool.EAT
    assert (decisions[0].tokens_in, decisions[0].tokens_out) == (PROMPT_TOKENS, COMPLETION_TOKENS)
    assert decisions[1].no_call_reason is NoCallReason.NO_CALL
    # Cut off by the token limit, with or without text: truncated, not a choice to idle.
    assert [d.no_call_reason for d in decisions[2:]] == [NoCallReason.TRUNCATED] * 2


def test_anthropic_refusing_temperature_with_top_p_stops_the_job_with_its_words() -> None:
    with AnthropicServer([call("eat")]) as server:
        with pytest.raises(EndpointRequestError) as raised:
            decide(backend("anthropic", ANTHROPIC_MODEL, server, temperature=1.0, top_p=1.0))
        assert len(server.requests) == 1, "a refused request is not retried"
        # Left out, top_p is never sent: the same model then answers.
        (decision,) = decide(backend("anthropic", ANTHROPIC_MODEL, server, top_p=None))
    message = str(raised.value)
    assert (
        f"{server.base_url} refused the request for model '{ANTHROPIC_MODEL}' with HTTP 400"
        in message
    )
    assert BOTH_SAMPLING_MESSAGE in message
    assert KEY not in message
    assert decision.tool is Tool.EAT
    assert "top_p" not in server.requests[1].body
    assert server.requests[1].body["temperature"] == 1.0


def test_a_model_refusing_top_p_stops_the_job_and_null_leaves_it_out() -> None:
    with OpenAIServer([call("eat")], refuse_top_p=True) as server:
        with pytest.raises(EndpointRequestError, match=re.escape(OPENAI_TOP_P_MESSAGE)):
            decide(backend("openai", "gpt-test", server, top_p=1.0))
        (decision,) = decide(backend("openai", "gpt-test", server, temperature=None, top_p=None))
    assert decision.tool is Tool.EAT
    assert not {"temperature", "top_p"} & set(server.requests[1].body)


@pytest.mark.parametrize(("provider", "server_class", "name"), PROVIDERS)
def test_a_refused_key_stops_the_job_for_every_provider(
    provider: str, server_class: type[ProviderServer], name: str
) -> None:
    # Gemini refuses a key with HTTP 400 INVALID_ARGUMENT (reason API_KEY_INVALID), not 401.
    with (
        server_class([call()], expected_key="another-key") as server,
        pytest.raises(EndpointAuthError) as raised,
    ):
        decide(backend(provider, name, server, top_p=None))
    assert len(server.requests) == 1
    assert f"check the API key in environment variable {KEY_ENV}" in str(raised.value)
    assert KEY not in str(raised.value)


@pytest.mark.parametrize(("provider", "server_class", "name"), PROVIDERS)
@pytest.mark.parametrize("status", [400, 404])
def test_a_client_error_stops_the_job_naming_the_model(
    provider: str, server_class: type[ProviderServer], name: str, status: int
) -> None:
    with (
        server_class([error(status, message="model gone fishing")]) as server,
        pytest.raises(EndpointRequestError) as raised,
    ):
        decide(backend(provider, name, server, top_p=None))
    assert len(server.requests) == 1
    assert raised.value.status == status
    assert f"for model '{name}' with HTTP {status}: model gone fishing" in str(raised.value)


@pytest.mark.parametrize(("provider", "server_class", "name"), PROVIDERS)
def test_429_waits_as_the_provider_asks_and_5xx_is_retried(
    provider: str, server_class: type[ProviderServer], name: str
) -> None:
    # Backoff alone would wait at most 0.05 s: a wait near 1 s is the provider's Retry-After
    # (for Gemini, also its body's retryDelay).
    with server_class([rate_limited("1"), error(500), call("think")]) as server:
        start = time.perf_counter()
        (decision,) = decide(backend(provider, name, server, top_p=None, backoff_max_s=5.0))
        elapsed = time.perf_counter() - start
    assert decision.tool is Tool.THINK
    assert len(server.requests) == 3
    assert 1.0 <= elapsed < 4.0


@pytest.mark.parametrize(("provider", "server_class", "name"), PROVIDERS)
def test_persistent_server_errors_end_as_transport_errors_with_their_status(
    provider: str, server_class: type[ProviderServer], name: str
) -> None:
    with server_class([error(500)]) as server:
        (decision,) = decide(backend(provider, name, server, top_p=None, max_retries=1))
    assert decision.no_call_reason is NoCallReason.TRANSPORT_ERROR
    assert decision.raw.endswith("(HTTP 500)")
    assert len(server.requests) == 2


def test_model_kwargs_reach_the_provider_s_request() -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024}
    with AnthropicServer([call("eat")]) as server:
        decide(
            backend(
                "anthropic",
                ANTHROPIC_MODEL,
                server,
                top_p=None,
                max_tokens=2048,
                model_kwargs={"thinking": thinking},
            )
        )
    assert server.requests[0].body["thinking"] == thinking
