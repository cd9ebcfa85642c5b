"""Statistics against published worked examples, hand computations and independent libraries.

Sources of the known values:

* Welch's t-test: the three worked examples of the Wikipedia article "Welch's t-test"
  (t, degrees of freedom and p to two or three decimals); scipy as the exact oracle.
* Wilson interval: Newcombe (1998a), "Two-sided confidence intervals for the single
  proportion", Statistics in Medicine 17:857, Table I (method 3); statsmodels as the oracle.
* Newcombe's hybrid score interval for a difference of proportions: Newcombe (1998b),
  "Interval estimation for the difference between independent proportions", Statistics in
  Medicine 17:873, Table II (method 10); statsmodels ``confint_proportions_2indep`` as oracle.
* Holm: Holm (1979)'s step-down rule on a four-p-value family worked by hand.
* Power: Cohen (1988), Statistical Power Analysis, Table 2.4.1: 64 per group for d = 0.5,
  two-sided alpha 0.05, power 0.80; statsmodels ``TTestIndPower`` as the oracle, also of each
  comparison's detectable effect.
* Hedges' g and its interval: Borenstein, Hedges, Higgins & Rothstein (2009), Introduction to
  Meta-Analysis, section 4.4 worked example (d = 0.5970, g = 0.5924, SE of g 0.2028).
* Bonett's interval of the average-variance effect size: its coverage under unequal variances,
  by simulation.
* The studentized permutation test (Janssen 1997; Chung & Romano 2013): every split enumerated
  by hand on exact fractions, every split of 5 against 30 episodes enumerated by an independent
  moment formula, and its type-I error where the unstudentized test's is about 0.4.
* Constant samples: floating-point constants whose numpy variance is ~1e-32, not 0.
* Brunner-Munzel: the example of Brunner & Munzel (2000) as scipy documents it (statistic
  3.1375), scipy's statistic on every split of a small pair.
"""

from __future__ import annotations

import itertools
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestIndPower
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint

from coordgap.analysis.comparisons import holm, power_table, two_sample_tests
from coordgap.analysis.stats import summarize
from coordgap.analysis.two_sample import (
    average_sd_g,
    brunner_munzel,
    brunner_munzel_statistic,
    detectable_effect,
    hedges_g,
    is_constant,
    sd_ratio,
    studentized_permutation_p,
    variance,
    welch,
)
from coordgap.intervals import (
    bootstrap_difference_ci,
    bootstrap_mean_ci,
    difference_interval,
    mean_interval,
    newcombe_interval,
    wilson_interval,
)
from tests.unit.analysis_tables import COMPARE, CONFIG, POWER, table

pytestmark = pytest.mark.unit

# Wikipedia, "Welch's t-test", Examples 1-3: samples, then published t, dof and p.
WELCH_EXAMPLES = [
    (
        [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4],
        [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4],
        (-2.46, 25.0, 0.021),
    ),
    (
        [17.2, 20.9, 22.6, 18.1, 21.7, 21.4, 23.5, 24.2, 14.7, 21.8],
        [
            *(21.5, 22.8, 21.0, 23.0, 21.6, 23.6, 22.5, 20.7, 23.4, 21.8),
            *(20.7, 21.7, 21.5, 22.5, 23.6, 21.5, 22.5, 23.5, 21.5, 21.8),
        ],
        (-1.57, 9.9, 0.149),
    ),
    (
        [19.8, 20.4, 19.6, 17.8, 18.5, 18.9, 18.3, 18.9, 19.5, 22.0],
        [
            *(28.2, 26.6, 20.1, 23.3, 25.2, 22.1, 17.7, 27.6, 20.6, 13.7),
            *(23.2, 17.5, 20.6, 18.0, 23.9, 21.6, 24.3, 20.4, 23.9, 13.3),
        ],
        (-2.22, 24.5, 0.036),
    ),
]


@pytest.mark.parametrize(("x", "y", "published"), WELCH_EXAMPLES)
def test_welch_matches_the_published_examples_scipy_and_a_hand_computation(
    x: list[float], y: list[float], published: tuple[float, float, float]
) -> None:
    a, b = np.array(x), np.array(y)
    got = two_sample_tests(a, b, ("a", "b"), COMPARE)
    t, dof, p = published
    # Samples of 10 or more with some variance: Welch is the test to read.
    assert got["test"] == "welch"
    assert got["p"] == got["welch_p"]
    # Published to two or three decimals.
    assert got["t"] == pytest.approx(t, abs=0.01)
    assert got["dof"] == pytest.approx(dof, abs=0.05)
    assert got["p"] == pytest.approx(p, abs=0.001)
    # Exact: scipy, and the textbook formulas.
    oracle = scipy_stats.ttest_ind(a, b, equal_var=False)
    assert (got["t"], got["p"]) == pytest.approx((oracle.statistic, oracle.pvalue), rel=1e-9)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    assert got["t"] == pytest.approx((a.mean() - b.mean()) / math.sqrt(va + vb), rel=1e-12)
    welch_dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    assert got["dof"] == pytest.approx(welch_dof, rel=1e-12)
    interval = welch(a, b).interval(0.95)
    assert interval == pytest.approx(tuple(oracle.confidence_interval(0.95)), rel=1e-9)


@pytest.mark.parametrize(("x", "y", "published"), WELCH_EXAMPLES)
def test_hedges_g_its_interval_and_the_detectable_effect_match_a_hand_computation(
    x: list[float], y: list[float], published: tuple[float, float, float]
) -> None:
    a, b = np.array(x), np.array(y)
    g, low, high = hedges_g(a, b, 0.95)
    na, nb = a.size, b.size
    pooled = math.sqrt(((na - 1) * a.var(ddof=1) + (nb - 1) * b.var(ddof=1)) / (na + nb - 2))
    d = (a.mean() - b.mean()) / pooled
    j = 1 - 3 / (4 * (na + nb) - 9)
    assert g == pytest.approx(j * d, rel=1e-12)
    # Borenstein et al. (2009), eqs. 4.20 and 4.24: SE(g) = J SE(d), and a normal critical value.
    se = j * math.sqrt((na + nb) / (na * nb) + d**2 / (2 * (na + nb)))
    z = scipy_stats.norm.ppf(0.975)
    assert (low, high) == pytest.approx((g - z * se, g + z * se), rel=1e-9)
    detectable = TTestIndPower().solve_power(nobs1=na, ratio=nb / na, alpha=0.05, power=0.8)
    assert detectable_effect(na, nb, 0.05, 0.8) == pytest.approx(detectable, rel=1e-4)


def _with_moments(mean: float, sd: float, size: int) -> np.ndarray:
    """A sample with exactly this mean and SD (ddof 1)."""
    base = np.linspace(-1, 1, size)
    return mean + sd * (base - base.mean()) / base.std(ddof=1)


def test_hedges_g_matches_borensteins_worked_example() -> None:
    # Section 4.4: means 103 and 100, SDs 5.5 and 4.5, 50 per group.
    a, b = _with_moments(103, 5.5, 50), _with_moments(100, 4.5, 50)
    g, low, high = hedges_g(a, b, 0.95)
    assert g == pytest.approx(0.5924, abs=5e-5)
    # Published to four decimals: SE of g 0.2028, so the bounds to about 2e-4.
    assert (low, high) == pytest.approx((0.5924 - 1.96 * 0.2028, 0.5924 + 1.96 * 0.2028), abs=3e-4)


@pytest.mark.parametrize(
    ("six", "thirty", "published"), [(6, 6, 1.80), (6, 30, 1.29), (30, 30, 0.74)]
)
def test_detectable_effects_of_the_cell_sizes_the_study_affords(
    six: int, thirty: int, published: float
) -> None:
    assert detectable_effect(six, thirty, 0.05, 0.8) == pytest.approx(published, abs=0.006)


def test_bonetts_interval_keeps_its_coverage_where_the_sds_differ_threefold() -> None:
    """1000 pairs: 10 from N(1, 1) and 30 from N(0, 3); delta = 1 / sqrt((1 + 9) / 2) = 0.447.

    Bonett (2008) reports near-nominal coverage for such designs; 1000 simulations give a
    binomial SE of 0.007, so 0.925-0.975 is 0.95 +- 3.6 SE.
    """
    delta = 1 / math.sqrt(5)

    def draw(rng: np.random.Generator, sim: int) -> tuple[float, float]:
        del sim
        _, low, high = average_sd_g(rng.normal(1, 1, 10), rng.normal(0, 3, 30), 0.95)
        return low, high

    assert 0.925 <= _coverage(draw, delta, sims=1000, seed=2026) <= 0.975


def _every_split_p(x: list[int], y: list[int], statistic) -> float:
    """Two-sided permutation p by enumerating every split, on exact integers."""
    pooled = [*x, *y]
    observed = abs(statistic(x, y))
    count = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(x)):
        a = [pooled[i] for i in chosen]
        b = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        count += abs(statistic(a, b)) >= observed
        total += 1
    return count / total


def _squared_welch_t(a: list[int], b: list[int]) -> Fraction | float:
    """Welch's t², exactly: as extreme as |t|, and free of square roots."""

    def moments(sample: list[int]) -> tuple[Fraction, Fraction]:
        mean = Fraction(sum(sample), len(sample))
        return mean, sum((v - mean) ** 2 for v in sample) / (len(sample) - 1)

    (mean_a, var_a), (mean_b, var_b) = moments(a), moments(b)
    spread = var_a / len(a) + var_b / len(b)
    if spread == 0:  # two constants: as far apart as a split gets, unless equal
        return math.inf if mean_a != mean_b else 0
    return (mean_a - mean_b) ** 2 / spread


@pytest.mark.parametrize(
    ("x", "y"),
    [
        ([3, 5, 9, 4], [1, 2, 2, 6, 0]),
        ([1, 1, 1, 1, 1, 1], [0, 1, 0, 1, 1, 0]),
        ([2, 2], [2, 2]),
        ([7, 1, 9], [4, 4, 4, 4, 5, 3, 4]),
    ],
)
def test_the_exact_studentized_permutation_test_counts_every_split(
    x: list[int], y: list[int]
) -> None:
    got = studentized_permutation_p(np.array(x, float), np.array(y, float), seed=0)
    assert got == pytest.approx(_every_split_p(x, y, _squared_welch_t), abs=1e-12)


# Five episodes with 6.7 times the SD of thirty, the shape of a 5-episode language model
# against a 30-episode scripted one. Exact p: 0.0825 of Welch's t over all 324,632 splits;
# 0.0011 of the raw mean difference (anti-conservative); Welch's t-test 0.10.
FIVE = np.array([0.9, -0.2, 1.3, 0.1, 0.8])
THIRTY = np.linspace(-0.15, 0.15, 30)


def _every_split_welch_p(x: np.ndarray, y: np.ndarray) -> float:
    """Exact two-sided p of Welch's t over every split, from each split's sums of powers."""
    pooled = np.concatenate([x, y])
    n_a, n_b = x.size, y.size
    chosen = np.fromiter(
        itertools.chain.from_iterable(itertools.combinations(range(pooled.size), n_a)),
        dtype=np.int64,
    ).reshape(-1, n_a)
    sum_a, squares_a = pooled[chosen].sum(axis=1), (pooled[chosen] ** 2).sum(axis=1)
    sum_b, squares_b = pooled.sum() - sum_a, (pooled**2).sum() - squares_a
    var_a = (squares_a - sum_a**2 / n_a) / (n_a - 1)
    var_b = (squares_b - sum_b**2 / n_b) / (n_b - 1)
    t = np.abs(sum_a / n_a - sum_b / n_b) / np.sqrt(var_a / n_a + var_b / n_b)
    observed = abs(scipy_stats.ttest_ind(x, y, equal_var=False).statistic)
    return float(np.mean(t >= observed * (1 - 1e-9)))


def test_the_studentized_permutation_test_at_5_against_30_episodes_matches_every_split() -> None:
    exact = _every_split_welch_p(FIVE, THIRTY)
    assert exact == pytest.approx(0.0825, abs=5e-5)
    got = studentized_permutation_p(FIVE, THIRTY, seed=1)
    assert got == studentized_permutation_p(FIVE, THIRTY, seed=1)
    assert got != studentized_permutation_p(FIVE, THIRTY, seed=2)
    # 10,000 random splits: a binomial SE of 0.0028.
    assert got == pytest.approx(exact, abs=4 * math.sqrt(exact * (1 - exact) / 10_000) + 1e-4)


def test_the_studentized_permutation_test_holds_its_level_under_unequal_variances() -> None:
    """400 null pairs: 5 from N(0, 5) against 30 from N(0, 1), 999 random splits each.

    The permutation test of the raw mean difference rejects about 40 % of such pairs at 0.05;
    the permutation test of Welch's t about 6-8 % (asymptotically 5 %: Janssen 1997). 400
    simulations give a binomial SE of 0.013, so 0.11 is 0.07 + 3 SE.
    """
    rng = np.random.default_rng(2027)
    rejected = [
        studentized_permutation_p(rng.normal(0, 5, 5), rng.normal(0, 1, 30), sim, 999) <= 0.05
        for sim in range(400)
    ]
    assert np.mean(rejected) <= 0.11


# Floating-point constants whose numpy variance is ~1e-32 rather than 0.
CONSTANT_HIGH, CONSTANT_LOW = np.full(6, 0.7), np.full(6, 0.1)


def test_constant_samples_have_exactly_zero_variance_and_no_effect_size() -> None:
    assert CONSTANT_HIGH.var(ddof=1) > 0  # the rounding noise a variance test would read
    assert is_constant(CONSTANT_HIGH)
    assert variance(CONSTANT_HIGH) == 0.0
    for low, high in ((CONSTANT_HIGH, CONSTANT_LOW), (CONSTANT_HIGH, CONSTANT_HIGH)):
        assert all(math.isnan(v) for v in hedges_g(low, high, 0.95))
        assert all(math.isnan(v) for v in average_sd_g(low, high, 0.95))
        assert math.isnan(sd_ratio(low, high))
        assert all(math.isnan(v) for v in (welch(low, high).t, welch(low, high).p))
    # Two constants that differ: only this split and its mirror are as extreme, 2 of 924.
    assert studentized_permutation_p(CONSTANT_HIGH, CONSTANT_LOW, seed=0) == pytest.approx(2 / 924)


def test_one_constant_sample_keeps_defined_effect_sizes_over_the_other_ones_sd() -> None:
    varied = np.array([0.1, 0.4, 0.2, 0.5, 0.3, 0.2])
    assert sd_ratio(CONSTANT_HIGH, varied) == math.inf
    g, _, _ = hedges_g(CONSTANT_HIGH, varied, 0.95)
    pooled = math.sqrt(5 * varied.var(ddof=1) / 10)
    assert g == pytest.approx((1 - 3 / (4 * 12 - 9)) * (0.7 - varied.mean()) / pooled)
    g_av, _, _ = average_sd_g(CONSTANT_HIGH, varied, 0.95)
    average = math.sqrt(varied.var(ddof=1) / 2)
    assert g_av == pytest.approx((1 - 3 / (4 * 12 - 9)) * (0.7 - varied.mean()) / average)
    test = welch(CONSTANT_HIGH, varied)
    assert test.t == pytest.approx((0.7 - varied.mean()) / math.sqrt(varied.var(ddof=1) / 6))
    assert test.dof == pytest.approx(5)


def test_brunner_munzel_statistic_matches_the_published_example() -> None:
    # Brunner & Munzel (2000), as in scipy's documentation: W = 3.1375 for P(x < y).
    x = [1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 1, 1]
    y = [3, 3, 4, 3, 1, 2, 3, 1, 1, 5, 4]
    rows = np.array([[*x, *y]], dtype=float)
    # Ours is of P(x > y): the same statistic with the opposite sign.
    assert brunner_munzel_statistic(rows, len(x))[0] == pytest.approx(-3.1374674823, abs=1e-9)
    superiority, _ = brunner_munzel(np.array(x, float), np.array(y, float), seed=0)
    pairs = np.subtract.outer(x, y)
    assert superiority == pytest.approx((pairs > 0).mean() + (pairs == 0).mean() / 2)


def test_the_brunner_munzel_permutation_test_matches_scipy_on_every_split() -> None:
    x = np.array([0.3, 1.2, 0.8, 2.5, 1.9])
    y = np.array([1.1, 2.2, 3.0, 2.8, 0.9, 2.6])

    def scipy_statistic(a: np.ndarray, b: np.ndarray) -> float:
        with warnings.catch_warnings():
            # Splits that separate the samples completely have no spread: |W| is infinite.
            warnings.simplefilter("ignore", RuntimeWarning)
            return abs(scipy_stats.brunnermunzel(a, b).statistic)

    oracle = scipy_stats.permutation_test(
        (x, y),
        scipy_statistic,
        permutation_type="independent",
        alternative="greater",
        n_resamples=np.inf,
    ).pvalue
    assert brunner_munzel(x, y, seed=0)[1] == pytest.approx(oracle, abs=1e-12)


def test_binary_samples_get_wilson_and_newcombe_intervals_others_the_bootstrap() -> None:
    six = np.ones(6)
    assert mean_interval(six, 0.95, 2000, seed=1) == pytest.approx(
        (1.0, *proportion_confint(6, 6, alpha=0.05, method="wilson"))
    )
    mixed = np.array([0.0, 1, 1, 0, 1, 1, 1, 0])
    assert difference_interval(six, mixed, 0.95, 2000, seed=1) == pytest.approx(
        tuple(
            map(
                float,
                confint_proportions_2indep(6, 6, 5, 8, method="newcomb", compare="diff"),
            )
        )
    )
    varied = np.array([0.2, 0.9, 0.4, 0.7])
    assert mean_interval(varied, 0.95, 2000, seed=1) == bootstrap_mean_ci(varied, 0.95, 2000, 1)
    assert difference_interval(varied, six, 0.95, 2000, 1) == bootstrap_difference_ci(
        varied, six, 0.95, 2000, 1
    )


@pytest.mark.parametrize(
    ("successes", "trials", "published"),
    [
        (81, 263, (0.2553, 0.3662)),
        (15, 148, (0.0624, 0.1605)),
        (0, 20, (0.0, 0.1611)),
        (1, 29, (0.0061, 0.1718)),
    ],
)
def test_wilson_interval_matches_newcombe_1998_table(
    successes: int, trials: int, published: tuple[float, float]
) -> None:
    assert wilson_interval(successes, trials, 0.95) == pytest.approx(published, abs=5e-5)


@pytest.mark.parametrize(("successes", "trials"), [(0, 10), (10, 10), (3, 10), (1, 1), (17, 30)])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_wilson_interval_matches_statsmodels(
    successes: int, trials: int, confidence: float
) -> None:
    expected = proportion_confint(successes, trials, alpha=1 - confidence, method="wilson")
    assert wilson_interval(successes, trials, confidence) == pytest.approx(expected, abs=1e-12)


def test_wilson_interval_without_trials_is_undefined() -> None:
    assert all(math.isnan(bound) for bound in wilson_interval(0, 0, 0.95))


# Newcombe (1998b), Table II, method 10: (a, m, b, n) for a/m - b/n, and the published bounds.
NEWCOMBE_EXAMPLES = [
    ((56, 70, 48, 80), (0.0524, 0.3339)),
    ((9, 10, 3, 10), (0.1705, 0.8090)),
    ((6, 7, 2, 7), (0.0582, 0.8062)),
    ((5, 56, 0, 29), (-0.0381, 0.1926)),
    ((0, 10, 0, 20), (-0.1611, 0.2775)),
    ((0, 10, 0, 10), (-0.2775, 0.2775)),
    ((10, 10, 0, 20), (0.6791, 1.0000)),
    ((10, 10, 0, 10), (0.6075, 1.0000)),
]


@pytest.mark.parametrize(("counts", "published"), NEWCOMBE_EXAMPLES)
def test_newcombe_interval_matches_the_published_examples_and_statsmodels(
    counts: tuple[int, int, int, int], published: tuple[float, float]
) -> None:
    got = newcombe_interval(*counts, 0.95)
    assert got == pytest.approx(published, abs=5e-5)
    a, m, b, n = counts
    oracle = confint_proportions_2indep(a, m, b, n, method="newcomb", compare="diff", alpha=0.05)
    assert got == pytest.approx(tuple(map(float, oracle)), abs=1e-12)


def test_newcombe_interval_without_trials_is_undefined() -> None:
    assert all(math.isnan(bound) for bound in newcombe_interval(0, 0, 3, 10, 0.95))


def test_holm_on_a_known_family_and_against_statsmodels() -> None:
    # Ascending: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04, and each
    # adjusted p is the running maximum: 0.02, 0.03, 0.06, 0.06.
    p = [0.01, 0.04, 0.03, 0.005]
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm(p) == pytest.approx(multipletests(p, method="holm")[1])


def test_holm_leaves_an_undefined_p_out_of_the_family() -> None:
    adjusted = holm([0.01, math.nan, 0.04])
    assert adjusted[0] == pytest.approx(0.02)
    assert math.isnan(adjusted[1])
    assert adjusted[2] == pytest.approx(0.04)
    assert holm([]) == []


def test_power_table_against_cohen_and_statsmodels() -> None:
    power = power_table(summarize(table(), CONFIG), 30, POWER)
    required, paper, ours = power.rows(named=True)
    # Cohen (1988), Table 2.4.1: 64 per group for d = 0.5, two-sided alpha 0.05, power 0.80.
    assert required["episodes_per_cell"] == 64
    assert required["power_at_effect"] >= 0.8
    solver = TTestIndPower()
    assert solver.solve_power(effect_size=0.5, alpha=0.05, power=0.8) == pytest.approx(
        63.77, abs=0.01
    )
    assert paper["episodes_per_cell"] == 30
    assert paper["power_at_effect"] == pytest.approx(
        solver.power(effect_size=0.5, nobs1=30, alpha=0.05), abs=1e-6
    )
    assert paper["detectable_effect"] == pytest.approx(
        solver.solve_power(nobs1=30, alpha=0.05, power=0.8), abs=1e-4
    )
    # The fixture's cells all hold six ok episodes.
    assert (ours["design"], ours["episodes_per_cell"], ours["cells"]) == ("ours", 6, 4)


def _coverage(draw, truth: float, sims: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for sim in range(sims):
        low, high = draw(rng, sim)
        hits += low <= truth <= high
    return hits / sims


def test_bootstrap_mean_interval_covers_about_95_percent_of_normal_means() -> None:
    """1000 samples of 30 from N(0.5, 0.2), 1000 resamples each.

    The percentile bootstrap of a mean under-covers a little at n = 30: it is about a z
    interval with the plug-in SD, so its coverage is P(|t_29| < 1.96 sqrt(29/30)) = 0.936.
    1000 simulations give a binomial SE of 0.0077; 0.91-0.97 is that value +- 3.4 SE.
    """

    def draw(rng: np.random.Generator, sim: int) -> tuple[float, float]:
        _, low, high = bootstrap_mean_ci(rng.normal(0.5, 0.2, 30), 0.95, 1000, seed=sim)
        return low, high

    assert 0.91 <= _coverage(draw, 0.5, sims=1000, seed=2024) <= 0.97


def test_bootstrap_difference_interval_covers_about_95_percent() -> None:
    """1000 pairs of samples, 30 from N(0.6, 0.2) and 20 from N(0.4, 0.3): same tolerance."""

    def draw(rng: np.random.Generator, sim: int) -> tuple[float, float]:
        x, y = rng.normal(0.6, 0.2, 30), rng.normal(0.4, 0.3, 20)
        return bootstrap_difference_ci(x, y, 0.95, 1000, seed=sim)

    assert 0.91 <= _coverage(draw, 0.2, sims=1000, seed=2025) <= 0.97


def test_bootstrap_intervals_are_seeded_and_degenerate_cases_are_explicit() -> None:
    values = np.random.default_rng(0).uniform(size=30)
    mean, low, high = bootstrap_mean_ci(values, 0.95, 2000, seed=3)
    assert mean == pytest.approx(values.mean())
    assert low < mean < high
    assert bootstrap_mean_ci(values, 0.95, 2000, seed=3) == (mean, low, high)
    assert bootstrap_mean_ci(values, 0.95, 2000, seed=4) != (mean, low, high)
    assert bootstrap_mean_ci(np.full(12, 0.1), 0.95, 2000, seed=3) == (0.1, 0.1, 0.1)
    one = bootstrap_mean_ci(np.array([0.7]), 0.95, 2000, seed=3)
    assert one[0] == 0.7
    assert math.isnan(one[1])
    assert math.isnan(one[2])
    assert all(math.isnan(v) for v in bootstrap_mean_ci(np.empty(0), 0.95, 2000, seed=3))
    assert bootstrap_difference_ci(np.full(5, 1.0), np.full(4, 0.9), 0.95, 500, 1) == (
        pytest.approx(0.1),
        pytest.approx(0.1),
    )
    assert all(math.isnan(v) for v in bootstrap_difference_ci(values, values[:1], 0.95, 500, 1))
