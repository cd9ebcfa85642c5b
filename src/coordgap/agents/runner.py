"""Play a model x N cell of episodes concurrently, resumably, and write its tables.

Episodes run as concurrent table graphs, at most ``max_in_flight`` at once. Each finished
episode is written at once to a journal folder beside the outputs (``n<N>.partial/``), so a
killed job resumes where it stopped: journalled episodes are kept, the rest are played, and
nothing is played twice. The journal carries a fingerprint of the cell's settings; a journal
from different settings is discarded rather than mixed in. When every episode is in, the
journal is merged, in episode order, into the final tables and removed.

SIGTERM or SIGINT (Slurm preemption, Ctrl-C) cancels the episodes in flight: they are dropped,
never journalled half-played, and the job exits non-zero within seconds (``coordgap.preemption``),
so the rerun plays exactly the episodes that are not in the journal. The journal is a
``coordgap.resume.ResumeFolder``, the same primitive a training run resumes from.

Every episode of the study is played here: a configured model's cells
(``coordgap.agents.generate``, which opens the model), each checkpoint's validation and test
cells (``coordgap.evaluation.checkpoints``), and a training step's rollouts
(``coordgap.training.loop``), whose GRPO groups are a cell with ``group_size`` set.

A cell in which too many episodes ended in ``error`` (a call that failed in transport after its
retries) is not written: a table of error episodes would look like a finished cell while the
analysis leaves every one of them out. The job fails with the errors counted by kind
(``CellErrors``), the error episodes leave the journal and the others stay, so a rerun once the
endpoint is back replays exactly the episodes that failed, from their own seeds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
from tqdm import tqdm

from coordgap.agents.graphs import gather_or_cancel, play_episode_graph
from coordgap.data import TABLE_SCHEMAS, EpisodeSeeds, write_parquet_atomic
from coordgap.errors import ExpectedFailure
from coordgap.resume import ResumeFolder

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from coordgap.config.play import EnvironmentConfig
    from coordgap.policies.base import AsyncPolicy

    PolicyFactory = Callable[[int, int, np.random.Generator], AsyncPolicy]

logger = logging.getLogger(__name__)
# The file name endings of a cell's episodes, steps and transcripts tables.
_TABLE_SUFFIXES = (".parquet", ".steps.parquet", ".transcripts.parquet")


class CellErrors(ExpectedFailure, RuntimeError):
    """Too many of a cell's episodes ended in ``error``: the cell is not written.

    Args:
        label: The cell, e.g. ``gpt-5.4 n=5``.
        calls_to: The endpoint and model its calls went to (``ModelSpec.calls_to``); None
            when unknown or in the job.
        errors: Error episodes in the cell.
        episodes: Episodes in the cell.
        max_error_share: The share of error episodes a cell may have.
        kinds: How many failed calls of the error episodes ended with each failure label
            (the error class and HTTP status, or the check a reply failed).
    """

    def __init__(
        self,
        label: str,
        calls_to: str | None,
        errors: int,
        episodes: int,
        max_error_share: float,
        kinds: Counter[str],
    ) -> None:
        counted = ", ".join(f"{count} x {kind}" for kind, count in kinds.most_common())
        where = "" if calls_to is None else f" ({calls_to})"
        super().__init__(
            f"{label}{where}: {errors} of {episodes} episodes ended in error, more than "
            f"experiment.max_error_share = {max_error_share} allows; failed calls: {counted}. "
            "The error episodes were dropped from the journal, the others kept: a rerun plays "
            "only the ones that failed."
        )
        self.errors = errors
        self.kinds = kinds


@dataclass(frozen=True)
class CellOutputs:
    """The three tables of a cell; the journal folder sits beside the episode table."""

    episodes: Path
    steps: Path
    transcripts: Path

    @classmethod
    def at(cls, stem: Path) -> CellOutputs:
        """The tables ``<stem>.parquet``, ``<stem>.steps.parquet`` and ``.transcripts.parquet``."""
        return cls(*(stem.parent / f"{stem.name}{suffix}" for suffix in _TABLE_SUFFIXES))

    @property
    def journal(self) -> Path:
        """Folder of per-episode parts while the cell is being played."""
        return self.episodes.with_suffix(".partial")

    def path(self, table: str) -> Path:
        """The final path of one table (``episodes``, ``steps`` or ``transcripts``)."""
        return Path(getattr(self, table))


@dataclass(frozen=True)
class Cell:
    """What identifies a cell's episodes: changing any of it changes the episodes.

    Attributes:
        model: The model's name (a training run's, for its rollouts).
        n: Philosophers at the table.
        env: The table rules.
        episodes: Episodes in the cell.
        base_seed: The config's seed; every seed derives from it (see ``EpisodeSeeds``).
        first_scenario: The scenario of episode 0.
        model_settings: The model's settings, which decide its episodes.
        checkpoint: What the ``checkpoint`` column says.
        group_size: None: episode ``k`` plays scenario ``first_scenario + k``. A size ``G``:
            the episodes form groups of ``G`` (a training step's GRPO groups) that share
            scenario ``first_scenario + k // G``, member ``m`` seeded as ``<model>/<m>``.
    """

    model: str
    n: int
    env: EnvironmentConfig
    episodes: int
    base_seed: int
    first_scenario: int
    model_settings: dict[str, Any]
    checkpoint: str = "base"
    group_size: int | None = None

    def seeds(self, index: int) -> EpisodeSeeds:
        """The seeds of episode ``index``."""
        group, member = divmod(index, self.group_size or 1)
        identity = self.model if self.group_size is None else f"{self.model}/{member}"
        return EpisodeSeeds.derive(self.base_seed, self.first_scenario + group, self.n, identity)

    @property
    def label(self) -> str:
        """The cell in messages: ``gpt-5.4 n=5``, with its checkpoint if not the base model."""
        checkpoint = "" if self.checkpoint == "base" else f" {self.checkpoint}"
        return f"{self.model} n={self.n}{checkpoint}"

    def fingerprint(self) -> str:
        """A canonical JSON rendering, stored with the journal."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)


class _Progress:
    """Episodes done, decisions per second and errors, on stderr."""

    def __init__(self, total: int, done: int, label: str) -> None:
        self._bar = tqdm(total=total, initial=done, desc=label, unit="ep", file=sys.stderr)
        self._decisions = 0
        self._errors = 0
        self._start = time.perf_counter()

    def update(self, row: dict[str, Any]) -> None:
        self._decisions += row["decisions"]
        self._errors += row["status"] != "ok"
        rate = self._decisions / max(time.perf_counter() - self._start, 1e-9)
        self._bar.set_postfix(decisions_per_s=f"{rate:.1f}", errors=self._errors, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def _open_journal(cell: Cell, outputs: CellOutputs) -> set[int]:
    """Create or reuse the journal; return the episodes it already holds."""
    journal = ResumeFolder(outputs.journal, cell.fingerprint()).root
    return {int(p.name.split(".")[0][1:]) for p in journal.glob("e*.episodes.parquet")}


def _journal_part(journal: Path, index: int, table: str) -> Path:
    return journal / f"e{index:06d}.{table}.parquet"


async def run_cell(
    cell: Cell,
    outputs: CellOutputs,
    make_policy: PolicyFactory,
    max_in_flight: int,
    progress: bool = True,
    max_error_share: float = 0.0,
    merge: bool = True,
    calls_to: str | None = None,
) -> None:
    """Play the cell's missing episodes and write its tables.

    Args:
        cell: The cell's identity and settings.
        outputs: Where its tables go.
        make_policy: Builds a fresh policy for an episode from (n, policy seed, policy rng).
        max_in_flight: Episodes played at once.
        progress: Show a progress bar on stderr.
        max_error_share: The largest share of ``error`` episodes the cell may have and still
            be written.
        merge: Write the tables; if False, the complete journal is left for the caller to
            merge (``merge_journal``).
        calls_to: The endpoint and model the policies call, which ``CellErrors`` names.

    Raises:
        CellErrors: More than ``max_error_share`` of the episodes ended in ``error``.
    """
    started = time.perf_counter()
    done = _open_journal(cell, outputs)
    todo = [i for i in range(cell.episodes) if i not in done]
    logger.info("%s: %d journalled, %d to play", cell.label, len(done), len(todo))
    bar = _Progress(cell.episodes, len(done), cell.label) if progress else None
    gate = asyncio.Semaphore(max_in_flight)
    played = 0

    async def play(index: int) -> None:
        nonlocal played
        async with gate:
            seeds = cell.seeds(index)
            table_rng, policy_rng = seeds.generators()
            policy = make_policy(cell.n, seeds.policy, policy_rng)
            log = await play_episode_graph(cell.env, cell.n, policy, table_rng)
        parts = log.tables(
            model=cell.model, checkpoint=cell.checkpoint, n=cell.n, episode=index, seeds=seeds
        )
        # The episode row goes last: its part existing is what marks the episode done. No
        # await from here on, so a cancellation never leaves an episode half-written.
        for table in ("steps", "transcripts", "episodes"):
            frame = pl.DataFrame(parts[table], schema=TABLE_SCHEMAS[table])
            write_parquet_atomic(frame, _journal_part(outputs.journal, index, table))
        played += 1
        if bar is not None:
            bar.update(log.row)

    try:
        await gather_or_cancel(*(play(i) for i in todo))
    except BaseException as stop:
        # A signal, or an error that stops the job (an endpoint that refused the key, or that
        # stopped answering): either way the rerun starts from what is journalled.
        why = "cancelled" if isinstance(stop, asyncio.CancelledError) else "stopped"
        logger.warning(
            "%s %s: %d of %d episodes journalled, the ones in flight dropped",
            cell.label,
            why,
            len(done) + played,
            cell.episodes,
        )
        raise
    finally:
        if bar is not None:
            bar.close()
    rows = _check_errors(cell, outputs, max_error_share, calls_to)
    if merge:
        merge_journal(cell, outputs)
    # The closing line of the job's log: what the cell holds, whatever was replayed.
    logger.info(
        "%s: done, %d episodes (%d played in %.1f s, %d resumed), %d errors, %d decisions, "
        "%d meals",
        cell.label,
        rows.height,
        played,
        time.perf_counter() - started,
        len(done),
        (rows["status"] != "ok").sum(),
        rows["decisions"].sum(),
        rows["meals_total"].sum(),
    )


def _check_errors(
    cell: Cell, outputs: CellOutputs, max_error_share: float, calls_to: str | None
) -> pl.DataFrame:
    """Raise ``CellErrors`` when the journal holds too many error episodes, dropping them.

    Returns:
        The journal's episode rows, when the errors are within ``max_error_share``.
    """
    journal = outputs.journal
    rows = pl.concat(
        [pl.read_parquet(_journal_part(journal, i, "episodes")) for i in range(cell.episodes)]
    )
    failed = rows.filter(pl.col("status") == "error")["episode"].to_list()
    if len(failed) / cell.episodes <= max_error_share:
        if failed:
            logger.warning(
                "%s: %d of %d episodes ended in error (within max_error_share %s)",
                cell.label,
                len(failed),
                cell.episodes,
                max_error_share,
            )
        return rows
    steps = pl.concat([pl.read_parquet(_journal_part(journal, i, "steps")) for i in failed])
    kinds = Counter(steps.filter(pl.col("reason") == "transport_error")["raw"].to_list())
    # The episode part goes first: without it the episode is not done, whatever else is left.
    for index in failed:
        for table in ("episodes", "steps", "transcripts"):
            _journal_part(journal, index, table).unlink()
    raise CellErrors(cell.label, calls_to, len(failed), cell.episodes, max_error_share, kinds)


def read_journal(cell: Cell, outputs: CellOutputs) -> dict[str, pl.DataFrame]:
    """A complete journal's tables, each part in episode order, by table name."""
    return {
        table: pl.concat(
            [
                pl.read_parquet(_journal_part(outputs.journal, i, table))
                for i in range(cell.episodes)
            ]
        )
        for table in TABLE_SCHEMAS
    }


def merge_journal(cell: Cell, outputs: CellOutputs, journal: CellOutputs | None = None) -> None:
    """Concatenate a complete journal's parts, in episode order, into the final tables.

    Args:
        cell: The cell.
        outputs: Where its tables go.
        journal: The outputs whose journal holds the parts, if not ``outputs``' own; it is
            removed once the tables are written.
    """
    source = journal or outputs
    publish_journal(read_journal(cell, source), outputs, source)


def publish_journal(
    tables: dict[str, pl.DataFrame], outputs: CellOutputs, journal: CellOutputs
) -> None:
    """Write a journal's tables, already read (``read_journal``), then remove the journal.

    Args:
        tables: The cell's tables by name.
        outputs: Where they go.
        journal: The outputs whose journal they were read from.
    """
    for table, frame in tables.items():
        write_parquet_atomic(frame, outputs.path(table))
    shutil.rmtree(journal.journal)
