"""Two-sample statistics that hold at the sample sizes a CPU study affords (6 to 60 episodes).

Each function compares two samples of per-episode rewards, ``x`` (model A) and ``y`` (model B),
and says what it assumes:

* :func:`permutation_p`: the permutation test of the mean difference. It assumes only that the
  episodes of both models are exchangeable under the null (the same distribution), so it stays
  valid for tiny samples, ties and a sample with zero variance, where Welch's t-test treats a
  constant sample's mean as known and its p-value is far too small. Exact (every split of the
  pooled episodes) when there are at most ``PERMUTATION_RESAMPLES`` splits, else that many
  seeded random splits with the +1 correction that keeps the p-value valid.
* :func:`sign_flip_p`: the exact sign-flip test that paired differences (a few training seeds'
  differences from a fixed model) are centred on 0; it assumes only that each difference is as
  likely negative as positive under the null.
* :func:`brunner_munzel`: the probability of superiority P(A > B) + P(A = B) / 2 and the
  Brunner-Munzel test that it is 1/2. Unlike the Mann-Whitney U test it does not assume equal
  shapes, so it tests what it reports. Its p-value is the studentized permutation test of
  Neubert & Brunner (2007, Comput. Stat. Data Anal. 51:5192), which is accurate from about 7
  episodes per sample, where the t approximation is not.
* :func:`hedges_g`: the standardized mean difference with the pooled SD and Hedges' small-sample
  correction, and its normal-approximation interval ``g ± z · SE`` with the SE of Borenstein et
  al. (2009, Introduction to Meta-Analysis, eqs. 4.18-4.24). The pooled SD assumes equal
  variances; it is the primary effect size because it is the paper's.
* :func:`average_sd_g`: the same difference over the average-variance SD
  sqrt((s_A² + s_B²) / 2), with Bonett's (2008, Psychol. Methods 13:99) interval, which does not
  assume equal variances. It is the one to read when the two SDs differ by more than twice: the
  pooled SD is then dominated by the larger sample.
* :func:`detectable_effect`: the smallest |g| that a two-sided two-sample t-test of these sizes
  detects with the given power: what a comparison could have seen, in place of the "achieved
  power" at the observed effect, which is only a restatement of its p-value.

Every function returns NaN where its statistic is undefined, never a made-up value.
"""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np
import pingouin as pg
from scipy.stats import rankdata

if TYPE_CHECKING:
    from collections.abc import Callable

# Random splits of a permutation test when enumerating every split would take more: the p-value's
# Monte Carlo SE is then at most 0.005, and 0.0022 at p = 0.05.
PERMUTATION_RESAMPLES = 10_000

# A statistic of a split counts as "at least as extreme" as the observed one up to this relative
# rounding error: the same split summed in another order must not fall on the other side.
_TIE_TOLERANCE = 1e-9


def _splits(size: int, first: int, resamples: int, seed: int) -> tuple[np.ndarray, bool]:
    """Orderings of ``size`` pooled values; the first ``first`` of each row form sample A.

    Returns:
        One row per split, and whether the rows are every split (exact) or a random draw.
    """
    if math.comb(size, first) <= resamples:
        rows = []
        for chosen in itertools.combinations(range(size), first):
            rest = sorted(set(range(size)) - set(chosen))
            rows.append([*chosen, *rest])
        return np.array(rows, dtype=np.int64), True
    rng = np.random.default_rng(seed)
    return rng.permuted(np.tile(np.arange(size), (resamples, 1)), axis=1), False


def _permutation_p(
    x: np.ndarray,
    y: np.ndarray,
    statistic: Callable[[np.ndarray, int], np.ndarray],
    resamples: int,
    seed: int,
) -> float:
    """Two-sided permutation p-value of ``statistic`` (|T| at least the observed |T|).

    ``statistic(rows, first)`` computes T of every row of a 2-D array of pooled values whose
    first ``first`` columns are sample A.
    """
    pooled = np.concatenate([x, y])
    observed = abs(float(statistic(pooled[np.newaxis, :], x.size)[0]))
    orders, exact = _splits(pooled.size, x.size, resamples, seed)
    values = np.abs(statistic(pooled[orders], x.size))
    margin = _TIE_TOLERANCE * (1 + observed) if math.isfinite(observed) else 0.0
    extreme = int(np.count_nonzero(values >= observed - margin))
    if exact:
        return extreme / len(orders)
    return (extreme + 1) / (len(orders) + 1)


def _mean_difference(rows: np.ndarray, first: int) -> np.ndarray:
    return rows[:, :first].mean(axis=1) - rows[:, first:].mean(axis=1)


def permutation_p(
    x: np.ndarray, y: np.ndarray, seed: int, resamples: int = PERMUTATION_RESAMPLES
) -> float:
    """Permutation test of ``mean(x) - mean(y)``, two-sided.

    Args:
        x: Sample A (at least one value).
        y: Sample B (at least one value).
        seed: Seed of the random splits, used only when the test is not exact.
        resamples: The most splits enumerated exactly, and the random splits drawn otherwise.

    Returns:
        The p-value: the share of splits whose |difference| is at least the observed one.
    """
    return _permutation_p(x, y, _mean_difference, resamples, seed)


def sign_flip_p(differences: np.ndarray) -> float:
    """Exact two-sided sign-flip test that the differences are centred on 0.

    Under the null each difference is as likely negative as positive; the p-value is the share
    of the 2^S sign patterns whose |mean| is at least the observed |mean|.

    Args:
        differences: At least one difference.

    Returns:
        The p-value.
    """
    observed = abs(differences.mean())
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=differences.size)))
    flipped = np.abs((signs * differences).mean(axis=1))
    return float(np.mean(flipped >= observed - _TIE_TOLERANCE * (1 + observed)))


def brunner_munzel_statistic(rows: np.ndarray, first: int) -> np.ndarray:
    """Brunner-Munzel's studentized statistic of P(A > B) + P(A = B)/2 - 1/2, row by row.

    The formula of Brunner & Munzel (2000, Biometrical J. 42:17), with placements from
    mid-ranks. A row whose rank variances are both zero (each sample constant) has an estimate
    of exactly 0, 1/2 or 1 and no spread: its statistic is 0 at 1/2 and infinite otherwise, as
    complete separation is the most extreme split there is.
    """
    a, b = rows[:, :first], rows[:, first:]
    n_a, n_b = a.shape[1], b.shape[1]
    pooled_ranks = rankdata(rows, axis=1)
    rank_a, rank_b = pooled_ranks[:, :first], pooled_ranks[:, first:]
    # Placements: a value's pooled rank minus its rank within its own sample.
    place_a = rank_a - rankdata(a, axis=1)
    place_b = rank_b - rankdata(b, axis=1)
    superiority = place_a.mean(axis=1) / n_b
    var_a = place_a.var(axis=1, ddof=1) / n_b**2
    var_b = place_b.var(axis=1, ddof=1) / n_a**2
    spread = np.sqrt(var_a / n_a + var_b / n_b)
    shift = superiority - 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(
            spread > 0, shift / spread, np.where(shift == 0, 0.0, np.sign(shift) * np.inf)
        )


def brunner_munzel(
    x: np.ndarray, y: np.ndarray, seed: int, resamples: int = PERMUTATION_RESAMPLES
) -> tuple[float, float]:
    """The probability of superiority of A over B and its Brunner-Munzel permutation p-value.

    Args:
        x: Sample A (at least two values).
        y: Sample B (at least two values).
        seed: Seed of the random splits, used only when the test is not exact.
        resamples: The most splits enumerated exactly, and the random splits drawn otherwise.

    Returns:
        P(A > B) + P(A = B) / 2 over all pairs of episodes, and the two-sided p-value of the
        null that it is 1/2.
    """
    pairs = x[:, np.newaxis] - y[np.newaxis, :]
    superiority = float(np.mean(pairs > 0) + np.mean(pairs == 0) / 2)
    return superiority, _permutation_p(x, y, brunner_munzel_statistic, resamples, seed)


def _correction(size_a: int, size_b: int) -> float:
    """Hedges' small-sample correction J = 1 - 3 / (4 df - 1), df = n_A + n_B - 2."""
    return 1 - 3 / (4 * (size_a + size_b) - 9)


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def pooled_sd(x: np.ndarray, y: np.ndarray) -> float:
    """The SD Hedges' g divides by: the two samples' variances pooled by degrees of freedom.

    Args:
        x: Sample A (at least two values).
        y: Sample B (at least two values).

    Returns:
        The pooled SD.
    """
    n_a, n_b = x.size, y.size
    return math.sqrt(((n_a - 1) * x.var(ddof=1) + (n_b - 1) * y.var(ddof=1)) / (n_a + n_b - 2))


def hedges_g(x: np.ndarray, y: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """Hedges' g (pooled SD, bias-corrected) with its normal-approximation interval.

    Args:
        x: Sample A (at least two values).
        y: Sample B (at least two values).
        confidence: Coverage of the interval, e.g. 0.95.

    Returns:
        g and the interval's bounds; NaN when both samples have zero variance.
    """
    n_a, n_b = x.size, y.size
    pooled = pooled_sd(x, y)
    if pooled == 0:
        return math.nan, math.nan, math.nan
    d = (x.mean() - y.mean()) / pooled
    correction = _correction(n_a, n_b)
    variance_d = (n_a + n_b) / (n_a * n_b) + d * d / (2 * (n_a + n_b))
    half = _z(confidence) * correction * math.sqrt(variance_d)
    g = correction * d
    return float(g), float(g - half), float(g + half)


def average_sd_g(x: np.ndarray, y: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """The mean difference over the average-variance SD, bias-corrected, with Bonett's interval.

    The interval is Bonett's (2008, eq. 7 with equal weights) around the uncorrected estimate,
    as he recommends; the point estimate carries Hedges' correction, like :func:`hedges_g`.

    Args:
        x: Sample A (at least two values).
        y: Sample B (at least two values).
        confidence: Coverage of the interval, e.g. 0.95.

    Returns:
        The estimate and the interval's bounds; NaN when both samples have zero variance.
    """
    n_a, n_b = x.size, y.size
    var_a, var_b = x.var(ddof=1), y.var(ddof=1)
    average = (var_a + var_b) / 2
    if average == 0:
        return math.nan, math.nan, math.nan
    d = (x.mean() - y.mean()) / math.sqrt(average)
    variance = (
        d * d * (var_a**2 / (n_a - 1) + var_b**2 / (n_b - 1)) / (8 * average**2)
        + (var_a / (n_a - 1) + var_b / (n_b - 1)) / average
    )
    half = _z(confidence) * math.sqrt(variance)
    return float(_correction(n_a, n_b) * d), float(d - half), float(d + half)


def sd_ratio(x: np.ndarray, y: np.ndarray) -> float:
    """The larger sample SD over the smaller; infinite when only one sample varies."""
    spreads = sorted((float(x.std(ddof=1)), float(y.std(ddof=1))))
    if spreads[1] == 0:
        return math.nan
    return spreads[1] / spreads[0] if spreads[0] > 0 else math.inf


def detectable_effect(size_a: int, size_b: int, alpha: float, power: float) -> float:
    """The smallest |g| a two-sided two-sample t-test of these sizes detects with ``power``.

    Args:
        size_a: Episodes of sample A (at least two).
        size_b: Episodes of sample B (at least two).
        alpha: Two-sided significance level.
        power: The power wanted.

    Returns:
        The minimum detectable effect, in SDs.
    """
    return float(pg.power_ttest2n(size_a, size_b, power=power, alpha=alpha))
