"""Degenerate-policy monitors on real scripted episodes and on crafted tables."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import polars as pl
import pytest

from coordgap.analysis.monitors import MONITOR_SCHEMA, MONITORS, flagged, monitor, write_monitors
from coordgap.analysis.stats import read_table
from tests.unit.analysis_tables import MONITORS as THRESHOLDS
from tests.unit.analysis_tables import episode, frame, scripted

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.unit


def flags_of(episodes: pl.DataFrame) -> dict[tuple[str, int], list[str]]:
    return {
        (row["model"], row["n"]): flagged(row)
        for row in monitor(episodes, THRESHOLDS).iter_rows(named=True)
    }


def test_silent_policy_is_flagged_degenerate_and_no_call() -> None:
    episodes, _ = scripted("silent", 5, 6)
    row = monitor(episodes, THRESHOLDS).row(0, named=True)
    assert row["degenerate_share"] == 1.0
    assert row["no_call_rate"] == 1.0
    assert row["all_think_share"] == 0.0  # no action at all is not a think collapse
    assert flagged(row) == ["degenerate", "no_call"]


def test_think_only_policy_is_flagged_degenerate_and_all_think() -> None:
    episodes, _ = scripted("think_only", 5, 6)
    assert flags_of(episodes) == {("think_only", 5): ["degenerate", "all_think"]}


def test_resource_hierarchy_is_not_degenerate_idle_or_silent() -> None:
    episodes, _ = scripted("resource_hierarchy", 5, 6)
    row = monitor(episodes, THRESHOLDS).row(0, named=True)
    assert row["degenerate_share"] == 0.0
    assert row["all_think_share"] == 0.0
    assert row["no_call_rate"] == 0.0
    assert not {"degenerate", "all_think", "no_call"} & set(flagged(row))


def test_resource_hierarchy_starves_seats_within_five_rounds() -> None:
    """Dijkstra's order never deadlocks, but in five simultaneous rounds only the last two seats
    ever eat: the starvation monitor reports it rather than hiding it."""
    episodes, _ = scripted("resource_hierarchy", 5, 6)
    row = monitor(episodes, THRESHOLDS).row(0, named=True)
    assert row["starvation_share"] == 1.0
    assert row["starvation"]


def test_starvation_fires_on_a_crafted_table_and_not_where_every_seat_eats() -> None:
    starved = [episode("greedy", 4, i, meals=[2, 0, 0, 0]) for i in range(4)]
    fair = [episode("fair", 4, i, meals=[1, 1, 1, 1]) for i in range(4)]
    none = [episode("none", 4, i, think=3) for i in range(4)]  # nobody ate: nobody starved alone
    flags = flags_of(frame(starved + fair + none))
    assert flags[("greedy", 4)] == ["starvation"]
    assert flags[("fair", 4)] == []
    assert "starvation" not in flags[("none", 4)]


def test_thresholds_decide_the_flags() -> None:
    rows = [episode("mixed", 5, i, no_call=5 if i < 2 else 0, think=10) for i in range(4)]
    episodes = frame(rows)
    # Two of four episodes have all their five decisions as no-calls: 10 of 50 decisions.
    row = monitor(episodes, THRESHOLDS).row(0, named=True)
    assert row["no_call_rate"] == pytest.approx(10 / 50)
    assert not row["no_call"]
    looser = replace(THRESHOLDS, thresholds={**THRESHOLDS.thresholds, "no_call_rate": 0.2})
    assert monitor(episodes, looser).row(0, named=True)["no_call"]


def test_truncation_is_flagged_apart_from_no_calls() -> None:
    # One decision of 50 cut off by the token limit: a no_call to the reward, and flagged.
    meals = [1] * 5
    rows = [
        episode("cut", 5, i, meals=meals, no_call=1, truncated=int(i == 0), think=6)
        for i in range(4)
    ]
    row = monitor(frame(rows), THRESHOLDS).row(0, named=True)
    assert row["truncated_rate"] == pytest.approx(1 / 48)
    assert row["no_call_rate"] == pytest.approx(4 / 48)
    assert row["truncated"]
    assert not row["no_call"]
    assert flagged(row) == ["truncated"]
    clean = frame([episode("clean", 5, i, meals=meals, no_call=1, think=6) for i in range(4)])
    assert not monitor(clean, THRESHOLDS).row(0, named=True)["truncated"]


def test_degenerate_reward_threshold_uses_the_paper_reward() -> None:
    # All-think episodes without a meal score 1.0 - 0.1 = 0.9 under the paper reward.
    episodes = frame([episode("idle", 5, i, think=25) for i in range(3)])
    assert monitor(episodes, THRESHOLDS)["degenerate_share"].item() == 1.0
    stricter = replace(THRESHOLDS, degenerate_reward=0.95)
    assert monitor(episodes, stricter)["degenerate_share"].item() == 0.0


def test_errored_episodes_are_left_out_and_an_all_error_cell_is_null(tmp_path: Path) -> None:
    silent, _ = scripted("silent", 5, 3)
    broken = frame([episode("broken", 5, i, status="error") for i in range(2)])
    mixed = frame([episode("silent", 5, 10, meals=[1, 1, 0, 0, 0], status="error")])
    table = monitor(pl.concat([silent, broken, mixed]), THRESHOLDS)
    assert table.columns == list(MONITOR_SCHEMA)
    assert table.filter(pl.col("model") == "silent")["degenerate_share"].item() == 1.0
    row = table.filter(pl.col("model") == "broken").row(0, named=True)
    assert row["episodes"] == 0
    assert all(row[check.share] is None for check in MONITORS.values())
    assert all(row[name] is None for name in MONITORS)
    assert flagged(row) == []
    path = tmp_path / "monitors.csv"
    episode_path = tmp_path / "episodes.parquet"
    pl.concat([silent, broken]).write_parquet(episode_path)
    write_monitors([episode_path], THRESHOLDS, path)
    assert read_table(path, MONITOR_SCHEMA).equals(monitor(pl.concat([silent, broken]), THRESHOLDS))
