"""The positive control: could the study's training budget move the model at all?

A null result of the coordination arms reads two ways: GRPO with these interventions does not
change how the model coordinates, or the study trained too little to change anything. The
positive control tells them apart. Its arm trains on the ``control`` reward
(:mod:`coordgap.env.variants`): the share of an episode's decisions that reach for the right
fork, a behaviour the base model already samples (SmolLM2-135M: about a quarter of its
decisions), so GRPO has something to reinforce. The study counts as able to train only if,
in every seed, the selected checkpoint's share at the check's N rises over the base model's by
at least ``min_gain``, the threshold ``analysis.control`` states before any result.

A cell's share is its mean ``control`` reward over its ``ok`` episodes. The table has a row per
seed (the seed's selected checkpoint ``<run>@<policy>``) and a last row for the arm: the mean
of the seed shares, the smallest seed gain, and whether every seed passed, the verdict. The
control is no coordination result: no other statistic includes its arm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from coordgap.analysis.seeds import sides
from coordgap.analysis.stats import OK, load_episodes, write_csv
from coordgap.env.variants import REWARD_DECIMALS, RewardVariant, RewardWeights, reward_expr

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from coordgap.config.analysis import ControlConfig

CONTROL_SCHEMA: dict[str, pl.DataType] = {
    "level": pl.String(),  # "seed", or "arm" for the verdict row
    "name": pl.String(),  # the seed's checkpoint <run>@<policy>, or the arm's <arm>@<policy>
    "n": pl.Int64(),
    "episodes": pl.Int64(),
    "share": pl.Float64(),  # the right-fork share; the arm's: the mean of the seeds'
    "model": pl.String(),
    "model_episodes": pl.Int64(),
    "model_share": pl.Float64(),
    "gain": pl.Float64(),  # share - model_share; the arm's: the smallest seed gain
    "min_gain": pl.Float64(),
    "passed": pl.Boolean(),  # gain >= min_gain; the arm's: every seed passed
}


def _cell(rewarded: pl.DataFrame, model: str, n: int) -> tuple[int, float | None]:
    """A cell's ok episodes and their mean right-fork share (None without one)."""
    shares = rewarded.filter(pl.col("model") == model, pl.col("n") == n)["reward"]
    return shares.len(), (float(shares.mean()) if shares.len() else None)


def control_table(
    episodes: pl.DataFrame, runs: Sequence[str], control: ControlConfig
) -> pl.DataFrame:
    """Check the positive control: each seed's right-fork share against the model's.

    Args:
        episodes: Episode rows of the control arm's selected checkpoints and of the model.
        runs: The control arm's runs, one per seed, in seed order.
        control: The check (``analysis.control``).

    Returns:
        One row per seed, then the arm's verdict row, with the columns of ``CONTROL_SCHEMA``.
        A seed whose cell has no ok episode, or a model without one, has no share and fails.
    """
    # The control reward ignores the weights: any will do.
    rewarded = episodes.filter(OK).with_columns(reward_expr(RewardVariant.CONTROL, RewardWeights()))
    model_episodes, model_share = _cell(rewarded, control.model, control.n)
    common = {"n": control.n, "model": control.model, "model_episodes": model_episodes}
    common |= {"model_share": model_share, "min_gain": control.min_gain}
    arm = sides({control.run: runs}, [control.policy])[f"{control.run}@{control.policy}"]
    rows: list[dict[str, Any]] = []
    for name in arm.models:
        count, share = _cell(rewarded, name, control.n)
        gain = None if share is None or model_share is None else share - model_share
        # Rounded as rewards are, so that a gain equal to the threshold up to float noise passes.
        passed = gain is not None and round(gain, REWARD_DECIMALS) >= control.min_gain
        rows.append(
            common
            | {"level": "seed", "name": name, "episodes": count, "share": share, "gain": gain}
            | {"passed": passed}
        )
    shares = [row["share"] for row in rows]
    gains = [row["gain"] for row in rows]
    rows.append(
        common
        | {
            "level": "arm",
            "name": arm.name,
            "episodes": sum(row["episodes"] for row in rows),
            "share": None if None in shares else sum(shares) / len(shares),
            "gain": None if None in gains else min(gains),
            "passed": all(row["passed"] for row in rows),
        }
    )
    return pl.DataFrame(rows, schema=CONTROL_SCHEMA)


def write_control(
    episode_paths: Sequence[str | Path],
    runs: Sequence[str],
    control: ControlConfig,
    out: str | Path,
) -> None:
    """Check the positive control on its episode tables and write the table.

    Args:
        episode_paths: The control arm's selected checkpoints' test tables and the model's
            episode table at the check's N.
        runs: The control arm's runs, one per seed.
        control: The check (``analysis.control``).
        out: The CSV file (``results/stats/control.csv``).
    """
    write_csv(control_table(load_episodes(episode_paths), runs, control), out)
