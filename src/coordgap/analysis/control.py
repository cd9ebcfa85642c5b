"""The positive control: could the study's training budget move the model at all?

A null result of the coordination arms reads two ways: GRPO with these interventions does not
change how the model coordinates, or the study trained too little to change anything. The
positive control tells them apart. Its arm trains on the ``control`` reward
(:mod:`coordgap.env.variants`): the share of the N seats whose round-1 decision reaches for the
right fork, a behaviour the base model already samples, so GRPO has something to reinforce.

Round 1's prompts do not depend on the policy, so a checkpoint's expected reward is exact, not
estimated: E[r1] = the mean over the seats of mu(right | the seat's round-1 prompt), which every
torch run's training history records after each update (``r1_exact``, the policy as it acts)
beside the untrained model's (``r1_exact_base``). Checkpoint ``k`` is what the update of step
``k - 1`` made, so its value is that history row's; checkpoint 0, the untrained adapter (LoRA
B = 0), acts as the base model, so its value is the base model's. The study counts as able to
train only if, in every seed, the selected checkpoint's E[r1] rises over the base model's by at
least ``min_gain``, the threshold ``analysis.control`` states before any result: a check with
no sampling noise, in which only the training's own randomness (the seeds) varies.

A seed's selected checkpoint is the one that played its test episodes (their ``checkpoint``
column). Beside the exact values the table reports those episodes' share, the mean ``control``
reward of the ok test episodes at the check's N, and the base model's: estimates of the same
expectations with sampling noise, which the check does not judge. The table has a row per seed
(``<run>@<policy>``) and a last row for the arm: the mean of the seeds' values, the smallest
seed gain, and whether every seed passed, the verdict. The control is no coordination result:
no other statistic includes its arm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from coordgap.analysis.seeds import sides
from coordgap.analysis.stats import OK, load_episodes, write_csv
from coordgap.data import label_step
from coordgap.env.variants import REWARD_DECIMALS, RewardVariant, RewardWeights, reward_expr

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from coordgap.config.analysis import ControlConfig

CONTROL_SCHEMA: dict[str, pl.DataType] = {
    "level": pl.String(),  # "seed", or "arm" for the verdict row
    "name": pl.String(),  # the seed's checkpoint <run>@<policy>, or the arm's <arm>@<policy>
    "n": pl.Int64(),
    "step": pl.Int64(),  # the checkpoint that played the seed's test episodes; the arm's: null
    "exact": pl.Float64(),  # its exact E[r1] (training history); the arm's: the seeds' mean
    "model": pl.String(),
    "model_exact": pl.Float64(),  # the untrained model's exact E[r1]; the arm's: the seeds' mean
    "gain": pl.Float64(),  # exact - model_exact; the arm's: the smallest seed gain
    "min_gain": pl.Float64(),
    "passed": pl.Boolean(),  # gain >= min_gain; the arm's: every seed passed
    "episodes": pl.Int64(),  # the checkpoint's ok test episodes at n
    "share": pl.Float64(),  # their mean control reward; the arm's: the mean of the seeds'
    "model_episodes": pl.Int64(),
    "model_share": pl.Float64(),
}


def _cell(episodes: pl.DataFrame, model: str, n: int) -> tuple[int, float | None]:
    """A cell's ok episodes and their mean control reward (None without one)."""
    shares = episodes.filter(OK, pl.col("model") == model, pl.col("n") == n)["reward"]
    return shares.len(), (float(shares.mean()) if shares.len() else None)


def _step(episodes: pl.DataFrame, model: str, n: int) -> int | None:
    """The checkpoint that played a cell's episodes (None for a cell without episodes)."""
    labels = episodes.filter(pl.col("model") == model, pl.col("n") == n)["checkpoint"].unique()
    if labels.len() > 1:
        raise ValueError(f"the episodes of {model} at N={n} were played by {labels.to_list()}")
    return label_step(labels[0]) if labels.len() else None


def _exact(history: pl.DataFrame, step: int | None) -> tuple[float | None, float | None]:
    """Checkpoint ``step``'s exact E[r1] and the untrained model's, from its run's history.

    Checkpoint ``k`` is the row of step ``k - 1``; checkpoint 0 acts as the untrained model.
    Without a step (no test episode), the base model's value is still the history's.
    """
    at = history["step"].max() if step is None else max(step - 1, 0)
    row = history.filter(pl.col("step") == at).row(0, named=True)
    base = row["r1_exact_base"]
    if step is None:
        return None, base
    return (base if step == 0 else row["r1_exact"]), base


def _mean(values: list[float | None]) -> float | None:
    """The mean, None if any value is missing."""
    return None if None in values else sum(values) / len(values)


def control_table(
    episodes: pl.DataFrame, histories: Mapping[str, pl.DataFrame], control: ControlConfig
) -> pl.DataFrame:
    """Check the positive control: each seed's exact E[r1] against the untrained model's.

    Args:
        episodes: Episode rows of the control arm's selected checkpoints and of the model.
        histories: Each seed's run -> its training history (``history.parquet``), in seed
            order.
        control: The check (``analysis.control``).

    Returns:
        One row per seed, then the arm's verdict row, with the columns of ``CONTROL_SCHEMA``.
        A seed without a test episode (so without a checkpoint to check) or without an exact
        value (a trainer that cannot score: ``trainer: art``) fails.
    """
    # The control reward ignores the weights: any will do.
    rewarded = episodes.with_columns(reward_expr(RewardVariant.CONTROL, RewardWeights()))
    model_episodes, model_share = _cell(rewarded, control.model, control.n)
    common = {"n": control.n, "model": control.model, "min_gain": control.min_gain}
    common |= {"model_episodes": model_episodes, "model_share": model_share}
    arm = sides({control.run: list(histories)}, [control.policy])[f"{control.run}@{control.policy}"]
    rows: list[dict[str, Any]] = []
    for name, history in zip(arm.models, histories.values(), strict=True):
        step = _step(rewarded, name, control.n)
        exact, model_exact = _exact(history, step)
        count, share = _cell(rewarded, name, control.n)
        gain = None if exact is None or model_exact is None else exact - model_exact
        # Rounded as rewards are, so that a gain equal to the threshold up to float noise passes.
        passed = gain is not None and round(gain, REWARD_DECIMALS) >= control.min_gain
        rows.append(
            common
            | {"level": "seed", "name": name, "step": step, "exact": exact}
            | {"model_exact": model_exact, "gain": gain, "passed": passed}
            | {"episodes": count, "share": share}
        )
    gains = [row["gain"] for row in rows]
    rows.append(
        common
        | {"level": "arm", "name": arm.name, "step": None}
        | {"exact": _mean([row["exact"] for row in rows])}
        | {"model_exact": _mean([row["model_exact"] for row in rows])}
        | {"gain": None if None in gains else min(gains)}
        | {"passed": all(row["passed"] for row in rows)}
        | {"episodes": sum(row["episodes"] for row in rows)}
        | {"share": _mean([row["share"] for row in rows])}
    )
    return pl.DataFrame(rows, schema=CONTROL_SCHEMA)


def write_control(
    episode_paths: Sequence[str | Path],
    history_paths: Sequence[str | Path],
    runs: Sequence[str],
    control: ControlConfig,
    out: str | Path,
) -> None:
    """Check the positive control on its episode tables and histories and write the table.

    Args:
        episode_paths: The control arm's selected checkpoints' test tables and the model's
            episode table at the check's N.
        history_paths: The control arm's training histories, one per seed, in ``runs``' order.
        runs: The control arm's runs, one per seed.
        control: The check (``analysis.control``).
        out: The CSV file (``results/stats/control.csv``).
    """
    histories = {run: pl.read_parquet(path) for run, path in zip(runs, history_paths, strict=True)}
    write_csv(control_table(load_episodes(episode_paths), histories, control), out)
