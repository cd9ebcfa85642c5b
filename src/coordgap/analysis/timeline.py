"""One episode, seat by seat and round by round: its decisions, forks, meals and deadlock.

The steps table (``coordgap.data``) records each decision and its outcome but not the forks each
seat held. They are recovered by replaying the recorded decisions on a fresh
:class:`~coordgap.env.table.Table` with the episode's own table generator (from its seed), so
contested forks and sequential turn orders come out as they did; every replayed outcome is
checked against the recorded one, and the final meals against the episode row. The rules of
the table are never re-derived here.

The replay gives a timeline table (``TIMELINE_SCHEMA``): one row per decision with the forks
the seat held at the end of its round, whether it ate in that round and its meals so far, and
whether the round ended in a deadlock. It is
drawn as a seats x rounds figure (:func:`timeline_figure`) and as text for a terminal
(:func:`timeline_text`); ``coordgap show`` draws any episode of any table.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import and_
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from coordgap.analysis.style import new_figure, save_figure, styled
from coordgap.data import STEP_SCHEMA, table_generator
from coordgap.env.protocols import TOOLS, Protocol, Tool
from coordgap.env.table import Table, TieBreak, TurnOrder

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The decision as recorded in the steps table, then what the replay adds.
TIMELINE_SCHEMA: dict[str, pl.DataType] = {
    **{
        column: STEP_SCHEMA[column]
        for column in ("round", "turn", "philosopher", "tool", "outcome", "reason")
    },
    "holds_left": pl.Boolean(),
    "holds_right": pl.Boolean(),
    "ate": pl.Boolean(),
    "meals": pl.Int64(),
    "deadlock": pl.Boolean(),
}

# Short names of the tools, for cells of a figure or of a terminal.
ABBREVIATIONS: dict[str | None, str] = {
    Tool.PICK_UP_LEFT: "PL",
    Tool.PICK_UP_RIGHT: "PR",
    Tool.PUT_DOWN_LEFT: "DL",
    Tool.PUT_DOWN_RIGHT: "DR",
    Tool.EAT: "EAT",
    Tool.THINK: "T",
    Tool.GRAB_LEFT: "GL",
    Tool.GRAB_RIGHT: "GR",
    Tool.RELEASE: "REL",
    Tool.WAIT: "W",
    None: "--",
}
# How each outcome fills a cell: greyscale-readable by hatch as well as by grey.
_OUTCOME_FILL = {"ok": ("white", ""), "failed": ("0.8", "xxx"), "no_call": ("0.6", "...")}
_OUTCOME_MARK = {"ok": "", "failed": "!", "no_call": "?"}


class ReplayError(ValueError):
    """The recorded steps of an episode do not replay to what was recorded."""


@dataclass(frozen=True)
class Episode:
    """One episode: its row of the episode table and its rows of the steps table."""

    row: dict[str, Any]
    steps: pl.DataFrame

    @property
    def title(self) -> str:
        """A one-line description: model, N, episode, and how it ended."""
        row = self.row
        meals = f"{row['meals_total']} meal{'s' if row['meals_total'] != 1 else ''}"
        end = (
            f"deadlock in round {row['deadlock_round']}"
            if row["deadlock"]
            else f"no deadlock in {row['rounds_run']} rounds"
        )
        status = "" if row["status"] == "ok" else f" [status {row['status']}]"
        return f"{row['model']}, N={row['n']}, episode {row['episode']}: {end}, {meals}{status}"


def steps_path(episodes_path: str | Path) -> Path:
    """The steps table beside an episode table (``n5.parquet`` -> ``n5.steps.parquet``)."""
    path = Path(episodes_path)
    return path.with_name(path.name.removesuffix(".parquet") + ".steps.parquet")


def load_episode(episodes_path: str | Path, steps: str | Path, episode: int) -> Episode:
    """Read one episode's row and steps.

    Args:
        episodes_path: An episode table (``results/episodes/<model>/n<N>.parquet``).
        steps: Its steps table.
        episode: The episode index.

    Returns:
        The episode.

    Raises:
        ValueError: If the episode table does not hold exactly one row for the episode.
    """
    rows = pl.read_parquet(episodes_path).filter(pl.col("episode") == episode)
    if rows.height != 1:
        raise ValueError(f"{episodes_path}: {rows.height} rows for episode {episode}, not 1")
    decisions = pl.read_parquet(steps).filter(pl.col("episode") == episode)
    return Episode(rows.row(0, named=True), decisions.sort("round", "turn"))


def _check(recorded: dict[str, Any], outcome: str, reason: str | None) -> None:
    # A no_call's recorded reason says why the call was unparseable; the table knows nothing of it.
    expected_reason = recorded["reason"] if recorded["outcome"] == "failed" else None
    if (recorded["outcome"], expected_reason) != (outcome, reason if outcome == "failed" else None):
        raise ReplayError(
            f"round {recorded['round']}, seat {recorded['philosopher']}: recorded "
            f"{recorded['outcome']} ({recorded['reason']}), replayed {outcome} ({reason})"
        )


def replay(episode: Episode) -> pl.DataFrame:
    """Replay an episode's decisions on the environment and tabulate what each seat held.

    Args:
        episode: The episode, from :func:`load_episode`.

    Returns:
        One row per decision, by round and turn, with the columns of ``TIMELINE_SCHEMA``:
        forks held and meals eaten by the seat at the end of its round, and whether the round
        ended in a circular wait.

    Raises:
        ReplayError: If a replayed outcome, the turn order, the final meals or the count of
            rounds ending with both forks held differ from the record (the table or its seed
            are not the ones the episode was played with).
    """
    row = episode.row
    n = row["n"]
    table_rng = table_generator(row["seed"])
    table = Table(n, Protocol(row["protocol"]), TieBreak(row["tie_break"]), table_rng)
    simultaneous = TurnOrder(row["turn_order"]) is TurnOrder.SIMULTANEOUS
    rounds = episode.steps.partition_by("round", maintain_order=True)
    timeline = []
    meals_before = [0] * n
    both_forks = 0
    for index, decisions in enumerate(rounds):
        recorded = decisions.to_dicts()
        tools = [None if d["tool"] is None else Tool(d["tool"]) for d in recorded]
        if simultaneous:
            by_seat = sorted(zip(recorded, tools, strict=True), key=lambda p: p[0]["philosopher"])
            results = table.resolve_simultaneous([tool for _, tool in by_seat])
            outcomes = dict(zip((d["philosopher"] for d, _ in by_seat), results, strict=True))
        else:
            order = table.seat_order()
            if order != [d["philosopher"] for d in recorded]:
                raise ReplayError(f"round {recorded[0]['round']}: turn order {order} replayed")
            outcomes = {
                d["philosopher"]: table.act(d["philosopher"], tool)
                for d, tool in zip(recorded, tools, strict=True)
            }
        both_forks += sum(map(and_, table.holds_left, table.holds_right))
        deadlocked = table.is_deadlocked()
        # Meals are counted from the table rather than from eat calls: under dpbench4 eating
        # is automatic.
        eaten = {seat: table.meals[seat] for seat in outcomes}
        for decision in recorded:
            seat = decision["philosopher"]
            result = outcomes[seat]
            _check(decision, result.outcome.value, result.reason)
            timeline.append(
                {
                    **{key: decision[key] for key in ("round", "turn", "philosopher", "tool")},
                    "outcome": decision["outcome"],
                    "reason": decision["reason"],
                    "holds_left": table.holds_left[seat],
                    "holds_right": table.holds_right[seat],
                    "ate": eaten[seat] > meals_before[seat],
                    "meals": eaten[seat],
                    "deadlock": deadlocked,
                }
            )
        meals_before = list(table.meals)
        if deadlocked and index + 1 < len(rounds):
            table.release_all()  # deadlock_terminal: false plays on with every fork released
    if table.meals != list(row["meals_per_philosopher"]):
        raise ReplayError(
            f"replayed meals {table.meals} differ from the recorded "
            f"{list(row['meals_per_philosopher'])}"
        )
    if both_forks != row["both_forks"]:
        raise ReplayError(
            f"replayed rounds ending with both forks held, {both_forks}, differ from the "
            f"recorded {row['both_forks']}"
        )
    return pl.DataFrame(timeline, schema=TIMELINE_SCHEMA)


def _cell_text(decision: dict[str, Any]) -> str:
    return ABBREVIATIONS[decision["tool"]] + _OUTCOME_MARK[decision["outcome"]]


def timeline_figure(episode: Episode, timeline: pl.DataFrame) -> Figure:
    """Draw an episode as seats (rows) x rounds (columns).

    Each cell holds the seat's decision (greyed and hatched when it failed or carried no tool
    call), the forks the seat held at the end of the round (a triangle at the side of each
    fork), and a star for a meal; a hatched band marks each round that ended in a deadlock.

    Args:
        episode: The episode.
        timeline: Its replay, from :func:`replay`.

    Returns:
        The figure.
    """
    n = episode.row["n"]
    # Every configured round gets a column, so an episode cut short by a deadlock shows it.
    rounds = list(range(1, max(episode.row["rounds"], episode.row["rounds_run"]) + 1))
    figure, (axes,) = new_figure(3.8 + 1.0 * len(rounds), 1.6 + 0.32 * n)
    for decision in timeline.iter_rows(named=True):
        x, y = decision["round"], decision["philosopher"]
        fill, hatch = _OUTCOME_FILL[decision["outcome"]]
        axes.add_patch(
            Rectangle(
                (x - 0.42, y - 0.38), 0.84, 0.76, facecolor=fill, hatch=hatch, edgecolor="0.35"
            )
        )
        axes.text(
            x,
            y,
            _cell_text(decision),
            ha="center",
            va="center",
            fontsize=7,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.8},  # legible on a hatch
        )
        if decision["holds_left"]:
            axes.plot(x - 0.33, y, marker="<", color="black", markersize=4)
        if decision["holds_right"]:
            axes.plot(x + 0.33, y, marker=">", color="black", markersize=4)
    meals = timeline.filter("ate")
    axes.scatter(meals["round"] + 0.3, meals["philosopher"] - 0.25, marker="*", s=30, color="black")
    for deadlock_round in timeline.filter("deadlock")["round"].unique().sort():
        axes.axvspan(
            deadlock_round - 0.5,
            deadlock_round + 0.5,
            fill=False,
            hatch="//",
            color="0.4",
            zorder=0,
        )
        axes.text(deadlock_round, -0.75, "deadlock", ha="center", va="bottom", fontsize=8)
    played = episode.row["rounds_run"]
    if played < rounds[-1]:
        middle = (played + 1 + rounds[-1]) / 2
        axes.text(
            middle, (n - 1) / 2, "not played: the episode had ended", ha="center", color="0.4"
        )
    final = timeline.group_by("philosopher").agg(pl.col("meals").last()).sort("philosopher")
    for seat, eaten in final.iter_rows():
        axes.text(
            rounds[-1] + 0.6,
            seat,
            f"{eaten} meal{'s' if eaten != 1 else ''}",
            va="center",
            fontsize=7,
        )
    axes.set_xlim(rounds[0] - 0.6, rounds[-1] + 1.3)
    axes.set_ylim(n - 0.5, -1.0)
    axes.set_xticks(rounds)
    axes.set_yticks(range(n))
    axes.grid(visible=False)
    axes.set_xlabel("round")
    axes.set_ylabel("seat")
    figure.suptitle(episode.title)
    legend = [
        Patch(facecolor="white", edgecolor="0.35", label="decision ok"),
        Patch(facecolor="0.8", hatch="xxx", edgecolor="0.35", label="failed (!)"),
        Patch(facecolor="0.6", hatch="...", edgecolor="0.35", label="no tool call (?)"),
        Line2D([], [], marker="<", color="black", linestyle="none", label="holds left fork"),
        Line2D([], [], marker=">", color="black", linestyle="none", label="holds right fork"),
        Line2D([], [], marker="*", color="black", linestyle="none", label="meal"),
        Patch(fill=False, hatch="//", edgecolor="0.4", label="deadlock"),
    ]
    # The key to the tool abbreviations of the episode's protocol, as text-only entries.
    legend += [
        Line2D([], [], linestyle="none", label=f"{ABBREVIATIONS[tool]}  {tool}")
        for tool in TOOLS[Protocol(episode.row["protocol"])]
    ]
    figure.legend(handles=legend, loc="outside right center")
    return figure


def timeline_text(episode: Episode, timeline: pl.DataFrame) -> str:
    """Render an episode as a plain-text grid: seats x rounds.

    A cell reads ``<tool><mark> <forks><meal>``: ``!`` a failed decision, ``?`` no tool
    call; forks ``L`` and ``R`` held at the end of the round (``.`` none); ``*`` a meal.

    Args:
        episode: The episode.
        timeline: Its replay, from :func:`replay`.

    Returns:
        The grid with a title line and a key.
    """
    rounds = timeline["round"].unique().sort().to_list()
    deadlocks = set(timeline.filter("deadlock")["round"].to_list())
    header = ["seat"] + [f"r{r}{' DEADLOCK' if r in deadlocks else ''}" for r in rounds]
    cells = {(d["philosopher"], d["round"]): d for d in timeline.iter_rows(named=True)}
    lines = []
    for seat in range(episode.row["n"]):
        row = [str(seat)]
        for r in rounds:
            decision = cells.get((seat, r))
            if decision is None:
                row.append("")
                continue
            forks = ("L" if decision["holds_left"] else "") + (
                "R" if decision["holds_right"] else ""
            )
            meal = "*" if decision["ate"] else ""
            row.append(f"{_cell_text(decision)} {forks or '.'}{meal}")
        lines.append(row)
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    render = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in [header, *lines]
    ]
    tools = TOOLS[Protocol(episode.row["protocol"])]
    key = ", ".join(f"{ABBREVIATIONS[tool]} {tool}" for tool in tools)
    return (
        "\n".join(
            [
                episode.title,
                "",
                *render,
                "",
                f"key: {key}; ! failed, ? no tool call; L/R forks held, * meal",
            ]
        )
        + "\n"
    )


def draw_episode(episode: Episode, png: str | Path, pdf: str | Path, csv: str | Path) -> str:
    """Replay an episode and write its timeline figure and, as CSV, its timeline table.

    Args:
        episode: The episode, from :func:`load_episode`.
        png: Output PNG file.
        pdf: Output PDF file.
        csv: Output CSV file.

    Returns:
        The episode as text (:func:`timeline_text`), for a terminal.
    """
    timeline = replay(episode)
    with styled():
        save_figure(timeline_figure(episode, timeline), timeline, png, pdf, csv)
    return timeline_text(episode, timeline)


def write_timeline(
    episodes_path: str | Path,
    steps: str | Path,
    episode: int,
    png: str | Path,
    pdf: str | Path,
    csv: str | Path,
) -> None:
    """Load one episode of an episode table and draw it with :func:`draw_episode`.

    Args:
        episodes_path: The episode table.
        steps: Its steps table.
        episode: The episode index.
        png: Output PNG file.
        pdf: Output PDF file.
        csv: Output CSV file.
    """
    draw_episode(load_episode(episodes_path, steps, episode), png, pdf, csv)
