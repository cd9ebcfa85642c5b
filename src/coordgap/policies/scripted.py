"""Scripted reference policies: the classical solution, the classical failure, and baselines.

Each policy is written once in protocol-neutral *intents* (reach for a fork, eat, let go, idle)
and mapped onto the table's tools, so the same policy runs under ``tools6`` and ``dpbench4``.
Under ``dpbench4`` eating is automatic and releasing drops both forks, so "eat" becomes a wait
and the two put-downs collapse into one release.
"""

from __future__ import annotations

import json
from enum import Enum, auto
from typing import TYPE_CHECKING

from coordgap.config.play import ScriptedPolicy
from coordgap.env.protocols import IDLE_TOOL, TOOLS, Protocol, Tool
from coordgap.policies.base import Decision, NoCallReason

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy as np

    from coordgap.env.observation import Observation


class Intent(Enum):
    """A protocol-neutral action."""

    TAKE_LEFT = auto()
    TAKE_RIGHT = auto()
    DROP_LEFT = auto()
    DROP_RIGHT = auto()
    EAT = auto()
    IDLE = auto()


_TOOL_OF: dict[Protocol, dict[Intent, Tool]] = {
    Protocol.TOOLS6: {
        Intent.TAKE_LEFT: Tool.PICK_UP_LEFT,
        Intent.TAKE_RIGHT: Tool.PICK_UP_RIGHT,
        Intent.DROP_LEFT: Tool.PUT_DOWN_LEFT,
        Intent.DROP_RIGHT: Tool.PUT_DOWN_RIGHT,
        Intent.EAT: Tool.EAT,
        Intent.IDLE: Tool.THINK,
    },
    Protocol.DPBENCH4: {
        Intent.TAKE_LEFT: Tool.GRAB_LEFT,
        Intent.TAKE_RIGHT: Tool.GRAB_RIGHT,
        Intent.DROP_LEFT: Tool.RELEASE,
        Intent.DROP_RIGHT: Tool.RELEASE,
        Intent.EAT: Tool.WAIT,
        Intent.IDLE: Tool.WAIT,
    },
}


def _call(tool: Tool) -> Decision:
    """A scripted decision, with the raw output an LLM would have produced for it."""
    return Decision(tool=tool, raw=json.dumps({"name": tool.value, "arguments": {}}))


class ForkOrderPolicy:
    """Take a first fork, then the second, eat once, then put down second and first.

    With the first fork chosen as the lower-numbered one this is Dijkstra's resource
    hierarchy, which cannot deadlock; with the first fork always the left one it is the naive
    protocol, which deadlocks as soon as everybody reaches for the left fork at once.

    Args:
        n: Number of philosophers.
        protocol: The table's protocol.
        lower_fork_first: Dijkstra's ordering if True, left fork first otherwise.
    """

    def __init__(self, n: int, protocol: Protocol, *, lower_fork_first: bool) -> None:
        self._tools = _TOOL_OF[protocol]
        # first[i] is 0 (left) or 1 (right): the side philosopher i reaches for first. Only
        # the last seat's right fork (fork 0) is lower than its left one.
        self._first = [int(lower_fork_first and (i + 1) % n < i) for i in range(n)]
        self._ate_with_forks = [False] * n

    def decide(self, observations: Sequence[Observation]) -> list[Decision]:
        """Return each philosopher's next step of the take-eat-release cycle."""
        return [_call(self._tools[self._intent(obs)]) for obs in observations]

    def _intent(self, obs: Observation) -> Intent:
        i = obs.philosopher
        first = self._first[i]
        take = (Intent.TAKE_LEFT, Intent.TAKE_RIGHT)
        drop = (Intent.DROP_LEFT, Intent.DROP_RIGHT)
        holds = (obs.holds_left, obs.holds_right)
        if holds[0] and holds[1]:
            if not self._ate_with_forks[i]:
                # Under dpbench4 the meal already happened on pick-up; EAT maps to a wait
                # while the table releases both forks at this philosopher's next update.
                self._ate_with_forks[i] = True
                return Intent.EAT
            return drop[1 - first]
        if holds[1 - first]:
            # Only the second fork: never reached by the cycle itself, but letting go of it
            # restores the ordering invariant whatever happened.
            return drop[1 - first]
        if holds[first]:
            return drop[first] if self._ate_with_forks[i] else take[1 - first]
        self._ate_with_forks[i] = False
        return take[first]


class RandomPolicy:
    """Uniform over the protocol's tools.

    Each seat draws from its own child of the episode's policy generator, so the draws do not
    depend on the order in which concurrent philosophers happen to be served.
    """

    def __init__(self, n: int, protocol: Protocol, rng: np.random.Generator) -> None:
        self._tools = TOOLS[protocol]
        self._seat_rngs = rng.spawn(n)

    def decide(self, observations: Sequence[Observation]) -> list[Decision]:
        """Draw one tool per observation."""
        return [
            _call(self._tools[int(self._seat_rngs[obs.philosopher].integers(len(self._tools)))])
            for obs in observations
        ]


class ThinkOnlyPolicy:
    """Always idles: never deadlocks, never eats."""

    def __init__(self, protocol: Protocol) -> None:
        self._decision = _call(IDLE_TOOL[protocol])

    def decide(self, observations: Sequence[Observation]) -> list[Decision]:
        """Idle for every observation."""
        return [self._decision] * len(observations)


class SilentPolicy:
    """Never emits a parseable tool call: the paper reward's degenerate maximum."""

    _DECISION = Decision(tool=None, no_call_reason=NoCallReason.EMPTY, raw="")

    def decide(self, observations: Sequence[Observation]) -> list[Decision]:
        """Answer nothing for every observation."""
        return [self._DECISION] * len(observations)


# Each scripted policy's constructor (n, protocol, episode rng); the schema's names are tested
# against these keys, and a name without one raises.
ScriptedPolicyType = ForkOrderPolicy | RandomPolicy | ThinkOnlyPolicy | SilentPolicy
SCRIPTED_POLICIES: dict[
    ScriptedPolicy, Callable[[int, Protocol, np.random.Generator], ScriptedPolicyType]
] = {
    ScriptedPolicy.RESOURCE_HIERARCHY: lambda n, protocol, rng: ForkOrderPolicy(
        n, protocol, lower_fork_first=True
    ),
    ScriptedPolicy.LEFT_FIRST: lambda n, protocol, rng: ForkOrderPolicy(
        n, protocol, lower_fork_first=False
    ),
    ScriptedPolicy.RANDOM: RandomPolicy,
    ScriptedPolicy.THINK_ONLY: lambda n, protocol, rng: ThinkOnlyPolicy(protocol),
    ScriptedPolicy.SILENT: lambda n, protocol, rng: SilentPolicy(),
}


def make_scripted_policy(
    name: ScriptedPolicy, n: int, protocol: Protocol, rng: np.random.Generator
) -> ScriptedPolicyType:
    """Create a fresh scripted policy for one episode.

    Args:
        name: Which policy.
        n: Number of philosophers.
        protocol: The table's protocol.
        rng: The episode's policy generator (only ``random`` draws from it).

    Returns:
        A policy with per-episode state.

    Raises:
        KeyError: For a name without a policy.
    """
    return SCRIPTED_POLICIES[name](n, protocol, rng)
