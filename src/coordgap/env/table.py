"""Table state and transition semantics of the dining-philosophers environment.

N philosophers sit on a ring with N forks; philosopher ``i``'s left fork is ``i`` and its right
fork is ``(i + 1) % N``. A round is one decision per philosopher, resolved either all at once
(``simultaneous``) or one after another (``sequential``).

Two protocols share this state:

* ``tools6`` (the paper's): explicit pick-up, put-down and eat; forks stay held after a meal.
  Simultaneous resolution applies put-downs first, then pick-ups against the freed state (one
  fork wanted by two philosophers goes to the tie-break winner), then eats.
* ``dpbench4`` (DPBench 0.2.1's): grab, release-all and wait; a philosopher that ends an update
  holding both forks eats, and releases both at its next update whatever it chose. The order of
  operations copies DPBench exactly, including its quirk: an eating philosopher that also chooses
  ``release`` frees its forks in the release pass, a neighbour's grab of them is granted, and the
  eater's auto-release then frees them again. A lower-id neighbour already updated keeps
  believing it holds that fork until its next update. That is why each philosopher's own view of
  what it holds (``holds_left``/``holds_right``) is stored apart from the fork holders.

The ``tie_break`` rule orders seats wherever order matters: ``lowest_id`` gives a contested fork
to the lowest seat and makes the sequential order 0..N-1 (DPBench's rule); ``random`` draws the
winner, and the sequential order of each round, from the table's seeded generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from operator import ne
from typing import TYPE_CHECKING

from coordgap.env.protocols import Protocol, Tool

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    import numpy as np

FREE = -1  # fork_holder value of a fork nobody holds


class TurnOrder(StrEnum):
    """How the decisions of one round are applied."""

    SIMULTANEOUS = "simultaneous"
    SEQUENTIAL = "sequential"


class TieBreak(StrEnum):
    """Who wins a contested fork (and, in sequential mode, who moves first)."""

    RANDOM = "random"
    LOWEST_ID = "lowest_id"


class Outcome(StrEnum):
    """What became of one decision."""

    OK = "ok"
    FAILED = "failed"
    NO_CALL = "no_call"


class FailReason(StrEnum):
    """Why a legal tool call changed nothing."""

    FORK_TAKEN = "fork_taken"
    LOST_TIE = "lost_tie"
    ALREADY_HELD = "already_held"
    NOT_HELD = "not_held"
    MISSING_FORK = "missing_fork"


@dataclass(frozen=True, slots=True)
class Result:
    """The outcome of one decision, with the reason when it is not ``ok``."""

    outcome: Outcome
    reason: str | None = None


OK = Result(Outcome.OK)
NO_CALL = Result(Outcome.NO_CALL)
# Results are immutable, so every decision shares these instead of building its own.
_FAILED = {reason: Result(Outcome.FAILED, reason) for reason in FailReason}

# What a decision does to the table, whatever the protocol calls it. A pick-up's kind is also
# the side it reaches for (0 left, 1 right), and so is a put-down's kind minus _PUT_LEFT.
_PICK_LEFT, _PICK_RIGHT, _PUT_LEFT, _PUT_RIGHT, _RELEASE, _EAT, _IDLE, _NONE = range(8)
_KIND: dict[Tool | None, int] = {
    Tool.PICK_UP_LEFT: _PICK_LEFT,
    Tool.GRAB_LEFT: _PICK_LEFT,
    Tool.PICK_UP_RIGHT: _PICK_RIGHT,
    Tool.GRAB_RIGHT: _PICK_RIGHT,
    Tool.PUT_DOWN_LEFT: _PUT_LEFT,
    Tool.PUT_DOWN_RIGHT: _PUT_RIGHT,
    Tool.RELEASE: _RELEASE,
    Tool.EAT: _EAT,
    Tool.THINK: _IDLE,
    Tool.WAIT: _IDLE,
    None: _NONE,
}


class Table:
    """Mutable state of one table: fork holders, what each philosopher holds, meals.

    Args:
        n: Number of philosophers (at least 2).
        protocol: The action protocol.
        tie_break: The seat-priority rule.
        rng: The table's own generator; used only under ``tie_break: random``.
    """

    def __init__(
        self, n: int, protocol: Protocol, tie_break: TieBreak, rng: np.random.Generator
    ) -> None:
        if n < 2:
            raise ValueError(f"a table needs at least 2 philosophers, got {n}")
        self.n = n
        self.protocol = protocol
        self.tie_break = tie_break
        self.rng = rng
        self.fork_holder = [FREE] * n
        self.holds_left = [False] * n
        self.holds_right = [False] * n
        self.eating = [False] * n  # dpbench4 only: ate at its last update, releases at the next
        self.meals = [0] * n

    # ------------------------------------------------------------------ queries

    def fork(self, philosopher: int, side: int) -> int:
        """Index of a philosopher's fork; ``side`` is 0 for left, 1 for right."""
        return (philosopher + side) % self.n

    def holds(self, philosopher: int, side: int) -> bool:
        """Whether the philosopher believes it holds its left (0) or right (1) fork."""
        return (self.holds_right if side else self.holds_left)[philosopher]

    def is_free(self, philosopher: int, side: int) -> bool:
        """Whether nobody holds the philosopher's left (0) or right (1) fork."""
        return self.fork_holder[(philosopher + side) % self.n] == FREE

    def is_deadlocked(self) -> bool:
        """A circular wait: nobody is eating and every philosopher holds exactly one fork."""
        return not any(self.eating) and all(map(ne, self.holds_left, self.holds_right))

    def seat_order(self) -> list[int]:
        """The order in which philosophers move in one sequential round."""
        if self.tie_break is TieBreak.LOWEST_ID:
            return list(range(self.n))
        return [int(i) for i in self.rng.permutation(self.n)]

    # ------------------------------------------------------------------ transitions

    def resolve_simultaneous(self, tools: Sequence[Tool | None]) -> list[Result]:
        """Apply one round in which every philosopher decided from the same state.

        Args:
            tools: One entry per philosopher: the tool called, or None for no parseable call.
                Tools must belong to the table's protocol.

        Returns:
            One result per philosopher, in seat order.
        """
        n = self.n
        holder, holds_left, holds_right = self.fork_holder, self.holds_left, self.holds_right
        results = [OK] * n
        pick_ups: list[tuple[int, int]] = []  # (seat, fork), in seat order
        eaters: list[int] = []
        # Pass 1: put-downs (tools6) or releases (dpbench4), judged on the pre-round holdings.
        for i, tool in enumerate(tools):
            kind = _KIND[tool]
            if kind == _IDLE:
                continue
            if kind <= _PICK_RIGHT:
                pick_ups.append((i, (i + kind) % n))
            elif kind <= _PUT_RIGHT:
                results[i] = self._put_down(i, kind - _PUT_LEFT)
            elif kind == _RELEASE:
                results[i] = self._release(i)
            elif kind == _EAT:
                eaters.append(i)
            else:
                results[i] = NO_CALL
        # Pass 2: pick-ups against the freed state. The first requester of a free fork gets it
        # provisionally; a second requester makes it a contest, settled below.
        claims: dict[int, int] = {}  # fork -> first requester
        contests: list[tuple[int, int, int]] = []  # (first requester, second, fork)
        for i, fork in pick_ups:
            if fork in claims:
                contests.append((claims[fork], i, fork))
            elif holder[fork] != FREE:
                results[i] = self._blocked_pick_up(i, fork)
            else:
                claims[fork] = i
                holder[fork] = i
                # The fork with the philosopher's own index is its left one.
                (holds_left if fork == i else holds_right)[i] = True
        if contests:
            self._settle(contests, results)
        # Pass 3: eats (tools6) or DPBench's per-seat update with automatic eating.
        if self.protocol is Protocol.DPBENCH4:
            self._dpbench_update(range(n))
        else:
            for i in eaters:
                results[i] = self._eat(i)
        return results

    def act(self, philosopher: int, tool: Tool | None) -> Result:
        """Apply one philosopher's decision on its own (a turn in a sequential round).

        Args:
            philosopher: The seat that moves.
            tool: The tool called, or None for no parseable call.

        Returns:
            The result of the decision.
        """
        kind = _KIND[tool]
        if kind <= _PICK_RIGHT:
            result = self._pick_up(philosopher, kind)
        elif kind <= _PUT_RIGHT:
            result = self._put_down(philosopher, kind - _PUT_LEFT)
        elif kind == _RELEASE:
            result = self._release(philosopher)
        elif kind == _EAT:
            result = self._eat(philosopher)
        elif kind == _IDLE:
            result = OK
        else:
            result = NO_CALL
        if self.protocol is Protocol.DPBENCH4:
            self._dpbench_update((philosopher,))
        return result

    def release_all(self) -> None:
        """Force every fork free (breaks a deadlock when deadlock is not terminal)."""
        self.fork_holder = [FREE] * self.n
        self.holds_left = [False] * self.n
        self.holds_right = [False] * self.n
        self.eating = [False] * self.n

    # ------------------------------------------------------------------ helpers

    def _settle(self, contests: list[tuple[int, int, int]], results: list[Result]) -> None:
        """Decide contested forks, each provisionally granted to its first requester.

        Under ``lowest_id`` the first requester, always the lower seat, keeps the fork. Under
        ``random`` one draw per contest picks the winner, in the order the forks were first
        requested, which is the order of the first requesters' seats.
        """
        if self.tie_break is TieBreak.RANDOM:
            contests.sort()
        for first, second, fork in contests:
            if self.tie_break is TieBreak.RANDOM and int(self.rng.integers(2)):
                # The second requester wins: move the fork over.
                (self.holds_left if fork == first else self.holds_right)[first] = False
                (self.holds_left if fork == second else self.holds_right)[second] = True
                self.fork_holder[fork] = second
                results[first] = _FAILED[FailReason.LOST_TIE]
            else:
                results[second] = _FAILED[FailReason.LOST_TIE]

    def _blocked_pick_up(self, philosopher: int, fork: int) -> Result:
        if self.fork_holder[fork] == philosopher:
            return _FAILED[FailReason.ALREADY_HELD]
        return _FAILED[FailReason.FORK_TAKEN]

    def _pick_up(self, philosopher: int, side: int) -> Result:
        fork = (philosopher + side) % self.n
        if self.fork_holder[fork] != FREE:
            return self._blocked_pick_up(philosopher, fork)
        self.fork_holder[fork] = philosopher
        (self.holds_right if side else self.holds_left)[philosopher] = True
        return OK

    def _put_down(self, philosopher: int, side: int) -> Result:
        held = self.holds_right if side else self.holds_left
        if not held[philosopher]:
            return _FAILED[FailReason.NOT_HELD]
        held[philosopher] = False
        self.fork_holder[(philosopher + side) % self.n] = FREE
        return OK

    def _release(self, philosopher: int) -> Result:
        """DPBench's release: free every fork the philosopher believes it holds.

        What the philosopher holds is left for ``_dpbench_update`` to recompute, as DPBench does.
        """
        if not (self.holds_left[philosopher] or self.holds_right[philosopher]):
            return _FAILED[FailReason.NOT_HELD]
        if self.holds_left[philosopher]:
            self.fork_holder[philosopher] = FREE
        if self.holds_right[philosopher]:
            self.fork_holder[(philosopher + 1) % self.n] = FREE
        return OK

    def _eat(self, philosopher: int) -> Result:
        if not (self.holds_left[philosopher] and self.holds_right[philosopher]):
            return _FAILED[FailReason.MISSING_FORK]
        self.meals[philosopher] += 1
        return OK

    def _dpbench_update(self, seats: Iterable[int]) -> None:
        """DPBench's end-of-turn update of each seat, in the given order.

        An eating philosopher releases both forks and goes hungry; any other recomputes what it
        holds from the fork holders and, holding both, eats.
        """
        n = self.n
        holder, holds_left, holds_right = self.fork_holder, self.holds_left, self.holds_right
        eating, meals = self.eating, self.meals
        for i in seats:
            right = i + 1 if i + 1 < n else 0
            if eating[i]:
                holder[i] = holder[right] = FREE
                holds_left[i] = holds_right[i] = eating[i] = False
            else:
                has_left = holds_left[i] = holder[i] == i
                has_right = holds_right[i] = holder[right] == i
                if has_left and has_right:
                    eating[i] = True
                    meals[i] += 1
