"""The paper's published numbers beside ours, and whether ours lie in their range.

``config/paper_reference.yaml`` lists, per paper model, quantities named
``<statistic>[_n<N>|_range]``: ``mean_reward``, ``deadlock_rate`` or ``meals``; ``_n<N>`` at one
table size, ``_range`` or no suffix at every size. A value is a number or a ``[low, high]``
range. One of our models is set beside a paper model of the same name.

Whether ours lies in theirs: a published range holds our estimate at every size it covers; a
single published number lies inside our confidence interval at every size, or, where we have
no interval (meals, a constant sample), equals our estimate at the published precision.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import polars as pl

from coordgap.analysis.stats import reward_columns
from coordgap.env.variants import RewardVariant

if TYPE_CHECKING:
    from collections.abc import Sequence

_QUANTITY = re.compile(r"^(?P<statistic>mean_reward|deadlock_rate|meals)(?:_n(?P<n>\d+)|_range)?$")
_STATISTIC_COLUMNS = {
    "deadlock_rate": ("deadlock_rate", "deadlock_ci_low", "deadlock_ci_high"),
    "meals": ("meals_mean", None, None),
}


@dataclass(frozen=True)
class Estimate:
    """One of our estimates at one table size: the value and its interval (None if none)."""

    n: int
    value: float | None
    low: float | None
    high: float | None


@dataclass(frozen=True)
class Check:
    """One published quantity of one paper model, beside ours.

    Attributes:
        paper_model: The paper's name of the model (a key of ``models:``).
        quantity: The published key, e.g. ``mean_reward_n5``.
        published: The published value: a number or a [low, high] range.
        ours: Our estimates of that quantity, one per table size it covers.
        within: Whether ours lies in the published range; None when we have no such model
            or size.
    """

    paper_model: str
    quantity: str
    published: float | list[float]
    ours: tuple[Estimate, ...]
    within: bool | None


def reward_variant_of_paper(variants: Sequence[RewardVariant]) -> RewardVariant:
    """The variant to set beside the paper's rewards: ``paper`` if configured, else the first."""
    return RewardVariant.PAPER if RewardVariant.PAPER in variants else variants[0]


def _decimals(value: float) -> int:
    exponent = Decimal(str(value)).normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _matches(published: float | list[float], estimate: Estimate) -> bool | None:
    if estimate.value is None or math.isnan(estimate.value):
        return None
    if isinstance(published, list):
        low, high = published
        return low <= estimate.value <= high
    if estimate.low is not None and estimate.high is not None and estimate.low < estimate.high:
        return estimate.low <= published <= estimate.high
    return round(estimate.value, _decimals(published)) == published


def _estimates(
    summary: pl.DataFrame, model: str, statistic: str, n: int | None, variant: RewardVariant
) -> tuple[Estimate, ...]:
    value, low, high = (
        reward_columns(variant) if statistic == "mean_reward" else _STATISTIC_COLUMNS[statistic]
    )
    rows = summary.filter(pl.col("model") == model)
    if n is not None:
        rows = rows.filter(pl.col("n") == n)
    return tuple(
        Estimate(row["n"], row[value], row[low] if low else None, row[high] if high else None)
        for row in rows.iter_rows(named=True)
    )


def check_published(
    paper: dict[str, Any], summary: pl.DataFrame, variants: Sequence[RewardVariant]
) -> list[Check]:
    """Set every published quantity of every paper model beside ours.

    Args:
        paper: The parsed ``config/paper_reference.yaml``.
        summary: The table of :func:`coordgap.analysis.stats.summarize`.
        variants: The configured reward variants (rewards are compared under
            :func:`reward_variant_of_paper`).

    Returns:
        One check per published quantity, in the file's order.
    """
    variant = reward_variant_of_paper(variants)
    checks = []
    for model, entry in paper.get("models", {}).items():
        for key, published in entry.items():
            match = _QUANTITY.match(key)
            if match is None:
                continue  # names and other descriptions, not numbers
            n = int(match["n"]) if match["n"] else None
            ours = _estimates(summary, model, match["statistic"], n, variant)
            verdicts = [_matches(published, estimate) for estimate in ours]
            within = None if not verdicts or None in verdicts else all(verdicts)
            checks.append(Check(model, key, published, ours, within))
    return checks
