"""Two-sample statistics that hold at the sample sizes a CPU study affords (3 to 60 values).

Each function compares two samples, ``x`` (A) and ``y`` (B): per-episode rewards of two models,
or seed means of two arms, or an arm's seed means against a model's episodes. It says what it
assumes. A sample is *constant* when all its values are equal (:func:`is_constant`); its
variance is then exactly 0 (:func:`variance`), not the ~1e-32 that floating-point sums give, and
every statistic below reads it that way. Rewards reach here rounded
(``coordgap.env.variants.REWARD_DECIMALS``), so outcomes equal up to rounding noise are equal.

* :func:`welch`: Welch's t-test with its Welch-Satterthwaite interval of the mean difference.
  It assumes the means' sampling distributions are near normal; with a constant sample it treats
  that sample's mean as known.
* :func:`studentized_permutation_p`: the permutation test of Welch's t (Janssen 1997, Stat.
  Probab. Lett. 36:9; Chung & Romano 2013, Ann. Stat. 41:484). Exact under exchangeability
  (both samples from one distribution), like any permutation test; unlike the permutation test
  of the raw mean difference it also stays asymptotically valid for equal means with unequal
  variances and unequal sizes, where the raw difference's permutation distribution borrows the
  pooled variance and its p-value is far too small (5 episodes with 5 times the SD of 30 others:
  about a third of null pairs reject at 0.05). Exact (every split of the pooled values) when
  there are at most ``PERMUTATION_RESAMPLES`` splits, else that many seeded random splits with
  the +1 correction that keeps the p-value valid.
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

Every function returns NaN where its statistic is undefined, never a made-up value: an effect
size in SDs is undefined when both samples are constant, whatever their means.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np
import pingouin as pg
from scipy import stats as scipy_stats
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


def is_constant(sample: np.ndarray) -> bool:
    """Whether every value of a sample is the same: the one definition of zero variance."""
    return bool(np.ptp(sample) == 0)


def variance(sample: np.ndarray) -> float:
    """The sample variance (ddof 1): exactly 0 for a constant sample.

    Args:
        sample: At least two values.

    Returns:
        The variance; ``np.var`` of a constant float sample is ~1e-32, not 0, and would divide
        an effect size into ~1e15.
    """
    return 0.0 if is_constant(sample) else float(sample.var(ddof=1))


@dataclass(frozen=True, slots=True)
class Welch:
    """Welch's t-test of ``mean(x) - mean(y)``; every field NaN where it is undefined.

    Attributes:
        diff: The mean difference.
        se: Its standard error, sqrt(s_A² / n_A + s_B² / n_B).
        t: Welch's t, ``diff / se``.
        dof: The Welch-Satterthwaite degrees of freedom.
        p: The two-sided p-value.
    """

    diff: float
    se: float
    t: float
    dof: float
    p: float

    def interval(self, confidence: float) -> tuple[float, float]:
        """The Welch-Satterthwaite interval of the mean difference at this coverage."""
        half = float(scipy_stats.t.ppf((1 + confidence) / 2, self.dof)) * self.se
        return self.diff - half, self.diff + half


def welch(x: np.ndarray, y: np.ndarray) -> Welch:
    """Welch's t-test of two samples.

    Args:
        x: Sample A.
        y: Sample B.

    Returns:
        The test; NaN throughout when a sample has fewer than two values or both are constant.
    """
    if min(x.size, y.size) < 2 or (is_constant(x) and is_constant(y)):
        return Welch(math.nan, math.nan, math.nan, math.nan, math.nan)
    var_x, var_y = variance(x) / x.size, variance(y) / y.size
    dof = (var_x + var_y) ** 2 / (var_x**2 / (x.size - 1) + var_y**2 / (y.size - 1))
    diff = float(x.mean() - y.mean())
    se = math.sqrt(var_x + var_y)
    t = diff / se
    return Welch(diff, se, t, dof, 2 * float(scipy_stats.t.sf(abs(t), dof)))


def _row_means(rows: np.ndarray, constant: np.ndarray) -> np.ndarray:
    """Each row's mean; a constant row's is its value, not a sum's rounding of it."""
    return np.where(constant, rows[:, 0], rows.mean(axis=1))


def welch_statistic(rows: np.ndarray, first: int) -> np.ndarray:
    """Welch's t of every row of pooled values whose first ``first`` columns are sample A.

    A row in which both samples are constant has no spread: its t is 0 when their values are
    equal and infinite otherwise, as complete separation of two constants is the most extreme
    split there is.
    """
    a, b = rows[:, :first], rows[:, first:]
    constant_a, constant_b = np.ptp(a, axis=1) == 0, np.ptp(b, axis=1) == 0
    shift = _row_means(a, constant_a) - _row_means(b, constant_b)
    var_a = np.where(constant_a, 0.0, a.var(axis=1, ddof=1)) / a.shape[1]
    var_b = np.where(constant_b, 0.0, b.var(axis=1, ddof=1)) / b.shape[1]
    spread = np.sqrt(var_a + var_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(
            spread > 0, shift / spread, np.where(shift == 0, 0.0, np.sign(shift) * np.inf)
        )


def studentized_permutation_p(
    x: np.ndarray, y: np.ndarray, seed: int, resamples: int = PERMUTATION_RESAMPLES
) -> float:
    """The permutation test of Welch's t of ``mean(x) - mean(y)``, two-sided.

    Args:
        x: Sample A (at least two values).
        y: Sample B (at least two values).
        seed: Seed of the random splits, used only when the test is not exact.
        resamples: The most splits enumerated exactly, and the random splits drawn otherwise.

    Returns:
        The p-value: the share of splits whose |Welch's t| is at least the observed one; NaN
        when a sample has fewer than two values, which have no variance to studentize by.
    """
    if min(x.size, y.size) < 2:
        return math.nan
    return _permutation_p(x, y, welch_statistic, resamples, seed)


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
    return math.sqrt(((n_a - 1) * variance(x) + (n_b - 1) * variance(y)) / (n_a + n_b - 2))


def hedges_g(x: np.ndarray, y: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """Hedges' g (pooled SD, bias-corrected) with its normal-approximation interval.

    Args:
        x: Sample A (at least two values).
        y: Sample B (at least two values).
        confidence: Coverage of the interval, e.g. 0.95.

    Returns:
        g and the interval's bounds; NaN when both samples are constant.
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
        The estimate and the interval's bounds; NaN when both samples are constant.
    """
    n_a, n_b = x.size, y.size
    var_a, var_b = variance(x), variance(y)
    average = (var_a + var_b) / 2
    if average == 0:
        return math.nan, math.nan, math.nan
    d = (x.mean() - y.mean()) / math.sqrt(average)
    variance_d = (
        d * d * (var_a**2 / (n_a - 1) + var_b**2 / (n_b - 1)) / (8 * average**2)
        + (var_a / (n_a - 1) + var_b / (n_b - 1)) / average
    )
    half = _z(confidence) * math.sqrt(variance_d)
    return float(_correction(n_a, n_b) * d), float(d - half), float(d + half)


def sd_ratio(x: np.ndarray, y: np.ndarray) -> float:
    """The larger sample SD over the smaller; infinite when only one is 0, NaN when both are."""
    spreads = sorted(math.sqrt(variance(sample)) for sample in (x, y))
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
