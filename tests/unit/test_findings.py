"""The report's Findings: each sentence follows from the tables it is generated from."""

from __future__ import annotations

from typing import Any

import pingouin as pg
import polars as pl
import pytest

from coordgap.analysis.comparisons import COMPARISON_SCHEMA, power_table
from coordgap.analysis.findings import findings_section
from coordgap.analysis.monitors import monitor
from coordgap.analysis.seeds import SEED_COMPARISON_SCHEMA
from coordgap.analysis.stats import summarize
from coordgap.env.variants import RewardVariant
from tests.unit.analysis_tables import CONFIG, MONITORS, POWER, control_check, table

pytestmark = pytest.mark.unit

RUN = "tiny-grpo"


def comparison(model_a: str, n: int, diff: float, p_holm: float, variant: str) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COMPARISON_SCHEMA)
    return row | {
        "family": f"{RUN}: selected vs base",
        "variant": variant,
        "model_a": model_a,
        "model_b": "hierarchy",
        "n": n,
        "diff": diff,
        "p_holm": p_holm,
    }


def selection(steps: dict[str, int]) -> dict[str, Any]:
    return {"run": RUN, "choices": {policy: {"step": step} for policy, step in steps.items()}}


@pytest.fixture(scope="module")
def tables() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    episodes = table(sizes=(5, 7))
    summary = summarize(episodes, CONFIG)
    return summary, monitor(episodes, MONITORS), power_table(summary, 30, POWER)


def seed_pair(a: str, b: str, diff: float, p_holm: float, variant: str = "paper") -> dict:
    row: dict[str, Any] = dict.fromkeys(SEED_COMPARISON_SCHEMA)
    return row | {"variant": variant, "n": 5, "a": a, "b": b, "diff": diff, "p_holm": p_holm}


def findings(
    tables,
    comparisons: list[dict[str, Any]],
    selections: list[dict[str, Any]],
    seed_pairs: list[dict[str, Any]] | None = None,
    control: pl.DataFrame | None = None,
) -> str:
    summary, monitors, power = tables
    return findings_section(
        summary,
        pl.DataFrame(comparisons, schema=COMPARISON_SCHEMA),
        monitors,
        power,
        selections,
        variant=RewardVariant.PAPER,
        alpha=0.05,
        degenerate_reward=0.8,
        seed_comparisons=(
            None if seed_pairs is None else pl.DataFrame(seed_pairs, schema=SEED_COMPARISON_SCHEMA)
        ),
        control=control,
    )


def bullet(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"- **{name}.**"))


def test_cell_sizes_state_the_detectable_effect_and_mark_the_smoke_cells(tables):
    text = findings(tables, [], [])
    detectable = pg.power_ttest(n=6, power=0.8, alpha=0.05, contrast="two-samples")
    sizes = bullet(text, "Cell sizes")
    assert "Cells hold 6 episodes. At 6 episodes per cell" in sizes
    assert f"|g| ≥ {detectable:.2f} with power 0.8 (alpha 0.05)" in sizes
    assert "Cells below 10 episodes (`hierarchy`, `idle`, `left_first`, `silent`)" in sizes
    assert "| silent | 6 (smoke) | 0.00 / 0.00 | 1.00 / 1.00 | degenerate, no_call |" in text


def test_deadlock_and_degenerate_models_are_named(tables):
    text = findings(tables, [], [])
    assert bullet(text, "Deadlock") == (
        "- **Deadlock.** In some episodes (rate over N): `left_first` (0.67); "
        "never: `hierarchy`, `idle`, `silent`."
    )
    assert "`idle`, `silent` score at least 0.8" in bullet(text, "Degenerate maximum")
    # Without a training run there is nothing to say about training.
    assert "**Training.**" not in text
    assert "**Errors.**" not in text


def test_training_says_whether_any_difference_survives_holm(tables):
    noise = [comparison(f"{RUN}@best_val", 5, 0.33, 0.29, "paper")]
    text = findings(tables, noise, [selection({"last": 3, "best_val": 0})])
    training = bullet(text, "Training")
    assert f"`{RUN}@best_val` N=5: +0.330 (Holm p 0.29), the untrained adapter" in training
    assert "None survives Holm's correction at alpha 0.05" in training
    checkpoints = bullet(text, "Checkpoints chosen")
    assert "`last` step 3, `best_val` step 0 (the untrained adapter" in checkpoints

    # Another variant's rows are not the headline's; a small Holm p is reported as surviving.
    rows = [*noise, comparison(f"{RUN}@last", 5, 0.5, 0.01, "paper")]
    rows.append(comparison(f"{RUN}@last", 10, 0.9, 0.001, "shaped"))
    training = bullet(findings(tables, rows, [selection({"last": 3})]), "Training")
    assert "Differences that survive Holm's correction at alpha 0.05: " in training
    assert training.endswith(f"`{RUN}@last` N=5: +0.500 (Holm p 0.01)")
    assert "N=10" not in training


def test_seeds_state_the_primary_familys_verdict_and_what_it_rules_out(tables):
    pairs = [
        seed_pair("progress@last", "paper@last", -0.08, 0.9) | {"pooled_detectable_diff": 0.31},
        seed_pair("paper@last", "base", 0.12, 0.6) | {"pooled_detectable_diff": 0.44},
        seed_pair("paper@last", "base", 0.9, 0.001, variant="shaped"),
    ]
    seeds = bullet(findings(tables, [], [], pairs), "Seeds")
    assert "(seeds as the unit, `paper` reward, 2 pairs)" in seeds
    assert "No pair survives Holm's correction at alpha 0.05" in seeds
    assert "The largest difference is paper@last vs base at N=5: +0.120" in seeds
    assert "detects differences of 0.31 to 0.44 or more" in seeds

    pairs[0] |= {"diff": -0.5, "p_holm": 0.01}
    seeds = bullet(findings(tables, [], [], pairs), "Seeds")
    assert seeds.endswith(
        "Pairs that survive Holm's correction at alpha 0.05: progress@last vs paper@last N=5: "
        "-0.500 (Holm p 0.01). The largest difference is progress@last vs paper@last at N=5: "
        "-0.500; a two-sample t-test of the pooled episodes (at `analysis.power`'s alpha and "
        "power) detects differences of 0.31 to 0.44 or more, so smaller effects could go unseen."
    )
    # Without seed comparisons (one seed per run) there is no such finding.
    assert "**Seeds.**" not in findings(tables, [], [])


def test_the_positive_control_is_the_first_finding_whether_it_moved_or_not(tables):
    # The untrained model's exact E[r1] is 0.2; every seed gains 0.10 or more.
    moved = control_check([0.36, 0.32, 0.30])
    text = findings(tables, [], [selection({"last": 3})], control=moved)
    first = text.split("\n\n")[2].splitlines()[0]
    assert first == bullet(text, "Positive control")
    assert first.startswith(
        "- **Positive control.** The positive control moved: at N=5 the expected share of seats "
        "whose round-1 decision reaches for the right fork under `control@last`, computed "
        "exactly from each seed's adapter, gained +0.10 to +0.16 over `base`'s 0.20 in all 3 "
        "seeds (threshold +0.10, stated before the run)."
    )

    # One seed short, one without a test episode to name its checkpoint: the study could not
    # move the model as asked.
    stuck = control_check([0.9, 0.28, 0.36], tests=[[2, 2], [2, 2], None])
    text = findings(tables, [], [selection({"last": 3})], control=stuck)
    assert text.split("\n\n")[2].splitlines()[0] == bullet(text, "Positive control")
    assert bullet(text, "Positive control") == (
        "- **Positive control.** The positive control did not move: at N=5 the expected share "
        "of seats whose round-1 decision reaches for the right fork under `control@last`, "
        "computed exactly from each seed's adapter, gained less than the threshold over "
        "`base`'s 0.20 in 2 of 3 seeds (`control-s2@last` +0.08; `control-s3@last` no test "
        "episode to name its checkpoint; threshold +0.10, stated before the run). The study's "
        "training could not move the model the way its reward asks (it may have moved it "
        "elsewhere: the runs' probe KL says how far), so its null results read as 'not "
        "trained enough', not as 'GRPO cannot'."
    )
    # Runs that measured nothing (trainer art) fail, and say so.
    unmeasured = bullet(
        findings(tables, [], [selection({"last": 3})], control=control_check([None] * 3)),
        "Positive control",
    )
    assert "over `base`'s value (not measured) in 3 of 3 seeds (`control-s1@last` not " in (
        unmeasured
    )
    # Without a control check there is no such finding, and the cell sizes come first.
    plain = findings(tables, [], [])
    assert "**Positive control.**" not in plain
    assert plain.split("\n\n")[2].startswith("- **Cell sizes.**")
