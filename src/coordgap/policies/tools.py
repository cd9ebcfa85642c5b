"""The philosophers' tools as OpenAI function schemas, the form chat models are bound to."""

from __future__ import annotations

from typing import Any

from coordgap.env.protocols import TOOL_DESCRIPTIONS, TOOLS, Protocol, Tool


def tool_schema(tool: Tool) -> dict[str, Any]:
    """Return the OpenAI function schema of one tool.

    The dict form is what ``ChatOpenAI.bind_tools`` passes through unchanged and what every
    OpenAI-compatible server (vLLM, llama.cpp) reads; no LangChain tool object is needed because
    the tools are never executed by LangChain, only chosen.

    Args:
        tool: The tool.

    Returns:
        ``{"type": "function", "function": {...}}`` with the tool's name, its description, and
        an empty parameter object that admits no properties (the tools take no arguments).
    """
    return {
        "type": "function",
        "function": {
            "name": tool.value,
            "description": TOOL_DESCRIPTIONS[tool],
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    }


def tool_schemas(protocol: Protocol) -> list[dict[str, Any]]:
    """Return the function schemas of a protocol's tools, in the protocol's order."""
    return [tool_schema(tool) for tool in TOOLS[protocol]]
