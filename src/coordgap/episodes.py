"""Episode bookkeeping, and the plain reference loop that plays one episode.

``EpisodeRecorder`` is the one place that turns decisions and their results into the episode
row, step rows and transcripts of ``coordgap.data``; both the LangGraph agents
(``coordgap.agents``) and ``play_episode`` use it. ``play_episode`` is the dependency-free
reference: the graphs must reproduce it exactly for scripted policies, and the property tests,
the 1,000-episode sweeps and the environment benchmark use it for speed.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, deque
from dataclasses import dataclass, field
from operator import and_
from typing import TYPE_CHECKING, Any

from coordgap.data import CALL_COLUMNS
from coordgap.env.observation import Observation, PastTurn, observe
from coordgap.env.protocols import IDLE_TOOL, RIGHT_REACHES
from coordgap.env.reward import components
from coordgap.env.table import Outcome, Result, Table, TurnOrder
from coordgap.policies.base import NoCallReason

if TYPE_CHECKING:
    import numpy as np

    from coordgap.config.play import EnvironmentConfig
    from coordgap.data import EpisodeSeeds
    from coordgap.policies.base import Decision, Policy, Transcript


@dataclass
class EpisodeLog:
    """What one episode produced, without its identity columns (model, N, episode, seed)."""

    row: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    transcripts: list[dict[str, Any]] = field(default_factory=list)

    def tables(
        self, *, model: str, checkpoint: str, n: int, episode: int, seeds: EpisodeSeeds
    ) -> dict[str, list[dict[str, Any]]]:
        """The episode's rows of the three tables of ``coordgap.data``, identity columns added.

        Args:
            model: The model's name.
            checkpoint: ``base``, or the training checkpoint that played (``step_0003``).
            n: Number of philosophers.
            episode: The episode's index in its table.
            seeds: The episode's seeds (its ``seed`` column is the table's).

        Returns:
            ``{"episodes": [row], "steps": [...], "transcripts": [...]}``.
        """
        identity = {"model": model, "checkpoint": checkpoint, "n": n, "episode": episode}
        seed_columns = {"seed": seeds.table, "scenario": seeds.scenario}
        return {
            "episodes": [{**identity, **seed_columns, **self.row}],
            "steps": [{"episode": episode, **step} for step in self.steps],
            "transcripts": [{"episode": episode, **t} for t in self.transcripts],
        }


class EpisodeRecorder:
    """Accumulates one episode: per-seat history, counts, step rows and transcripts.

    Args:
        env: The table rules.
        table: The episode's table.
    """

    def __init__(self, env: EnvironmentConfig, table: Table) -> None:
        self.env = env
        self.table = table
        self.round = 0
        self._history: list[deque[PastTurn]] = [deque(maxlen=env.history) for _ in range(table.n)]
        self._calls: Counter[str] = Counter()
        self._outcomes: Counter[Outcome] = Counter()
        self._no_call_reasons: Counter[NoCallReason] = Counter()
        self._tokens_in = self._tokens_out = 0
        self._latency = 0.0
        self._deadlocks = 0
        self._both_forks = 0
        self._round1_right = 0
        self._deadlock_round: int | None = None
        self.log = EpisodeLog(row={})

    def start_round(self) -> None:
        """Advance to the next round."""
        self.round += 1

    def observe(self, seat: int) -> Observation:
        """The observation of one seat now, with its recent history."""
        return observe(self.table, seat, self.round, self.env.rounds, tuple(self._history[seat]))

    def record(self, turn: int, seat: int, decision: Decision, result: Result) -> None:
        """Record one decision and what became of it."""
        tool = None if decision.tool is None else decision.tool.value
        reason = decision.no_call_reason if decision.tool is None else result.reason
        if tool is not None:
            self._calls[tool] += 1
        if self.round == 1 and decision.tool in RIGHT_REACHES:
            self._round1_right += 1
        if decision.no_call_reason is not None:
            self._no_call_reasons[decision.no_call_reason] += 1
        self._outcomes[result.outcome] += 1
        self._tokens_in += decision.tokens_in
        self._tokens_out += decision.tokens_out
        self._latency += decision.latency_s
        self.log.steps.append(
            {
                "round": self.round,
                "turn": turn,
                "philosopher": seat,
                "tool": tool,
                "outcome": result.outcome.value,
                "reason": None if reason is None else str(reason),
                "raw": decision.raw,
            }
        )
        if decision.transcript is not None:
            self.log.transcripts.append(
                {"round": self.round, "philosopher": seat, **transcript_row(decision.transcript)}
            )
        if self.env.history:
            self._history[seat].append(PastTurn(self.round, tool, result.outcome.value, reason))

    def end_round(self) -> bool:
        """Close a round: count who holds both forks, check for deadlock; True when it is over."""
        self._both_forks += sum(map(and_, self.table.holds_left, self.table.holds_right))
        if self.table.is_deadlocked():
            self._deadlocks += 1
            self._deadlock_round = self._deadlock_round or self.round
            if self.env.deadlock_terminal:
                return True
            self.table.release_all()
        return self.round >= self.env.rounds

    def finish(self) -> EpisodeLog:
        """Close the episode: counts, reward components and status into the episode row.

        An episode in which any call failed in transport (after retries) gets status
        ``error``: its decisions say more about the network than about the model, so the
        analysis counts it apart instead of scoring it.
        """
        meals = self.table.meals
        think = self._calls[IDLE_TOOL[self.env.protocol].value]
        actions = self._outcomes[Outcome.OK] + self._outcomes[Outcome.FAILED]
        reward = components(
            n=self.table.n,
            rounds=self.env.rounds,
            meals=meals,
            deadlock=self._deadlocks > 0,
            actions=actions,
            think=think,
        )
        self.log.row = {
            "protocol": self.env.protocol.value,
            "turn_order": self.env.turn_order.value,
            "tie_break": self.env.tie_break.value,
            "rounds": self.env.rounds,
            "rounds_run": self.round,
            "status": "error" if self._no_call_reasons[NoCallReason.TRANSPORT_ERROR] else "ok",
            "deadlock": self._deadlocks > 0,
            "deadlock_round": self._deadlock_round,
            "deadlocks": self._deadlocks,
            "meals_total": sum(meals),
            "meals_per_philosopher": list(meals),
            "both_forks": self._both_forks,
            **{column: self._calls[column.removeprefix("calls_")] for column in CALL_COLUMNS},
            "round1_right": self._round1_right,
            "decisions": sum(self._outcomes.values()),
            "actions": actions,
            "think": think,
            "failed": self._outcomes[Outcome.FAILED],
            "no_call": self._outcomes[Outcome.NO_CALL],
            "truncated": self._no_call_reasons[NoCallReason.TRUNCATED],
            "r_nd": reward.r_nd,
            "r_thru": reward.r_thru,
            "r_fair": reward.r_fair,
            "r_idle": reward.r_idle,
            "tokens_in": self._tokens_in,
            "tokens_out": self._tokens_out,
            "latency_s": self._latency,
        }
        return self.log


def play_episode(
    env: EnvironmentConfig,
    n: int,
    policy: Policy,
    table_rng: np.random.Generator,
) -> EpisodeLog:
    """Play one episode with a plain loop (the reference the agent graphs must match).

    Args:
        env: The table rules.
        n: Number of philosophers.
        policy: Decides for every philosopher; fresh per episode.
        table_rng: The table's generator (tie-breaks, sequential order).

    Returns:
        The episode's row (without identity columns), step rows and transcripts.
    """
    table = Table(n, env.protocol, env.tie_break, table_rng)
    recorder = EpisodeRecorder(env, table)
    done = False
    while not done:
        recorder.start_round()
        if env.turn_order is TurnOrder.SIMULTANEOUS:
            decisions = policy.decide([recorder.observe(seat) for seat in range(n)])
            results = table.resolve_simultaneous([d.tool for d in decisions])
            for seat, (decision, result) in enumerate(zip(decisions, results, strict=True)):
                recorder.record(seat, seat, decision, result)
        else:
            for turn, seat in enumerate(table.seat_order()):
                (decision,) = policy.decide([recorder.observe(seat)])
                recorder.record(turn, seat, decision, table.act(seat, decision.tool))
        done = recorder.end_round()
    return recorder.finish()


def transcript_row(transcript: Transcript) -> dict[str, Any]:
    """A transcript's columns of the transcript table (``coordgap.data.TRANSCRIPT_SCHEMA``)."""
    row = dataclasses.asdict(transcript)
    row["messages"] = json.dumps(row["messages"])
    row["tools"] = None if transcript.tools is None else json.dumps(row["tools"])
    return row
