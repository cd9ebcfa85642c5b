"""The OpenAI-compatible backend against a real model server: llama.cpp with SmolLM2-135M."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from coordgap.env.protocols import TOOLS, Protocol
from coordgap.policies.base import NoCallReason
from coordgap.policies.remote import OpenAICompatible
from coordgap.policies.serving import launch
from tests.integration.processes import (
    llama_server_command,
    llama_server_python,
    needs_llama_server,
    smollm2_gguf,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from coordgap.policies.base import Decision
    from coordgap.policies.serving import Endpoint

LLAMA_PYTHON = llama_server_python()
pytestmark = [pytest.mark.integration, pytest.mark.slow, needs_llama_server]

READY_TIMEOUT_S = 120.0
# Every pairing of the forks' states (i % 2, i % 3) once; each call takes ~3 s on 2 cores.
DECISIONS = 6


@pytest.fixture(scope="module")
def llama_server() -> Iterator[Endpoint]:
    """llama.cpp's server on a free loopback port, started by the job launcher."""
    assert LLAMA_PYTHON is not None
    command = llama_server_command(LLAMA_PYTHON, smollm2_gguf(), threads=2)
    with launch(
        command, key_env="API_KEY", health="/v1/models", start_timeout_s=READY_TIMEOUT_S
    ) as endpoint:
        yield endpoint


def observation(seat: int, left_free: bool, right_free: bool) -> list[dict[str, str]]:
    """A small dining-philosophers prompt; the state varies so the calls are not all alike."""
    fork = {True: "free", False: "taken"}
    return [
        {
            "role": "system",
            "content": f"You are philosopher {seat} at a round table of 5. Call exactly one "
            "tool to act this round.",
        },
        {
            "role": "user",
            "content": f"Your left fork is {fork[left_free]}. Your right fork is "
            f"{fork[right_free]}. You hold no fork. You have eaten 0 meals. Round 1 of 5.",
        },
    ]


def test_smollm2_through_llama_cpp_gives_a_decision_every_call(llama_server: Endpoint) -> None:
    tools = TOOLS[Protocol.TOOLS6]
    model = OpenAICompatible(
        model="smollm2",
        base_url=llama_server.base_url,
        api_key_env=llama_server.key_env,
        tool_choice="auto",
        # llama-cpp-python reads max_tokens only, not the max_completion_tokens LangChain sends;
        # the bound keeps a reply in prose from running on to the context size.
        extra_body={"max_tokens": 64},
        # Generous: on a shared 2-core machine one call has taken 27 s.
        timeout_s=120.0,
        max_retries=1,
    )

    async def play() -> list[Decision]:
        return [
            await model.decide(observation(i % 5, i % 2 == 0, i % 3 == 0), tools, seed=i)
            for i in range(DECISIONS)
        ]

    decisions = asyncio.run(play())
    assert len(decisions) == DECISIONS
    for decision in decisions:
        if decision.tool is None:
            assert isinstance(decision.no_call_reason, NoCallReason), decision
        else:
            assert decision.tool in tools
            assert decision.no_call_reason is None
    # The server is healthy, so transport must not be why a call produced no tool.
    assert model.stats.transport_errors == 0, [d.raw for d in decisions]
    assert any(decision.tool is not None for decision in decisions)
    assert all(decision.tokens_in > 0 for decision in decisions)
