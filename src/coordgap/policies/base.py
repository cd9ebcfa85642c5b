"""What every policy returns, and the interface the episode runner calls."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from coordgap.env.observation import Observation
    from coordgap.env.protocols import Tool


class NoCallReason(StrEnum):
    """Why a decision produced no parseable tool call (DESIGN.md §2)."""

    EMPTY = "empty"
    NO_CALL = "no_call"
    UNKNOWN_TOOL = "unknown_tool"
    BAD_ARGUMENTS = "bad_arguments"
    SEVERAL_CALLS = "several_calls"
    TRANSPORT_ERROR = "transport_error"


@dataclass(frozen=True, slots=True)
class Decision:
    """One philosopher's decision.

    Attributes:
        tool: The tool called, or None when there was no parseable call.
        no_call_reason: Why there was no call; None when ``tool`` is set.
        raw: The raw output the decision was parsed from.
        tokens_in: Prompt tokens spent (0 for scripted policies).
        tokens_out: Completion tokens spent.
        latency_s: Wall time of the call.
    """

    tool: Tool | None
    no_call_reason: NoCallReason | None = None
    raw: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0


class Policy(Protocol):
    """Decides for a batch of philosophers that observe the table at the same moment."""

    def decide(self, observations: Sequence[Observation]) -> list[Decision]:
        """Return one decision per observation, in order."""
        ...
