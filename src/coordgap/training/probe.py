"""What an update did to the policy: a fixed probe set, round 1's prompts, the rollouts' choices.

The probe set is one seat's observation at round 1, before any meal, in every situation its
forks can be in (holding neither, the left, the right or both; each fork it does not hold free
or taken): nine prompts that cover every decision the table asks for. Scoring them after each
update under the current adapter and the untrained one gives KL(mu_step || mu_0), a measure of
how far training has moved the six-way policy that is free of the rollouts' sampling noise.

Round 1's prompts are every seat's first observation of a table, as play makes them. Under
simultaneous turns they are the same whatever the policy, so the positive control's reward
(``coordgap.env.variants``: the share of seats whose round-1 decision reaches right) has the
exact expectation mean_i mu(right | seat i's round-1 prompt), which N forward passes compute.
"""

from __future__ import annotations

import math
from itertools import product
from typing import TYPE_CHECKING, Any

import polars as pl

from coordgap.data import CALL_COLUMNS, table_generator
from coordgap.env.observation import Observation
from coordgap.env.protocols import Tool
from coordgap.env.table import Table, TurnOrder
from coordgap.episodes import EpisodeRecorder

if TYPE_CHECKING:
    from coordgap.config.play import EnvironmentConfig
    from coordgap.env.observation import PromptTemplates


def probe_conversations(
    env: EnvironmentConfig, templates: PromptTemplates, n: int
) -> list[list[dict[str, str]]]:
    """The probe set's conversations at an ``n``-seat table (see the module docstring).

    Args:
        env: The table rules (protocol, rounds).
        templates: The prompt templates.
        n: Philosophers at the table.

    Returns:
        Nine conversations, as a language-model philosopher is sent them.
    """
    observations = [
        Observation(
            philosopher=0,
            n=n,
            protocol=env.protocol,
            holds_left=holds_left,
            holds_right=holds_right,
            left_free=left_free and not holds_left,
            right_free=right_free and not holds_right,
            meals=0,
            round=1,
            rounds=env.rounds,
        )
        for holds_left, holds_right, left_free, right_free in product((False, True), repeat=4)
        # A held fork is not free: keep one of the two otherwise identical situations.
        if (left_free or not holds_left) and (right_free or not holds_right)
    ]
    return [templates.messages(obs) for obs in observations]


def first_round_conversations(
    env: EnvironmentConfig, templates: PromptTemplates, n: int
) -> list[list[dict[str, str]]] | None:
    """Every seat's round-1 conversation at an ``n``-seat table, or None under sequential turns.

    They come from the episode recorder's own observations of a new table, as play makes them
    (no fork held, every fork free, no meal, no history). Under simultaneous turns every seat
    decides round 1 from that state; under sequential turns a later mover sees the forks the
    earlier ones took, so its prompt depends on the policy and the round has no such set.

    Args:
        env: The table rules (protocol, turn order, rounds).
        templates: The prompt templates.
        n: Philosophers at the table.

    Returns:
        ``n`` conversations, seat 0 first, as a language-model philosopher is sent them.
    """
    if env.turn_order is not TurnOrder.SIMULTANEOUS:
        return None
    # The table's generator decides contested forks and sequential orders only: nothing before
    # the first decision draws from it.
    recorder = EpisodeRecorder(env, Table(n, env.protocol, env.tie_break, table_generator(0)))
    recorder.start_round()
    return [templates.messages(recorder.observe(seat)) for seat in range(n)]


def rollout_choices(episodes: pl.DataFrame, transcripts: pl.DataFrame) -> dict[str, Any]:
    """The rollouts' action distribution and the mean entropy of the policy that drew them.

    Args:
        episodes: A step's rollout episode table (its ``ok`` episodes count).
        transcripts: Its transcript table.

    Returns:
        ``actions_<tool>``: each tool's share of the decisions (a ``no_call`` counts in none);
        ``entropy_mean``: the mean entropy of mu, in nats, over the constrained decisions
        (NaN without any).
    """
    ok = episodes.filter(pl.col("status") == "ok")
    decisions = ok["decisions"].sum()
    row = {
        f"actions_{tool}": ok[column].sum() / decisions if decisions else math.nan
        for tool, column in zip(Tool, CALL_COLUMNS, strict=True)
    }
    constrained = transcripts.filter(pl.col("candidates").is_not_null())
    entropies = [
        _entropy(scores, temperature)
        for scores, temperature in zip(
            constrained["scores"].to_list(), constrained["temperature"].to_list(), strict=True
        )
    ]
    row["entropy_mean"] = sum(entropies) / len(entropies) if entropies else math.nan
    return row


def _entropy(scores: list[float], temperature: float) -> float:
    """The entropy of softmax(scores / T), in nats (0 at T = 0: the choice is certain)."""
    if temperature == 0:
        return 0.0
    scaled = [s / temperature for s in scores]
    top = max(scaled)
    weights = [math.exp(s - top) for s in scaled]
    total = sum(weights)
    return -sum(w / total * math.log(w / total) for w in weights if w > 0)
