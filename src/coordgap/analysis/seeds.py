"""Seeds as the unit: an arm's training seeds side by side, and arms compared seed by seed.

A training seed draws everything a run's randomness decides (the adapter's initialisation,
the rollouts' sampling, the order of the update's rows), so two seeds of one recipe differ by
chance alone, and a difference between arms means something only beside the spread between
the seeds of one arm. The episodes of one seed's test cell share that seed's draw: pooled over
seeds they are not independent, and a pooled-episode test overstates what a few seeds show.

Per arm, selection policy, N and reward variant (:func:`seed_table`): each seed's test mean,
their mean with the t interval over seeds (it assumes normal seed means; none for one seed),
and the mean of the pooled episodes.

Per pair of ``analysis.seed_comparisons`` (:func:`seed_comparisons`), an arm's selection
``<arm>@<policy>`` against another or against a model, at every N and variant both played:

* arm vs arm: the difference of the seed means' means, Welch's t over the seed means, and the
  exact studentized permutation test (of Welch's t) over every split of the seeds;
* arm vs model (e.g. the base model): the arm's seed means against the model's episodes, by
  Welch's t and the studentized permutation test over every split of the seed means and the
  episodes. The model's cell mean is an estimate too (in the CPU study, 6 episodes: an SE near
  0.2, as large as the seeds'), and Welch's SE carries both: the seeds' spread over S and the
  model's episode variance over its episodes.

The t tests assume near-normal means; the permutation tests are exact where both sides'
values are exchangeable and, being studentized, asymptotically valid for equal means with
unequal variances (seed means and single episodes have different ones), but they cannot go
below ``min_p`` (3 seeds against 3: 0.1; 3 seeds against 6 episodes: 1/84), which the note
states when it is above 0.05. Beside them, ``pooled_*``: the same pair compared on the pooled
episodes as ``analysis.comparisons`` compares models, with the smallest effect a two-sample
t-test of those sizes detects (``analysis.power``'s alpha and power): as Hedges' g, and in
reward units as that g times the two samples' pooled SD, the bound a null result puts on the
difference.
Holm's correction runs over the pairs at each N and variant (``p_holm``, of the t test's p):
the list is the study's primary family.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from scipy import stats as scipy_stats

from coordgap.analysis.comparisons import holm, mean_test
from coordgap.analysis.stats import OK, load_episodes, with_rewards, write_csv
from coordgap.analysis.two_sample import (
    detectable_effect,
    pooled_sd,
    studentized_permutation_p,
    welch,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from coordgap.config.analysis import AnalysisConfig

SEED_SCHEMA: dict[str, pl.DataType] = {
    "arm": pl.String(),
    "policy": pl.String(),
    "variant": pl.String(),
    "n": pl.Int64(),
    "seeds": pl.Int64(),
    "episodes": pl.Int64(),
    "seed_means": pl.String(),  # each seed's test mean, in the arm's seed order
    "mean": pl.Float64(),  # the mean of the seed means
    "sd": pl.Float64(),  # their SD (ddof 1)
    "ci_low": pl.Float64(),
    "ci_high": pl.Float64(),
    "pooled_mean": pl.Float64(),  # the mean of every episode of every seed
}

SEED_COMPARISON_SCHEMA: dict[str, pl.DataType] = {
    "variant": pl.String(),
    "n": pl.Int64(),
    "a": pl.String(),
    "b": pl.String(),
    "seeds_a": pl.Int64(),
    "seeds_b": pl.Int64(),
    "mean_a": pl.Float64(),
    "mean_b": pl.Float64(),
    "diff": pl.Float64(),
    "diff_ci_low": pl.Float64(),
    "diff_ci_high": pl.Float64(),
    "test": pl.String(),
    "t": pl.Float64(),
    "dof": pl.Float64(),
    "p": pl.Float64(),
    "p_holm": pl.Float64(),
    "permutation_p": pl.Float64(),
    "min_p": pl.Float64(),
    "pooled_diff": pl.Float64(),
    "pooled_test": pl.String(),
    "pooled_p": pl.Float64(),
    "pooled_detectable_g": pl.Float64(),
    "pooled_detectable_diff": pl.Float64(),
    "note": pl.String(),
}


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a seed comparison: an arm's selection, or a model with one cell.

    Attributes:
        name: ``<arm>@<policy>`` or the model's name.
        models: The models whose test cells are its seeds (``<run>@<policy>`` per run of the
            arm), or the model alone.
        is_arm: Whether the models are seeds of an arm.
    """

    name: str
    models: tuple[str, ...]
    is_arm: bool


def sides(arms: Mapping[str, Sequence[str]], policies: Sequence[str]) -> dict[str, Side]:
    """Every arm's selections as sides, by name ``<arm>@<policy>``.

    Args:
        arms: Arm -> its runs (``coordgap.config.training.arms``).
        policies: The selection policies (``evaluation.policies``).

    Returns:
        ``<arm>@<policy>`` -> its side.
    """
    return {
        f"{arm}@{policy}": Side(f"{arm}@{policy}", tuple(f"{r}@{policy}" for r in runs), True)
        for arm, runs in arms.items()
        for policy in policies
    }


def side(name: str, arm_sides: Mapping[str, Side]) -> Side:
    """The side of a name: an arm's selection, or else a model."""
    return arm_sides.get(name) or Side(name, (name,), False)


def _means(samples: Mapping[tuple[str, int], np.ndarray], models: Sequence[str], n: int) -> list:
    """Each model's mean at N, in order, for the models that played at N."""
    return [float(samples[(m, n)].mean()) for m in models if (m, n) in samples]


def _pooled(samples: Mapping[tuple[str, int], np.ndarray], models: Sequence[str], n: int):
    """Every episode's reward of the models' cells at N, pooled."""
    return np.concatenate([samples[(m, n)] for m in models if (m, n) in samples])


def _t_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """The t interval of a mean over ``values`` (NaN for fewer than two)."""
    if values.size < 2:
        return math.nan, math.nan
    half = scipy_stats.t.ppf((1 + confidence) / 2, values.size - 1) * values.std(ddof=1)
    half /= math.sqrt(values.size)
    return float(values.mean() - half), float(values.mean() + half)


def seed_table(
    episodes: pl.DataFrame,
    arms: Mapping[str, Sequence[str]],
    policies: Sequence[str],
    config: AnalysisConfig,
) -> pl.DataFrame:
    """Each arm's selections seed by seed, at every N and variant.

    Args:
        episodes: Episode rows of the selected checkpoints' test cells (others are ignored).
        arms: Arm -> its runs.
        policies: The selection policies.
        config: Rewards and interval settings.

    Returns:
        One row per arm, policy, variant and N with the columns of ``SEED_SCHEMA``; arms,
        policies and variants in config order, N ascending.
    """
    rewarded = with_rewards(episodes, config).filter(OK)
    rows = []
    for variant in config.variants:
        samples = _samples(rewarded, variant)
        for name, arm_side in sides(arms, policies).items():
            arm, _, policy = name.partition("@")
            for n in sorted({n for model, n in samples if model in arm_side.models}):
                means = np.array(_means(samples, arm_side.models, n))
                pooled = _pooled(samples, arm_side.models, n)
                low, high = _t_interval(means, config.confidence)
                rows.append(
                    {
                        "arm": arm,
                        "policy": policy,
                        "variant": str(variant),
                        "n": n,
                        "seeds": means.size,
                        "episodes": pooled.size,
                        "seed_means": ", ".join(f"{mean:.3f}" for mean in means),
                        "mean": float(means.mean()),
                        "sd": float(means.std(ddof=1)) if means.size > 1 else math.nan,
                        "ci_low": low,
                        "ci_high": high,
                        "pooled_mean": float(pooled.mean()),
                    }
                )
    return pl.DataFrame(rows, schema=SEED_SCHEMA)


def _samples(rewarded: pl.DataFrame, variant: str) -> dict[tuple[str, int], np.ndarray]:
    """Every cell's rewards under a variant, by (model, N)."""
    return {
        (model, n): group[f"reward_{variant}"].to_numpy()
        for (model, n), group in rewarded.partition_by("model", "n", as_dict=True).items()
    }


def _welch_row(x: np.ndarray, y: np.ndarray, config: AnalysisConfig) -> dict[str, Any]:
    """Welch's t of A's seed means against B's values, and the permutation test of that t."""
    row: dict[str, Any] = {"diff": float(x.mean() - y.mean())}
    row["permutation_p"] = studentized_permutation_p(x, y, config.seed)
    # The extreme split and its mirror are equally extreme when both sides have as many values.
    splits = math.comb(x.size + y.size, x.size)
    row["min_p"] = (
        math.nan if math.isnan(row["permutation_p"]) else (2 if x.size == y.size else 1) / splits
    )
    test = welch(x, y)
    if math.isnan(test.t):
        return row | {"note": "no t test: a side with one value, or no spread on either side"}
    low, high = test.interval(config.confidence)
    return row | {
        "t": test.t,
        "dof": test.dof,
        "p": test.p,
        "diff_ci_low": low,
        "diff_ci_high": high,
    }


def seed_comparisons(
    episodes: pl.DataFrame,
    pairs: Sequence[tuple[str, str]],
    arm_sides: Mapping[str, Side],
    config: AnalysisConfig,
    *,
    alpha: float,
    power: float,
) -> pl.DataFrame:
    """Compare each pair seed by seed (and on the pooled episodes) at every N both played.

    Args:
        episodes: Episode rows of every model the pairs name.
        pairs: ``analysis.seed_comparisons``: (a, b), a an arm's selection ``<arm>@<policy>``,
            b another or a model.
        arm_sides: Every arm's selections (:func:`sides`).
        config: Rewards, interval settings and the seed of the permutation tests.
        alpha: The significance level of the pooled episodes' detectable effect.
        power: The power of the pooled episodes' detectable effect.

    Returns:
        One row per variant, N and pair with the columns of ``SEED_COMPARISON_SCHEMA``;
        ``diff`` is A minus B.
    """
    rewarded = with_rewards(episodes, config).filter(OK)
    rows = []
    for variant in config.variants:
        samples = _samples(rewarded, variant)
        for n in sorted({n for _, n in samples}):
            group = []
            for a, b in pairs:
                side_a, side_b = arm_sides[a], side(b, arm_sides)
                x = np.array(_means(samples, side_a.models, n))
                # A model's own episodes, so that its sampling noise enters the comparison.
                y = (
                    np.array(_means(samples, side_b.models, n))
                    if side_b.is_arm
                    else _pooled(samples, side_b.models, n)
                )
                if x.size and y.size:
                    key = {"variant": str(variant), "n": n, "a": a, "b": b}
                    group.append(key | _seed_row(x, y, side_b.is_arm, config))
                    group[-1] |= _pooled_row(samples, side_a, side_b, n, config, alpha, power)
            for row, adjusted in zip(group, holm([r["p"] for r in group]), strict=True):
                row["p_holm"] = adjusted
            rows.extend(group)
    return pl.DataFrame(rows, schema=SEED_COMPARISON_SCHEMA)


def _seed_row(
    x: np.ndarray, y: np.ndarray, b_is_arm: bool, config: AnalysisConfig
) -> dict[str, Any]:
    """An arm's seed means compared with another arm's seed means or with a model's episodes."""
    row: dict[str, Any] = {
        "test": "welch_seeds" if b_is_arm else "welch_seeds_vs_episodes",
        "seeds_a": x.size,
        "seeds_b": y.size if b_is_arm else None,
        "mean_a": float(x.mean()),
        "mean_b": float(y.mean()),
        "t": math.nan,
        "dof": math.nan,
        "p": math.nan,
        "diff_ci_low": math.nan,
        "diff_ci_high": math.nan,
    }
    row |= _welch_row(x, y, config)
    notes = [row.pop("note")] if "note" in row else []
    if row["min_p"] > 0.05:
        notes.append(f"the permutation test cannot go below p = {row['min_p']:.3g}")
    return row | {"note": "; ".join(notes) or None}


def _pooled_row(
    samples: Mapping[tuple[str, int], np.ndarray],
    side_a: Side,
    side_b: Side,
    n: int,
    config: AnalysisConfig,
    alpha: float,
    power: float,
) -> dict[str, Any]:
    """The pair compared on its pooled episodes, as ``analysis.comparisons`` compares models."""
    x, y = (_pooled(samples, s.models, n) for s in (side_a, side_b))
    if min(x.size, y.size) < 2:
        return {"pooled_diff": float(x.mean() - y.mean())}
    pooled = mean_test(x, y, (side_a.name, side_b.name), config.seed)
    detectable = detectable_effect(x.size, y.size, alpha, power)
    return {
        "pooled_diff": float(x.mean() - y.mean()),
        "pooled_test": pooled.test,
        "pooled_p": pooled.p,
        "pooled_detectable_g": detectable,
        "pooled_detectable_diff": detectable * pooled_sd(x, y),
    }


def write_seed_tables(
    episode_paths: Sequence[str | Path],
    arms: Mapping[str, Sequence[str]],
    policies: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    config: AnalysisConfig,
    out_seeds: str | Path,
    out_comparisons: str | Path,
    *,
    alpha: float,
    power: float,
) -> None:
    """Tabulate every arm seed by seed and compare the configured pairs; write both tables.

    Args:
        episode_paths: Parquet episode tables: the selected checkpoints' and the models'.
        arms: Arm -> its runs.
        policies: The selection policies.
        pairs: ``analysis.seed_comparisons``.
        config: Rewards, interval settings and the seed of the permutation tests.
        out_seeds: The per-seed table.
        out_comparisons: The seed-level comparisons.
        alpha: The significance level of the pooled episodes' detectable effect.
        power: The power of the pooled episodes' detectable effect.
    """
    episodes = load_episodes(episode_paths)
    write_csv(seed_table(episodes, arms, policies, config), out_seeds)
    comparisons = seed_comparisons(
        episodes, pairs, sides(arms, policies), config, alpha=alpha, power=power
    )
    write_csv(comparisons, out_comparisons)
