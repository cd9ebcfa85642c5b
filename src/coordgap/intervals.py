"""Confidence intervals of means, proportions and their differences, on plain numbers.

Bootstrap intervals come from pingouin (``compute_bootci``, percentile method). Pingouin has no
interval for a binomial proportion or for a difference of two, so the Wilson score interval and
Newcombe's hybrid score interval for a difference (Newcombe 1998, method 10) are computed here
by hand; the tests hold them to statsmodels and to Newcombe's published worked examples.

A sample whose every value is 0 or 1 is a binary outcome (with the small model the paper reward
is 1 - deadlock): :func:`mean_interval` and :func:`difference_interval` then use Wilson's and
Newcombe's intervals, which keep their coverage at 6 episodes and at 0 or n successes, where a
bootstrap interval of 6 equal outcomes collapses to a point. Other samples get the bootstrap.

Every function returns NaN where an interval is undefined (no data, or a sample too small to
resample), never a made-up width.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pingouin as pg

NAN2 = (math.nan, math.nan)


def wilson_interval(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """Compute the Wilson score interval of a binomial proportion.

    Args:
        successes: Number of successes (e.g. deadlocked episodes).
        trials: Number of trials; with none, the interval is undefined.
        confidence: Coverage, e.g. 0.95.

    Returns:
        The lower and upper bounds, or two NaNs when ``trials`` is 0.
    """
    if trials == 0:
        return NAN2
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / trials
    z2n = z * z / trials
    centre = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * math.sqrt(p * (1 - p) / trials + z2n / (4 * trials))
    # Clipping only removes rounding error at k = 0 and k = n, where a bound equals 0 or 1.
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_interval(
    successes_a: int, trials_a: int, successes_b: int, trials_b: int, confidence: float
) -> tuple[float, float]:
    """Compute Newcombe's hybrid score interval of a difference of two proportions, p_a - p_b.

    Each proportion's Wilson interval gives the distance to its bounds; the difference's bounds
    combine them in quadrature (Newcombe 1998, Statistics in Medicine 17:873, method 10). It
    keeps its coverage near nominal down to 0 or n successes, where the Wald interval collapses.

    Args:
        successes_a: Successes in the first sample.
        trials_a: Trials of the first sample.
        successes_b: Successes in the second sample.
        trials_b: Trials of the second sample.
        confidence: Coverage, e.g. 0.95.

    Returns:
        The lower and upper bounds, or two NaNs when either sample is empty.
    """
    if trials_a == 0 or trials_b == 0:
        return NAN2
    p_a, p_b = successes_a / trials_a, successes_b / trials_b
    low_a, high_a = wilson_interval(successes_a, trials_a, confidence)
    low_b, high_b = wilson_interval(successes_b, trials_b, confidence)
    diff = p_a - p_b
    below = math.hypot(p_a - low_a, high_b - p_b)
    above = math.hypot(high_a - p_a, p_b - low_b)
    return max(-1.0, diff - below), min(1.0, diff + above)


def _mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    # The axis argument lets scipy's bootstrap evaluate every resample in one call.
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def bootstrap_mean_ci(
    values: np.ndarray, confidence: float, resamples: int, seed: int
) -> tuple[float, float, float]:
    """Compute a mean with its bootstrap percentile confidence interval.

    Args:
        values: The sample.
        confidence: Coverage, e.g. 0.95.
        resamples: Number of bootstrap resamples.
        seed: Seed of the resampling; every call starts from it, so a cell's interval does not
            depend on which other cells are summarised.

    Returns:
        The mean and the interval's bounds: three NaNs for an empty sample, NaN bounds for a
        single value (nothing to resample), zero width for a constant sample.
    """
    if values.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if values.size == 1:
        return mean, math.nan, math.nan
    if np.ptp(values) == 0:
        # Every resample is the sample itself; resampling would only add rounding error.
        value = float(values[0])
        return value, value, value
    low, high = pg.compute_bootci(
        values,
        func="mean",
        method="per",
        confidence=confidence,
        n_boot=resamples,
        decimals=15,
        seed=seed,
    )
    return mean, float(low), float(high)


def bootstrap_difference_ci(
    x: np.ndarray, y: np.ndarray, confidence: float, resamples: int, seed: int
) -> tuple[float, float]:
    """Compute a bootstrap percentile interval of ``mean(x) - mean(y)``, resampling each apart.

    Args:
        x: The first sample.
        y: The second sample.
        confidence: Coverage, e.g. 0.95.
        resamples: Number of bootstrap resamples.
        seed: Seed of the resampling, as in :func:`bootstrap_mean_ci`.

    Returns:
        The bounds; NaN when a sample has fewer than two values, zero width when both samples
        are constant.
    """
    if min(x.size, y.size) < 2:
        return NAN2
    if np.ptp(x) == 0 and np.ptp(y) == 0:
        diff = float(x[0] - y[0])
        return diff, diff
    low, high = pg.compute_bootci(
        x,
        y,
        func=_mean_difference,
        method="per",
        confidence=confidence,
        n_boot=resamples,
        decimals=15,
        seed=seed,
    )
    return float(low), float(high)


def is_binary(values: np.ndarray) -> bool:
    """Whether every value is 0 or 1: a sample of a binary outcome."""
    return bool(np.isin(values, (0.0, 1.0)).all())


def mean_interval(
    values: np.ndarray, confidence: float, resamples: int, seed: int
) -> tuple[float, float, float]:
    """A mean with its interval: Wilson's for a binary sample, the bootstrap's otherwise.

    Args:
        values: The sample.
        confidence: Coverage, e.g. 0.95.
        resamples: Bootstrap resamples of a non-binary sample.
        seed: Seed of the bootstrap, as in :func:`bootstrap_mean_ci`.

    Returns:
        The mean and the interval's bounds, as :func:`bootstrap_mean_ci` returns them; a binary
        sample of one episode has Wilson's (wide) interval.
    """
    if values.size and is_binary(values):
        successes = int(values.sum())
        return successes / values.size, *wilson_interval(successes, values.size, confidence)
    return bootstrap_mean_ci(values, confidence, resamples, seed)


def difference_interval(
    x: np.ndarray, y: np.ndarray, confidence: float, resamples: int, seed: int
) -> tuple[float, float]:
    """An interval of ``mean(x) - mean(y)``: Newcombe's when both are binary, else the bootstrap's.

    Args:
        x: The first sample.
        y: The second sample.
        confidence: Coverage, e.g. 0.95.
        resamples: Bootstrap resamples of non-binary samples.
        seed: Seed of the bootstrap, as in :func:`bootstrap_mean_ci`.

    Returns:
        The bounds, as :func:`bootstrap_difference_ci` returns them.
    """
    if min(x.size, y.size) >= 2 and is_binary(x) and is_binary(y):
        return newcombe_interval(int(x.sum()), x.size, int(y.sum()), y.size, confidence)
    return bootstrap_difference_ci(x, y, confidence, resamples, seed)
