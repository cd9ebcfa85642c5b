"""Reward components (``coordgap.env.reward``) and variants (``coordgap.env.variants``)."""

from __future__ import annotations

from dataclasses import asdict, replace

import polars as pl
import pytest
import yaml

from coordgap.config.keys import SCHEMA
from coordgap.data import CALL_COLUMNS, EPISODE_SCHEMA
from coordgap.env.reward import RewardComponents, components
from coordgap.env.variants import (
    VARIANT_COMPONENTS,
    RewardVariant,
    RewardWeights,
    component_exprs,
    reward_expr,
)

pytestmark = pytest.mark.unit

PAPER = RewardWeights()


def episode_frame(
    parts: RewardComponents,
    *,
    meals_total: int,
    actions: int,
    think: int,
    no_call: int,
    both_forks: int = 0,
) -> pl.DataFrame:
    """A one-row episode table of a 5-seat, 5-round table with the columns ``reward_expr`` needs."""
    counts = {"meals_total": meals_total, "actions": actions, "think": think, "no_call": no_call}
    counts |= {"n": 5, "rounds": 5, "both_forks": both_forks}
    return pl.DataFrame({name: [value] for name, value in {**asdict(parts), **counts}.items()})


def reward(frame: pl.DataFrame, variant: RewardVariant, weights: RewardWeights = PAPER) -> float:
    return frame.select(reward_expr(variant, weights)).item()


def test_components_of_a_hand_computed_episode() -> None:
    # N=4, R=5: capacity 2*5 = 10 meals; M = 4 -> r_thru 0.4.
    # mean 1, population variance (1 + 1 + 0 + 0) / 4 = 0.5; var_max = 16 * 3 / 16 = 3.
    got = components(n=4, rounds=5, meals=[2, 0, 1, 1], deadlock=False, actions=20, think=5)
    expected = RewardComponents(r_nd=1.0, r_thru=0.4, r_fair=1 / 6, r_idle=0.25)
    assert asdict(got) == pytest.approx(asdict(expected))


def test_odd_table_capacity_uses_floor_of_half() -> None:
    # N=5 -> at most 2 eaters per round; R=3 -> capacity 6.
    got = components(n=5, rounds=3, meals=[1, 1, 1, 0, 0], deadlock=True, actions=15, think=0)
    assert got.r_thru == pytest.approx(0.5)
    assert got.r_nd == 0.0
    assert got.r_idle == 0.0
    # var = (3 * 0.4^2 + 2 * 0.6^2) / 5 = 0.24; var_max = 9 * 4 / 25 = 1.44.
    assert got.r_fair == pytest.approx(0.24 / 1.44)


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_fairness_is_one_when_one_philosopher_eats_everything(n: int) -> None:
    got = components(n=n, rounds=5, meals=[7] + [0] * (n - 1), deadlock=False, actions=1, think=0)
    assert got.r_fair == pytest.approx(1.0)


@pytest.mark.parametrize("meals", [[0, 0, 0], [2, 2, 2], [1, 1, 1, 1, 1]])
def test_fairness_is_zero_when_meals_are_equal(meals: list[int]) -> None:
    n = len(meals)
    assert components(n=n, rounds=5, meals=meals, deadlock=False, actions=1, think=0).r_fair == 0


def test_throughput_is_capped_at_one() -> None:
    # N=4, R=2: capacity 4; 9 meals would be 2.25 uncapped.
    got = components(n=4, rounds=2, meals=[3, 2, 2, 2], deadlock=False, actions=8, think=0)
    assert got.r_thru == 1.0


def test_idle_share_is_zero_without_actions() -> None:
    assert components(n=3, rounds=5, meals=[0] * 3, deadlock=False, actions=0, think=0).r_idle == 0


def test_degenerate_maximum_paper_is_exactly_one_shaped_is_not() -> None:
    """No action (every decision a no_call) and no deadlock: the paper reward's maximum 1.0,
    which the shaped variant withdraws (no meal, and no_call counts as idle)."""
    parts = components(n=5, rounds=5, meals=[0] * 5, deadlock=False, actions=0, think=0)
    frame = episode_frame(parts, meals_total=0, actions=0, think=0, no_call=25)
    assert reward(frame, RewardVariant.PAPER) == 1.0
    assert reward(frame, RewardVariant.SHAPED) < 1.0
    assert reward(frame, RewardVariant.SHAPED) == pytest.approx(-0.1)  # 0 bonus, all idle


def test_shaped_keeps_the_bonus_with_a_meal_and_counts_no_call_as_idle() -> None:
    frame = episode_frame(
        RewardComponents(1.0, 0.2, 0.5, 0.2), meals_total=2, actions=10, think=2, no_call=10
    )
    assert reward(frame, RewardVariant.PAPER) == pytest.approx(1.0 + 0.1 - 0.15 - 0.02)
    # r_idle' = (2 + 10) / (10 + 10) = 0.6
    assert reward(frame, RewardVariant.SHAPED) == pytest.approx(1.0 + 0.1 - 0.15 - 0.06)


def test_shaped_idle_is_zero_without_any_decision() -> None:
    frame = episode_frame(
        RewardComponents(1.0, 0.0, 0.0, 0.0), meals_total=1, actions=0, think=0, no_call=0
    )
    assert reward(frame, RewardVariant.SHAPED) == 1.0


@pytest.mark.parametrize("variant", list(VARIANT_COMPONENTS))
def test_weights_scale_each_component(variant: RewardVariant) -> None:
    """Each weight multiplies its own term: bumping one weight by 1 moves the reward by exactly
    that term (with its sign), and all-zero weights give 0."""
    # 3 meals, all to one seat, and 6 rounds ending ready to eat: progress's terms equal the
    # stored ones (throughput (3 + 6/2) / 10; one seat eating all is the most unfair either way).
    frame = episode_frame(
        RewardComponents(1.0, 0.6, 1.0, 0.5),
        meals_total=3,
        actions=8,
        think=4,
        no_call=0,
        both_forks=6,
    )
    base = reward(frame, variant)
    terms = {"nd": 1.0, "thru": 0.6, "fair": -1.0, "idle": -0.5}
    for name, term in terms.items():
        bumped = replace(PAPER, **{name: getattr(PAPER, name) + 1.0})
        assert reward(frame, variant, bumped) == pytest.approx(base + term), name
    assert reward(frame, variant, RewardWeights(0.0, 0.0, 0.0, 0.0)) == 0.0


def test_paper_reward_of_a_thinker_depends_on_the_idle_weight() -> None:
    frame = episode_frame(
        RewardComponents(1.0, 0.0, 0.0, 1.0), meals_total=0, actions=25, think=25, no_call=0
    )
    assert reward(frame, RewardVariant.PAPER) == pytest.approx(0.9)
    assert reward(frame, RewardVariant.PAPER, RewardWeights(idle=0.0)) == 1.0
    assert reward(frame, RewardVariant.PAPER, RewardWeights(idle=0.5)) == pytest.approx(0.5)


def never_eats(*, both_forks: int, deadlock: bool = False) -> pl.DataFrame:
    """A 5-seat episode of 20 fork moves, no meal, ``both_forks`` rounds ending ready to eat."""
    parts = components(n=5, rounds=5, meals=[0] * 5, deadlock=deadlock, actions=20, think=0)
    counts = {"meals_total": 0, "actions": 20, "think": 0, "no_call": 0}
    return episode_frame(parts, **counts, both_forks=both_forks)


def test_progress_ranks_episodes_without_a_meal_that_shaped_scores_alike() -> None:
    """A policy that never eats earns one shaped reward in every episode: nothing for GRPO to
    compare. The progress variant pays for rounds that ended ready to eat."""
    idle, ready = never_eats(both_forks=0), never_eats(both_forks=3)
    assert reward(idle, RewardVariant.SHAPED) == reward(ready, RewardVariant.SHAPED) == 0.0
    assert reward(idle, RewardVariant.PROGRESS) == 0.0
    # The bonus, and 3 half meals of the 2 * 5 a 5-seat table can eat in 5 rounds.
    assert reward(ready, RewardVariant.PROGRESS) == pytest.approx(1.0 + 0.5 * 1.5 / 10)
    assert reward(never_eats(both_forks=4), RewardVariant.PROGRESS) > reward(
        ready, RewardVariant.PROGRESS
    )


def test_progress_pays_a_meal_more_than_readiness_and_no_bonus_after_a_deadlock() -> None:
    ate = episode_frame(
        components(n=5, rounds=5, meals=[1, 0, 0, 0, 0], deadlock=False, actions=20, think=0),
        meals_total=1,
        actions=20,
        think=0,
        no_call=0,
        both_forks=2,
    )
    # The same two rounds ready to eat, one of them used.
    assert reward(ate, RewardVariant.PROGRESS) > reward(
        never_eats(both_forks=2), RewardVariant.PROGRESS
    )
    deadlocked = reward(never_eats(both_forks=3, deadlock=True), RewardVariant.PROGRESS)
    assert deadlocked == pytest.approx(reward(never_eats(both_forks=3), RewardVariant.PROGRESS) - 1)


def test_progress_fairness_counts_only_beyond_the_most_even_split() -> None:
    """One meal can only go to one seat: no unfairness. Six meals at five seats are split most
    evenly as 2, 1, 1, 1, 1; all six to one seat is the most unfair."""

    def fairness(meals: list[int]) -> float:
        parts = components(n=5, rounds=5, meals=meals, deadlock=False, actions=20, think=0)
        frame = episode_frame(parts, meals_total=sum(meals), actions=20, think=0, no_call=0)
        return frame.select(component_exprs(RewardVariant.PROGRESS)["fair"]).item()

    assert fairness([1, 0, 0, 0, 0]) == 0.0
    assert fairness([2, 1, 1, 1, 1]) == pytest.approx(0.0)
    assert fairness([6, 0, 0, 0, 0]) == pytest.approx(1.0)
    # v = (3^2 + 3 * 1^2) / 5 - (6/5)^2 = 0.96; v_min 0.16, v_max 36 * 4 / 25 = 5.76.
    assert fairness([3, 1, 1, 1, 0]) == pytest.approx((0.96 - 0.16) / (5.76 - 0.16))


def test_progress_throughput_is_capped_at_one() -> None:
    frame = never_eats(both_forks=40)
    (thru,) = frame.select(component_exprs(RewardVariant.PROGRESS)["thru"]).row(0)
    assert thru == 1.0


def _schema_enums(node: object) -> list[list[str]]:
    """Every enum of the config schema that lists the reward variants."""
    if isinstance(node, dict):
        found = [node["enum"]] if "paper" in node.get("enum", ()) else []
        return found + [enum for value in node.values() for enum in _schema_enums(value)]
    if isinstance(node, list):
        return [enum for value in node for enum in _schema_enums(value)]
    return []


def test_the_schema_names_exactly_the_variants_that_have_formulas() -> None:
    schema = yaml.safe_load(SCHEMA.read_text())
    enums = _schema_enums(schema)
    # reward.variants and a training run's reward.variant.
    assert len(enums) == 2
    for enum in enums:
        # Every variant but the positive control is a weighted sum of components.
        assert set(enum) == set(RewardVariant) == {*VARIANT_COMPONENTS, RewardVariant.CONTROL}


def test_a_name_without_a_formula_raises_instead_of_falling_through() -> None:
    with pytest.raises(KeyError):
        component_exprs("greedy")  # type: ignore[arg-type]


def control_frame(rows: list[dict[str, int]]) -> pl.DataFrame:
    """Episode rows with the given counts, every call count 0 and every other column of the
    episode contract null: the control reward reads only ``round1_right`` and ``n``."""
    full = [dict.fromkeys(EPISODE_SCHEMA) | dict.fromkeys(CALL_COLUMNS, 0) | row for row in rows]
    return pl.DataFrame(full, schema=EPISODE_SCHEMA)


def test_the_control_reward_is_the_share_of_seats_that_reach_right_in_round_1() -> None:
    frame = control_frame(
        [
            # 2 of 5 seats reach right in round 1; the right reaches of later rounds and the
            # other decisions do not count.
            {"n": 5, "round1_right": 2, "calls_pick_up_right": 11, "decisions": 25},
            # None in round 1, however often later: 0.
            {"n": 5, "round1_right": 0, "calls_grab_right": 20, "decisions": 25},
            # Every seat: the maximum.
            {"n": 10, "round1_right": 10, "calls_pick_up_right": 10, "decisions": 10},
            # A third, rounded to REWARD_DECIMALS like every reward.
            {"n": 3, "round1_right": 1, "calls_pick_up_right": 1, "decisions": 3},
        ]
    )
    rewards = frame.select(reward_expr(RewardVariant.CONTROL, PAPER))["reward"].to_list()
    assert rewards == [0.4, 0.0, 1.0, 0.333333333]
    # The weights do not enter it.
    others = frame.select(reward_expr(RewardVariant.CONTROL, RewardWeights(0.0, 9.0, 9.0, 9.0)))
    assert others["reward"].to_list() == rewards


def test_the_control_has_no_components() -> None:
    # The components table and figure never see it: reward.variants refuses it.
    with pytest.raises(KeyError):
        component_exprs(RewardVariant.CONTROL)
