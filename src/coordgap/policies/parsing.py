"""Turning a model's reply into a tool call, or into the reason there is none.

Parsers first extract the calls a reply contains, in whatever shape the backend delivers
them, as ``_Call`` values; one table (``_RULES``) then decides, in order, which reason a set
of calls gets. Every parser shares that table, so a reply means the same thing whichever
backend produced it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coordgap.env.protocols import Tool
from coordgap.policies.base import NoCallReason

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from langchain_core.messages import AIMessage

# The Hermes format: a block per call. An unclosed last block counts too (a reply cut off by
# the token limit), as in vLLM's hermes tool parser.
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class _Call:
    """One call as found in a reply, before it is checked.

    Attributes:
        name: The called name; None when the call could not be decoded at all.
        arguments: The decoded arguments; ``{}`` when the call gave none.
        decoded: False when the call's JSON was malformed.
    """

    name: object = None
    arguments: object = field(default_factory=dict)
    decoded: bool = True


# (reason, test) in order of precedence: the first test that holds gives the reason, and a
# reply that passes them all is a valid call. A test sees the reply's text, its calls and the
# names of the allowed tools.
_RULES: tuple[tuple[NoCallReason, Callable[[str, Sequence[_Call], frozenset[str]], bool]], ...] = (
    (NoCallReason.EMPTY, lambda text, calls, _: not calls and not text.strip()),
    (NoCallReason.NO_CALL, lambda _, calls, __: not calls),
    (NoCallReason.SEVERAL_CALLS, lambda _, calls, __: len(calls) > 1),
    (NoCallReason.BAD_ARGUMENTS, lambda _, calls, __: not calls[0].decoded),
    (NoCallReason.UNKNOWN_TOOL, lambda _, calls, allowed: calls[0].name not in allowed),
    (NoCallReason.BAD_ARGUMENTS, lambda _, calls, __: calls[0].arguments != {}),
)


# How each provider says that a reply ended at the completion token limit, as LangChain's
# response_metadata holds it: OpenAI-compatible servers' finish_reason, Gemini's finishReason,
# Anthropic's stop_reason.
_TRUNCATION = (
    ("finish_reason", "length"),
    ("finish_reason", "MAX_TOKENS"),
    ("stop_reason", "max_tokens"),
)


def _judge(
    text: str, calls: Sequence[_Call], tools: Sequence[Tool], truncated: bool = False
) -> tuple[Tool | None, NoCallReason | None]:
    """Apply ``_RULES`` to the calls extracted from a reply.

    A reply that was cut off by the token limit and is no valid call is ``TRUNCATED``,
    whatever it would be otherwise: the model did not choose to send it as it is.
    """
    allowed = frozenset(tool.value for tool in tools)
    for reason, fails in _RULES:
        if fails(text, calls, allowed):
            return None, NoCallReason.TRUNCATED if truncated else reason
    return Tool(calls[0].name), None


def is_truncated(reply: AIMessage) -> bool:
    """Whether the provider says the reply ended at the completion token limit."""
    metadata = reply.response_metadata
    return any(metadata.get(key) == value for key, value in _TRUNCATION)


def _decode_call(payload: str) -> _Call:
    """Read one ``{"name": ..., "arguments": ...}`` object; a malformed one is undecoded."""
    try:
        call = json.loads(payload)
    except json.JSONDecodeError:
        return _Call(decoded=False)
    if not isinstance(call, dict) or "name" not in call:
        return _Call(decoded=False)
    return _Call(name=call["name"], arguments=call.get("arguments", {}))


def _bare_calls(text: str) -> list[_Call]:
    """Every top-level JSON object in ``text`` that has a ``name`` key, in order."""
    decoder = json.JSONDecoder()
    calls = []
    start = text.find("{")
    while start != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict) and "name" in value:
            calls.append(_Call(name=value["name"], arguments=value.get("arguments", {})))
        start = text.find("{", end)
    return calls


def parse_text_tool_calls(
    text: str, tools: Sequence[Tool], truncated: bool = False
) -> tuple[Tool | None, NoCallReason | None]:
    """Find the one tool call in a model's text reply.

    A call is either a ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block or,
    when the text has no such block, a bare JSON object with a ``name`` key (and optional
    ``arguments``). Every tool takes no arguments, so only an empty object is valid.

    Args:
        text: The reply, special tokens removed.
        tools: The tools allowed at this table.
        truncated: The reply ended at the token limit.

    Returns:
        ``(tool, None)`` for exactly one valid call, otherwise ``(None, reason)``: TRUNCATED
        for a reply cut off by the token limit, else EMPTY for a blank reply, NO_CALL for text
        without a call, SEVERAL_CALLS for more than one call, BAD_ARGUMENTS for malformed JSON
        or arguments other than ``{}``, UNKNOWN_TOOL for a name that is not an allowed tool.
    """
    blocks = [closed or unclosed for closed, unclosed in _TOOL_CALL.findall(text)]
    calls = [_decode_call(block) for block in blocks] if blocks else _bare_calls(text)
    return _judge(text, calls, tools, truncated)


def parse_ai_message(
    reply: AIMessage, tools: Sequence[Tool]
) -> tuple[Tool | None, NoCallReason | None]:
    """Find the one tool call in a chat model's structured reply.

    LangChain has already split the reply's calls into ``tool_calls`` (arguments decoded) and
    ``invalid_tool_calls`` (arguments that were not valid JSON); both count as calls.

    Args:
        reply: The model's message.
        tools: The tools allowed at this table.

    Returns:
        ``(tool, None)`` for exactly one valid call, otherwise ``(None, reason)`` with the same
        reasons as ``parse_text_tool_calls``; truncation is what the provider's metadata says
        (``is_truncated``).
    """
    calls = [_Call(name=call["name"], arguments=call["args"]) for call in reply.tool_calls]
    calls += [_Call(decoded=False) for _ in reply.invalid_tool_calls]
    return _judge(reply.text, calls, tools, is_truncated(reply))
