"""Action protocols: the tool sets a philosopher can call.

Two protocols exist. ``tools6`` is the paper's six-tool interface, where eating is an explicit
action and forks stay held after a meal. ``dpbench4`` is DPBench 0.2.1's four-action interface,
where a philosopher holding both forks eats automatically and releases them on its next update.
"""

from __future__ import annotations

from enum import StrEnum


class Protocol(StrEnum):
    """The action protocol of a table."""

    TOOLS6 = "tools6"
    DPBENCH4 = "dpbench4"


class Tool(StrEnum):
    """Every tool name of every protocol; a protocol allows a subset (see ``TOOLS``)."""

    PICK_UP_LEFT = "pick_up_left"
    PICK_UP_RIGHT = "pick_up_right"
    PUT_DOWN_LEFT = "put_down_left"
    PUT_DOWN_RIGHT = "put_down_right"
    EAT = "eat"
    THINK = "think"
    GRAB_LEFT = "grab_left"
    GRAB_RIGHT = "grab_right"
    RELEASE = "release"
    WAIT = "wait"


TOOLS: dict[Protocol, tuple[Tool, ...]] = {
    Protocol.TOOLS6: (
        Tool.PICK_UP_LEFT,
        Tool.PICK_UP_RIGHT,
        Tool.PUT_DOWN_LEFT,
        Tool.PUT_DOWN_RIGHT,
        Tool.EAT,
        Tool.THINK,
    ),
    Protocol.DPBENCH4: (Tool.GRAB_LEFT, Tool.GRAB_RIGHT, Tool.RELEASE, Tool.WAIT),
}

# The tools that reach for the right fork, one per protocol: what the positive control rewards
# (coordgap.env.variants).
RIGHT_REACHES: frozenset[Tool] = frozenset({Tool.PICK_UP_RIGHT, Tool.GRAB_RIGHT})

# The idle tool of each protocol: legal, changes nothing, counts toward r_idle.
IDLE_TOOL: dict[Protocol, Tool] = {Protocol.TOOLS6: Tool.THINK, Protocol.DPBENCH4: Tool.WAIT}

TOOL_DESCRIPTIONS: dict[Tool, str] = {
    Tool.PICK_UP_LEFT: "Pick up your left fork. Succeeds only if it is free.",
    Tool.PICK_UP_RIGHT: "Pick up your right fork. Succeeds only if it is free.",
    Tool.PUT_DOWN_LEFT: "Put down your left fork. Succeeds only if you hold it.",
    Tool.PUT_DOWN_RIGHT: "Put down your right fork. Succeeds only if you hold it.",
    Tool.EAT: "Eat one meal. Succeeds only while you hold both forks; you keep holding them.",
    Tool.THINK: "Think for this round and do nothing else.",
    Tool.GRAB_LEFT: "Grab your left fork if it is free.",
    Tool.GRAB_RIGHT: "Grab your right fork if it is free.",
    Tool.RELEASE: "Release every fork you hold.",
    Tool.WAIT: "Wait for this step. Holding both forks, you eat automatically.",
}
