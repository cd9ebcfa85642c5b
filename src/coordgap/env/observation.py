"""What a philosopher sees before it decides, structured and as prompt text."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from coordgap.env.protocols import TOOLS, Protocol

if TYPE_CHECKING:
    from coordgap.env.table import Table


@dataclass(frozen=True, slots=True)
class PastTurn:
    """One of the philosopher's own earlier decisions, shown when ``history > 0``."""

    round: int
    tool: str | None
    outcome: str
    reason: str | None


@dataclass(frozen=True, slots=True)
class Observation:
    """The local view of one philosopher at one decision.

    Attributes:
        philosopher: Seat index.
        n: Number of philosophers at the table.
        protocol: The table's action protocol.
        holds_left: Whether it holds its left fork.
        holds_right: Whether it holds its right fork.
        left_free: Whether nobody holds its left fork.
        right_free: Whether nobody holds its right fork.
        meals: Meals it has eaten so far.
        round: The current round, from 1.
        rounds: Rounds in the episode.
        history: Its last decisions, oldest first (empty unless ``history > 0``).
    """

    philosopher: int
    n: int
    protocol: Protocol
    holds_left: bool
    holds_right: bool
    left_free: bool
    right_free: bool
    meals: int
    round: int
    rounds: int
    history: tuple[PastTurn, ...] = ()


def observe(
    table: Table, philosopher: int, round_: int, rounds: int, history: tuple[PastTurn, ...] = ()
) -> Observation:
    """Build the observation of one philosopher from the table state."""
    return Observation(
        philosopher=philosopher,
        n=table.n,
        protocol=table.protocol,
        holds_left=table.holds_left[philosopher],
        holds_right=table.holds_right[philosopher],
        left_free=table.is_free(philosopher, 0),
        right_free=table.is_free(philosopher, 1),
        meals=table.meals[philosopher],
        round=round_,
        rounds=rounds,
        history=history,
    )


@dataclass(frozen=True, slots=True)
class PromptTemplates:
    """The prompt templates of ``config/prompts/``: ``system.txt`` and ``observation.txt``.

    Both are ``str.format`` templates. The system template sees ``n``, ``rounds`` and
    ``tools`` (a comma-separated list): it is the same for every seat, so a local model can
    compute it once and reuse it for every decision. The observation template sees every field
    of ``Observation`` plus ``left_fork``, ``right_fork``, ``left_status``, ``right_status``,
    ``holding`` and ``history_text``.
    """

    system: str
    observation: str

    @classmethod
    def load(cls, folder: str | Path) -> PromptTemplates:
        """Read the templates from a folder."""
        folder = Path(folder)
        return cls(
            system=(folder / "system.txt").read_text(encoding="utf-8"),
            observation=(folder / "observation.txt").read_text(encoding="utf-8"),
        )

    def messages(self, obs: Observation) -> list[dict[str, str]]:
        """The chat a language model is sent: the system prompt, then the observation."""
        return [
            {"role": "system", "content": self.render_system(obs)},
            {"role": "user", "content": self.render_observation(obs)},
        ]

    def render_system(self, obs: Observation) -> str:
        """The system prompt, the same for every philosopher of a table."""
        return self.system.format(n=obs.n, rounds=obs.rounds, tools=", ".join(TOOLS[obs.protocol]))

    def render_observation(self, obs: Observation) -> str:
        """The user message describing the observed state."""
        held = [side for side, h in (("left", obs.holds_left), ("right", obs.holds_right)) if h]
        return self.observation.format(
            **{field: getattr(obs, field) for field in Observation.__slots__},
            left_fork=obs.philosopher,
            right_fork=(obs.philosopher + 1) % obs.n,
            left_status=_fork_status(obs.holds_left, obs.left_free),
            right_status=_fork_status(obs.holds_right, obs.right_free),
            holding=" and ".join(held) + " fork" + ("s" if len(held) == 2 else "")
            if held
            else "no fork",
            history_text=_history_text(obs.history),
        )


def _fork_status(held_by_me: bool, free: bool) -> str:
    if held_by_me:
        return "held by you"
    return "free" if free else "taken by your neighbour"


def _history_text(history: tuple[PastTurn, ...]) -> str:
    if not history:
        return ""
    lines = ["Your recent decisions:"]
    for turn in history:
        what = turn.tool or "no tool call"
        result = turn.outcome if turn.reason is None else f"{turn.outcome} ({turn.reason})"
        lines.append(f"- round {turn.round}: {what} -> {result}")
    return "\n".join(lines) + "\n"
