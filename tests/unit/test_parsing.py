"""Structured replies (LangChain AIMessage) map to one tool or to the right no_call reason."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage

from coordgap.env.protocols import TOOLS, Protocol, Tool
from coordgap.policies.base import NoCallReason
from coordgap.policies.parsing import parse_ai_message, parse_text_tool_calls

pytestmark = pytest.mark.unit

TOOLS6 = TOOLS[Protocol.TOOLS6]


def _call(name: str, args: dict | None = None, call_id: str = "c1") -> dict:
    return {"name": name, "args": {} if args is None else args, "id": call_id, "type": "tool_call"}


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (AIMessage(content="", tool_calls=[_call("eat")]), (Tool.EAT, None)),
        (AIMessage(content=""), (None, NoCallReason.EMPTY)),
        (AIMessage(content="   "), (None, NoCallReason.EMPTY)),
        (AIMessage(content="I shall eat now."), (None, NoCallReason.NO_CALL)),
        (
            AIMessage(content="", tool_calls=[_call("eat"), _call("think", call_id="c2")]),
            (None, NoCallReason.SEVERAL_CALLS),
        ),
        (AIMessage(content="", tool_calls=[_call("fly")]), (None, NoCallReason.UNKNOWN_TOOL)),
        (
            AIMessage(content="", tool_calls=[_call("eat", {"fork": 1})]),
            (None, NoCallReason.BAD_ARGUMENTS),
        ),
        (
            AIMessage(
                content="",
                invalid_tool_calls=[
                    {"name": "eat", "args": '{"fork": ', "id": "c1", "error": "bad json"}
                ],
            ),
            (None, NoCallReason.BAD_ARGUMENTS),
        ),
        (
            AIMessage(
                content="",
                tool_calls=[_call("eat")],
                invalid_tool_calls=[{"name": "x", "args": "{", "id": "c2", "error": "bad"}],
            ),
            (None, NoCallReason.SEVERAL_CALLS),
        ),
    ],
)
def test_structured_reply_maps_to_tool_or_reason(reply, expected):
    assert parse_ai_message(reply, TOOLS6) == expected


def test_a_tool_of_the_other_protocol_is_unknown():
    reply = AIMessage(content="", tool_calls=[_call("grab_left")])
    assert parse_ai_message(reply, TOOLS6) == (None, NoCallReason.UNKNOWN_TOOL)
    assert parse_ai_message(reply, TOOLS[Protocol.DPBENCH4]) == (Tool.GRAB_LEFT, None)


@pytest.mark.parametrize(
    "metadata",
    [{"finish_reason": "length"}, {"finish_reason": "MAX_TOKENS"}, {"stop_reason": "max_tokens"}],
)
def test_a_reply_cut_off_by_the_token_limit_is_truncated_unless_it_is_a_call(metadata):
    # OpenAI-compatible servers, Gemini and Anthropic say it each their own way.
    for content in ("", "Let me think about which fork"):
        reply = AIMessage(content=content, response_metadata=metadata)
        assert parse_ai_message(reply, TOOLS6) == (None, NoCallReason.TRUNCATED)
    cut_call = AIMessage(content="", tool_calls=[_call("eat")], response_metadata=metadata)
    assert parse_ai_message(cut_call, TOOLS6) == (Tool.EAT, None)
    finished = AIMessage(content="", response_metadata={"finish_reason": "stop"})
    assert parse_ai_message(finished, TOOLS6) == (None, NoCallReason.EMPTY)


def test_a_text_reply_cut_off_is_truncated():
    unclosed = '<tool_call>{"name": "eat", "argum'
    assert parse_text_tool_calls(unclosed, TOOLS6) == (None, NoCallReason.BAD_ARGUMENTS)
    assert parse_text_tool_calls(unclosed, TOOLS6, truncated=True) == (
        None,
        NoCallReason.TRUNCATED,
    )
    done = '<tool_call>{"name": "eat", "arguments": {}}'
    assert parse_text_tool_calls(done, TOOLS6, truncated=True) == (Tool.EAT, None)
