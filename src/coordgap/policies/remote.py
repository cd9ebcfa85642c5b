"""Chat-model backends: one decision per call to an OpenAI-compatible or LangChain chat model.

The backend owns retries. The client libraries are told not to retry (``max_retries=0``) so that
every wait is visible here, bounded by our settings and drawn from a generator seeded per call:
retries then neither multiply (client retries inside ours) nor break reproducibility. What a
reply or an error means (a message, a retryable failure, a refused key) is decided in
``coordgap.policies.replies``; this module only acts on it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain_core.messages import convert_to_messages
from langchain_core.rate_limiters import InMemoryRateLimiter
from pydantic import SecretStr

from coordgap.config.play import calls_to, endpoint_name
from coordgap.errors import ExpectedFailure
from coordgap.policies.base import Decision, NoCallReason, Transcript
from coordgap.policies.breaker import CircuitBreaker
from coordgap.policies.parsing import parse_ai_message
from coordgap.policies.replies import (
    EndpointAuthError,
    EndpointRequestError,
    GatedHttpClient,
    classify_error,
    provider_message,
    unrepresentable_call,
)
from coordgap.policies.tools import tool_schema

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.runnables import Runnable

    from coordgap.env.protocols import Tool
    from coordgap.policies.base import BatchSlot

logger = logging.getLogger(__name__)

# Sent to keyless local servers. Passing nothing would make the OpenAI client fall back to
# OPENAI_API_KEY from the environment and send a real key to a server that needs none.
KEYLESS_PLACEHOLDER = "not-needed"
# How vLLM names a sampled token with --return-tokens-as-token-ids.
_TOKEN_ID = re.compile(r"token_id:(\d+)")
# tool_choice values passed through as they are; anything else names the one tool to call.
_TOOL_CHOICE_MODES = frozenset({"auto", "required", "none"})
# Chat-model arguments the backend sets from its own fields: model_kwargs may not set them too.
_OWN_ARGUMENTS = frozenset(
    {
        "model",
        "model_name",
        "model_provider",
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "timeout",
        "max_retries",
        "base_url",
        "api_key",
        "logprobs",
        "rate_limiter",
        "extra_body",
        "http_async_client",
        "http_client",
    }
)


class MissingAPIKeyError(ExpectedFailure, RuntimeError):
    """The environment variable that should hold a model's API key is unset or empty."""

    def __init__(self, env_var: str) -> None:
        super().__init__(f"environment variable {env_var} must hold the API key; it is unset")
        self.env_var = env_var


@dataclass(slots=True)
class BackendStats:
    """Running counts of a backend's calls, for progress reporting.

    Attributes:
        calls: Decisions requested.
        retries: Attempts repeated after a retryable failure.
        transport_errors: Decisions that ended as ``TRANSPORT_ERROR``.
    """

    calls: int = 0
    retries: int = 0
    transport_errors: int = 0


@dataclass(eq=False, slots=True)
class OpenAICompatible:
    """A chat model bound to the philosophers' tools: the ``ChatBackend`` of model kind openai.

    Built from its settings, it reads the API key and creates the LangChain chat model at once,
    so a missing key fails at start-up. Many ``decide`` calls may be in flight at once on one
    event loop; they share the model's HTTP connection pool.

    Attributes:
        model: The model name the server knows.
        base_url: The endpoint, e.g. ``http://127.0.0.1:8011/v1``; None for the provider's own.
        provider: ``"openai"`` for any OpenAI-compatible endpoint (vLLM, llama.cpp, OpenAI,
            xAI, OpenRouter); any other value is a LangChain ``init_chat_model`` provider.
        api_key_env: The environment variable holding the API key; None for keyless servers.
        temperature: Sampling temperature; None sends none (the provider's default), for
            models that refuse the parameter.
        top_p: Nucleus-sampling mass; None sends none.
        max_tokens: Completion token limit; None for the server's default. LangChain sends it
            as ``max_completion_tokens``; servers that read only ``max_tokens`` (llama-cpp-python)
            need ``extra_body={"max_tokens": ...}`` instead.
        extra_body: Extra request-body fields (openai only), e.g. Qwen3's
            ``{"chat_template_kwargs": {"enable_thinking": False}}``.
        model_kwargs: Keyword arguments of the LangChain chat model, for settings a provider
            names its own way: ``reasoning_effort`` (openai), ``thinking`` (anthropic),
            ``thinking_level`` or ``thinking_budget`` (google_genai), ``default_headers``.
        tool_choice: ``"auto"``, ``"required"``, ``"none"`` or the name of the tool to call.
            llama.cpp's server answers ``"required"`` with HTTP 500; a tool name works there.
        timeout_s: Limit of one attempt, in seconds.
        max_retries: Attempts after the first for timeouts, 408, 429, 5xx and lost connections.
        backoff_base_s: The first retry waits up to this long; the bound doubles per retry.
        backoff_max_s: The longest wait between attempts, also the cap on a Retry-After.
        stop_after_failures: Consecutive calls that went unanswered after their retries (a
            refused or lost connection, a timeout, a 5xx) with no reply in between, after which
            every call raises ``EndpointUnavailable`` (``coordgap.policies.breaker``).
        requests_per_second: The most requests this backend starts per second, retries
            included (LangChain's in-memory token bucket, one request at a time); None for no
            limit. It holds per job: concurrent jobs on one provider are capped by the
            workflow's per-provider resource.
        record_transcripts: Ask for the sampled tokens' log-probs and record each call's
            transcript for GRPO (provider openai; a server that names tokens by id, as vLLM
            does with ``--return-tokens-as-token-ids``, which ART's server sets).
        stats: Running counts of calls, retries and transport errors.

    Raises:
        MissingAPIKeyError: ``api_key_env`` is set but the variable is unset or empty.
        ImportError: A non-openai provider's LangChain packages are not installed.
        ValueError: A setting is out of range.
    """

    model: str
    base_url: str | None = None
    provider: str = "openai"
    api_key_env: str | None = None
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    max_tokens: int | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)
    tool_choice: str = "auto"
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    stop_after_failures: int = 3
    requests_per_second: float | None = None
    record_transcripts: bool = False
    stats: BackendStats = field(default_factory=BackendStats, init=False)
    _api_key: SecretStr | None = field(init=False, repr=False)
    _chat_model: BaseChatModel = field(init=False, repr=False)
    _breaker: CircuitBreaker = field(init=False, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)
    _bound: dict[tuple[Tool, ...], Runnable[Any, AIMessage]] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if not 0 <= self.backoff_base_s <= self.backoff_max_s:
            raise ValueError(
                f"need 0 <= backoff_base_s <= backoff_max_s, got {self.backoff_base_s} "
                f"and {self.backoff_max_s}"
            )
        if self.requests_per_second is not None and self.requests_per_second <= 0:
            raise ValueError(
                f"requests_per_second must be positive, got {self.requests_per_second}"
            )
        if self.extra_body and self.provider != "openai":
            raise ValueError(f"extra_body needs provider 'openai', not {self.provider!r}")
        if clashes := sorted(_OWN_ARGUMENTS & set(self.model_kwargs)):
            raise ValueError(
                f"model_kwargs may not set {', '.join(clashes)}: the model entry's own keys do"
            )
        if self.record_transcripts and self.temperature is None:
            # A trainer needs the temperature the tokens were sampled at.
            raise ValueError("a model whose calls are recorded for training needs a temperature")
        self._breaker = CircuitBreaker(
            calls_to(self._endpoint, self.model), self.stop_after_failures
        )
        self._api_key = _read_api_key(self.api_key_env)
        self._chat_model = self._build_chat_model()

    async def decide(
        self,
        messages: list[dict[str, str]],
        tools: Sequence[Tool],
        seed: int,
        batch: BatchSlot | None = None,
    ) -> Decision:
        """Ask the model for one tool call, retrying transport failures.

        Args:
            messages: The chat so far, as ``{"role": ..., "content": ...}`` dicts.
            tools: The tools the philosopher may call.
            seed: Seeds the backoff jitter and, for provider openai, the server's sampling.
            batch: Ignored: every call is its own request (the server batches).

        Returns:
            The parsed decision. When every attempt failed, a ``TRANSPORT_ERROR`` decision
            whose ``raw`` names only the error class and HTTP status, or the check a malformed
            reply failed. Whatever the endpoint answers, the call returns a decision or raises
            one of the two errors below.

        Raises:
            EndpointAuthError: The endpoint refused the key (HTTP 401 or 403): every later call
                would fail too, so the job should stop rather than mark episodes ``error``.
            EndpointRequestError: The endpoint refused the request in a way no retry changes
                (a status other than 401, 403, 408, 429 and 5xx), for the same reason.
            EndpointUnavailable: This call or earlier ones made ``stop_after_failures``
                consecutive calls that went unanswered: the endpoint is down or hung.
        """
        model = self._bind(tuple(tools))
        chat = convert_to_messages(messages)
        # Per-call options: the API's seed is an OpenAI parameter other providers may reject.
        options = {"seed": seed} if self.provider == "openai" else {}
        rng = random.Random(seed)
        self.stats.calls += 1
        start = time.perf_counter()
        attempt = 0
        while True:
            # Also before a retry: once the breaker trips, no call sends another request.
            self._breaker.check()
            try:
                # asyncio.timeout, unlike wait_for, needs no extra task per attempt.
                async with asyncio.timeout(self.timeout_s):
                    reply = await model.ainvoke(chat, **options)
            except Exception as exc:
                raw = unrepresentable_call(exc)
                if raw is not None:
                    self._breaker.answered()
                    return Decision(
                        tool=None,
                        no_call_reason=NoCallReason.BAD_ARGUMENTS,
                        raw=raw,
                        latency_s=time.perf_counter() - start,
                    )
                failure = classify_error(exc)
                # from None on every stop: the SDK's message may quote the refused key, and a
                # traceback prints the context of an exception unless it is suppressed.
                if failure.rejected_key:
                    raise EndpointAuthError(
                        failure.status, self._endpoint, self.api_key_env
                    ) from None
                if failure.refused:
                    secret = None if self._api_key is None else self._api_key.get_secret_value()
                    raise EndpointRequestError(
                        failure.status,
                        self._endpoint,
                        self.model,
                        provider_message(exc, secret),
                        self.api_key_env,
                    ) from None
                if failure.retryable and attempt < self.max_retries:
                    attempt += 1
                    self.stats.retries += 1
                    delay = self._backoff(attempt, failure.retry_after_s, rng)
                    logger.debug(
                        "%s: retry %d after %s in %.2f s",
                        self._endpoint,
                        attempt,
                        failure.label,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    continue
                self.stats.transport_errors += 1
                if self._breaker.failed(failure, attempt + 1):
                    raise self._breaker.stop() from None
                return Decision(
                    tool=None,
                    no_call_reason=NoCallReason.TRANSPORT_ERROR,
                    raw=failure.label,
                    latency_s=time.perf_counter() - start,
                )
            self._breaker.answered()
            tool, reason = parse_ai_message(reply, tools)
            usage = reply.usage_metadata or {}
            return Decision(
                tool=tool,
                no_call_reason=reason,
                raw=_render(reply),
                tokens_in=usage.get("input_tokens", 0),
                tokens_out=usage.get("output_tokens", 0),
                latency_s=time.perf_counter() - start,
                transcript=_transcript(messages, tools, reply, self.temperature)
                if self.record_transcripts
                else None,
            )

    @property
    def _endpoint(self) -> str:
        """The endpoint, as error messages name it."""
        return endpoint_name(self.base_url, self.provider)

    def _build_chat_model(self) -> BaseChatModel:
        """Build the LangChain chat model, with the client's own retries off."""
        common: dict[str, Any] = {
            **self.model_kwargs,
            "max_tokens": self.max_tokens,
            "timeout": self.timeout_s,
            "max_retries": 0,
        }
        if self.requests_per_second is not None:
            # A bucket of one: no burst above the rate after an idle spell.
            common["rate_limiter"] = InMemoryRateLimiter(
                requests_per_second=self.requests_per_second,
                check_every_n_seconds=min(0.1, 0.5 / self.requests_per_second),
                max_bucket_size=1,
            )
        # A setting left out is one the request does not carry: some models refuse the
        # parameter itself, whatever its value.
        for name in ("temperature", "top_p", "base_url"):
            if (value := getattr(self, name)) is not None:
                common[name] = value
        if self.provider == "openai":
            from langchain_openai import ChatOpenAI

            return ChatOpenAI(
                model=self.model,
                logprobs=self.record_transcripts or None,
                api_key=self._api_key or SecretStr(KEYLESS_PLACEHOLDER),
                extra_body=dict(self.extra_body) or None,
                # Our own HTTP client: ChatOpenAI's default is shared by every instance with the
                # same URL and timeout, across event loops, and its connections die with the
                # loop that opened them. It checks every reply before the SDK parses it
                # (coordgap.policies.replies); the openai defaults allow 1000 connections.
                http_async_client=GatedHttpClient(),
                **common,
            )
        try:
            from langchain.chat_models import init_chat_model
        except ImportError as exc:
            raise ImportError(
                f"provider {self.provider!r} needs the 'langchain' package and LangChain's "
                f"integration package for {self.provider!r} (for anthropic and google_genai: "
                "pip install -e '.[anthropic,google]'; otherwise pip install langchain "
                f"langchain-{self.provider.replace('_', '-')})"
            ) from exc
        if self._api_key is not None:
            common["api_key"] = self._api_key
        return init_chat_model(self.model, model_provider=self.provider, **common)

    def _bind(self, tools: tuple[Tool, ...]) -> Runnable[Any, AIMessage]:
        """Return the model bound to ``tools``, binding once per tool set and event loop."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # Pooled connections belong to the event loop that opened them, so a later loop (a
            # second asyncio.run) gets a fresh model and client; the first loop keeps the one
            # built at construction, which has opened nothing yet.
            if self._loop is not None:
                self._chat_model = self._build_chat_model()
                self._bound.clear()
            self._loop = loop
        if tools not in self._bound:
            if self.tool_choice not in _TOOL_CHOICE_MODES and self.tool_choice not in tools:
                raise ValueError(f"tool_choice {self.tool_choice!r} is not one of {tools}")
            self._bound[tools] = self._chat_model.bind_tools(
                [tool_schema(tool) for tool in tools], tool_choice=self.tool_choice
            )
        return self._bound[tools]

    def _backoff(self, attempt: int, retry_after_s: float | None, rng: random.Random) -> float:
        """Return the wait before retry ``attempt`` (1-based).

        A server's Retry-After wins, capped at ``backoff_max_s``. Otherwise "full jitter": a
        uniform draw below an exponentially growing bound, which spreads out the retries of the
        many philosophers that failed at the same moment.
        """
        if retry_after_s is not None:
            return min(retry_after_s, self.backoff_max_s)
        bound = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1))
        return rng.uniform(0.0, bound)


def _read_api_key(env_var: str | None) -> SecretStr | None:
    """Return the API key held by ``env_var``; None when no variable is configured."""
    if env_var is None:
        return None
    key = os.environ.get(env_var, "")
    if not key:
        raise MissingAPIKeyError(env_var)
    return SecretStr(key)


def _render(reply: AIMessage) -> str:
    """Return the reply's text followed by its tool calls as JSON, valid and invalid alike."""
    calls = [{"name": c["name"], "arguments": json.dumps(c["args"])} for c in reply.tool_calls]
    calls += [{"name": c["name"], "arguments": c["args"]} for c in reply.invalid_tool_calls]
    return "\n".join(part for part in (reply.text, json.dumps(calls) if calls else "") if part)


def _transcript(
    messages: list[dict[str, str]], tools: Sequence[Tool], reply: AIMessage, temperature: float
) -> Transcript | None:
    """The call as GRPO needs it, or None when the reply names its tokens other than by id.

    A trainer needs the sampled token ids; vLLM gives them as ``token_id:<id>`` strings when
    serving with ``--return-tokens-as-token-ids`` (as ART's server does).
    """
    content = (reply.response_metadata.get("logprobs") or {}).get("content") or []
    ids = [_TOKEN_ID.fullmatch(entry["token"]) for entry in content]
    if not ids or not all(ids):
        logger.warning("a reply without token ids in its log-probs: no transcript recorded")
        return None
    return Transcript(
        messages=tuple(messages),
        completion=_render(reply),
        token_ids=tuple(int(match.group(1)) for match in ids),
        logprobs=tuple(float(entry["logprob"]) for entry in content),
        tools=tuple(tool_schema(tool) for tool in tools),
        temperature=temperature,
    )
