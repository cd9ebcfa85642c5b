"""The episode timeline: replay on the environment, figure, text, and `coordgap show`."""

from __future__ import annotations

import dataclasses
from importlib import metadata
from typing import TYPE_CHECKING, Any

import polars as pl
import pytest

from coordgap.analysis.stats import read_table
from coordgap.analysis.style import styled
from coordgap.analysis.timeline import (
    TIMELINE_SCHEMA,
    Episode,
    ReplayError,
    load_episode,
    replay,
    steps_path,
    timeline_figure,
    timeline_text,
    write_timeline,
)
from coordgap.cli import main
from coordgap.data import EPISODE_SCHEMA, STEP_SCHEMA
from coordgap.env.protocols import Protocol
from coordgap.env.table import TieBreak, TurnOrder
from tests.unit.analysis_tables import ENV, episode, scripted

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.unit

# Three seats: everyone thinks in round 1, then everyone picks up the left fork in round 2 and
# holds exactly one fork: a circular wait, recorded as the deadlock of round 2.
HAND_MADE = [(1, seat, "think", "ok") for seat in range(3)] + [
    (2, seat, "pick_up_left", "ok") for seat in range(3)
]


def hand_made_episode(model: str = "hand") -> tuple[pl.DataFrame, pl.DataFrame]:
    row = episode(model, 3, 0, deadlock=True, think=3) | {"actions": 6, "decisions": 6}
    steps = [
        {"episode": 0, "round": r, "turn": seat, "philosopher": seat, "tool": tool, "outcome": out}
        | {"reason": None, "raw": tool}
        for r, seat, tool, out in HAND_MADE
    ]
    return pl.DataFrame([row], schema=EPISODE_SCHEMA), pl.DataFrame(steps, schema=STEP_SCHEMA)


def write_cell(folder: Path, episodes: pl.DataFrame, steps: pl.DataFrame) -> Path:
    model = episodes["model"][0]
    path = folder / "results" / "episodes" / model / f"n{episodes['n'][0]}.parquet"
    path.parent.mkdir(parents=True)
    episodes.write_parquet(path)
    steps.write_parquet(steps_path(path))
    return path


def test_hand_made_episode_shows_its_known_deadlock_round(tmp_path: Path) -> None:
    path = write_cell(tmp_path, *hand_made_episode())
    chosen = load_episode(path, steps_path(path), 0)
    timeline = replay(chosen)
    assert timeline.columns == list(TIMELINE_SCHEMA)
    assert timeline.filter("deadlock")["round"].unique().to_list() == [2]
    round_two = timeline.filter(pl.col("round") == 2)
    assert round_two["holds_left"].all()
    assert not round_two["holds_right"].any()
    assert not timeline.filter(pl.col("round") == 1)["holds_left"].any()
    assert "deadlock in round 2" in chosen.title

    with styled():
        figure = timeline_figure(chosen, timeline)
    (axes,) = figure.axes
    assert (axes.get_xlabel(), axes.get_ylabel()) == ("round", "seat")
    assert figure.legends
    labels = [text.get_text() for text in axes.texts]
    assert "deadlock" in labels
    deadlock_label = next(text for text in axes.texts if text.get_text() == "deadlock")
    assert deadlock_label.get_position()[0] == 2  # drawn over round 2
    assert "not played: the episode had ended" in labels

    text = timeline_text(chosen, timeline)
    assert "r2 DEADLOCK" in text
    assert "r1 DEADLOCK" not in text

    files = [tmp_path / f"timeline.{ext}" for ext in ("png", "pdf", "csv")]
    write_timeline(path, steps_path(path), 0, *files)
    assert read_table(files[2], TIMELINE_SCHEMA).equals(timeline)
    pdf = files[1].read_bytes()
    write_timeline(path, steps_path(path), 0, *files)
    assert files[1].read_bytes() == pdf


@pytest.mark.parametrize(
    "env",
    [
        ENV,
        dataclasses.replace(ENV, turn_order=TurnOrder.SEQUENTIAL),
        dataclasses.replace(ENV, protocol=Protocol.DPBENCH4, tie_break=TieBreak.LOWEST_ID),
        dataclasses.replace(ENV, deadlock_terminal=False),
    ],
    ids=["simultaneous", "sequential", "dpbench4", "deadlock-not-terminal"],
)
@pytest.mark.parametrize("policy", ["random", "left_first", "resource_hierarchy", "silent"])
def test_replay_reproduces_every_recorded_outcome_and_meal(env: Any, policy: str) -> None:
    episodes, steps = scripted(policy, 5, 4, env)
    for row in episodes.iter_rows(named=True):
        chosen = Episode(
            row, steps.filter(pl.col("episode") == row["episode"]).sort("round", "turn")
        )
        timeline = replay(chosen)  # raises on any outcome that differs from the record
        assert timeline.height == row["decisions"]
        final = timeline.group_by("philosopher").agg(pl.col("meals").last()).sort("philosopher")
        assert final["meals"].to_list() == row["meals_per_philosopher"]
        assert timeline["ate"].sum() == row["meals_total"]
        ready = timeline.filter(pl.col("holds_left") & pl.col("holds_right")).height
        assert ready == row["both_forks"]
        deadlocks = timeline.filter("deadlock")["round"].unique().sort().to_list()
        assert len(deadlocks) == row["deadlocks"]
        assert (deadlocks[0] if deadlocks else None) == row["deadlock_round"]


def test_steps_that_do_not_replay_are_refused() -> None:
    sequential = dataclasses.replace(ENV, turn_order=TurnOrder.SEQUENTIAL)
    episodes, steps = scripted("random", 5, 1, sequential)
    row = episodes.row(0, named=True)
    # Under another seed the table draws another turn order.
    with pytest.raises(ReplayError, match="turn order"):
        replay(Episode(row | {"seed": row["seed"] + 1}, steps))
    forged = steps.with_columns(
        pl.when(pl.col("outcome") == "failed")
        .then(pl.lit("ok"))
        .otherwise("outcome")
        .alias("outcome")
    )
    with pytest.raises(ReplayError, match="recorded ok"):
        replay(Episode(row, forged))
    with pytest.raises(ReplayError, match="both forks held"):
        replay(Episode(row | {"both_forks": row["both_forks"] + 1}, steps))


def test_coordgap_show_draws_any_episode_of_any_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_cell(tmp_path, *hand_made_episode("smollm2-grpo@best_val"))
    stem = tmp_path / "out" / "drawn"
    stem.parent.mkdir()
    assert main(["show", str(path), "--episode", "0", "--out", str(stem)]) == 0
    printed = capsys.readouterr().out
    assert "smollm2-grpo@best_val, N=3, episode 0: deadlock in round 2" in printed
    for ext in ("png", "pdf", "csv"):
        assert (stem.parent / f"drawn.{ext}").stat().st_size > 0
    # The steps table works as the argument too; the default files go to the working folder.
    monkeypatch.chdir(tmp_path)
    assert main(["show", str(steps_path(path)), "--episode", "0"]) == 0
    assert (tmp_path / "timeline_smollm2-grpo@best_val_n3_e0.png").stat().st_size > 0


def test_coordgap_show_refuses_a_missing_episode_or_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_cell(tmp_path, *hand_made_episode())
    with pytest.raises(SystemExit) as exit_:
        main(["show", str(path), "--episode", "7", "--out", str(tmp_path / "x")])
    assert exit_.value.code == 2
    assert "0 rows for episode 7" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["show", str(tmp_path / "nowhere.parquet"), "--episode", "0"])
    assert "no such table" in capsys.readouterr().err


def test_coordgap_is_a_console_script() -> None:
    (script,) = metadata.entry_points(group="console_scripts", name="coordgap")
    assert script.value == "coordgap.cli:main"
