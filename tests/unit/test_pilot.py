"""The pilot's config and its rule, on hand-made histories (coordgap.training.pilot).

The pilot's real run through Snakemake is ``tests/integration/test_pilot_workflow.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import polars as pl
import pytest
from snakemake.exceptions import WorkflowError

from coordgap.config.checks import check_cross_keys
from coordgap.config.keys import ConfigError, check_schema
from coordgap.config.overlays import resolve
from coordgap.config.training import (
    PilotConfig,
    TrainingRunConfig,
    pilot_recipe,
    pilot_section,
)
from coordgap.env.protocols import TOOLS, Protocol, Tool
from coordgap.training.history import HISTORY_SCHEMA
from coordgap.training.pilot import (
    Candidate,
    apply_rule,
    candidates,
    choice_record,
    pilot_markdown,
    pilot_runs,
    pilot_table,
)
from tests.conftest import ROOT

pytestmark = pytest.mark.unit

STUDY = resolve([ROOT / "config" / "study_cpu.yaml"]).config
# Bounds that binary floats hold exactly, so that a value at its bound is exactly on it.
PILOT = PilotConfig(
    arm="control",
    learning_rates=(1e-5, 1e-4, 1e-3),
    grad_accumulation_sequences=(None,),
    max_grad_norms=(0.1,),
    steps=2,
    max_ratio_log=0.25,
    max_probe_kl_per_step=0.125,
)
SIX = TOOLS[Protocol.TOOLS6]


def _checked(**pilot: object) -> None:
    """The study with these pilot keys changed, checked as the workflow checks a config."""
    config = copy.deepcopy(STUDY)
    config["pilot"].update(pilot)
    check_schema(copy.deepcopy(config))
    check_cross_keys(config)


def test_the_study_config_pilots_its_control_arm_from_its_first_seed() -> None:
    _checked()
    assert pilot_recipe(STUDY) == "control-s1"
    pilot = PilotConfig.from_dict(pilot_section(STUDY))
    recipe = TrainingRunConfig.from_dict("control-s1", STUDY["training"]["runs"]["control-s1"])
    runs = pilot_runs(pilot, recipe)
    assert len(runs) == len(candidates(pilot))
    # Only the update, the steps and ART's warm-up change: same name and seed, so the same
    # step-0 rollouts.
    for folder, (update, run) in runs.items():
        assert folder == (
            f"pilot-control-lr{update.learning_rate:g}-rows{update.rows}"
            f"-clip{update.max_grad_norm:g}"
        )
        assert run.settings() == recipe.settings() | {
            "learning_rate": update.learning_rate,
            "steps": pilot.steps,
            "grad_accumulation_sequences": update.grad_accumulation_sequences,
            "optimizer": recipe.settings()["optimizer"] | {"max_grad_norm": update.max_grad_norm},
            "warmup": recipe.warmup and update.grad_accumulation_sequences == 1,
        }


def test_the_candidates_are_every_rate_row_count_and_clip() -> None:
    pilot = PilotConfig.from_dict(
        pilot_section(STUDY)
        | {
            "learning_rates": [1e-5, 1e-4],
            "grad_accumulation_sequences": [1, "all"],
            "max_grad_norms": [0.1, 1.0],
        }
    )
    assert [(c.rows, c.max_grad_norm, c.learning_rate) for c in candidates(pilot)] == [
        ("1", 0.1, 1e-5),
        ("1", 0.1, 1e-4),
        ("1", 1.0, 1e-5),
        ("1", 1.0, 1e-4),
        ("all", 0.1, 1e-5),
        ("all", 0.1, 1e-4),
        ("all", 1.0, 1e-5),
        ("all", 1.0, 1e-4),
    ]
    recipe = TrainingRunConfig.from_dict("control-s1", STUDY["training"]["runs"]["control-s1"])
    # ART's warm-up stays with its one-row loop only (the config refuses it beside more rows).
    recipe = dataclasses.replace(recipe, warmup=True)
    assert [run.warmup for _, run in pilot_runs(pilot, recipe).values()] == [True] * 4 + [False] * 4


@pytest.mark.parametrize(
    ("pilot", "error", "message"),
    [
        ({"arm": "shaped"}, ConfigError, r"'pilot\.arm': 'shaped' is not an arm"),
        # A seed's run is not an arm: the arm is named, its first seed is the recipe.
        ({"arm": "paper-s2"}, ConfigError, r"'pilot\.arm': 'paper-s2' is not an arm"),
        ({"learning_rates": [1e-4, 1e-5]}, ConfigError, r"'pilot\.learning_rates': rates must"),
        ({"learning_rates": [1e-5, 1e-5]}, ConfigError, r"'pilot\.learning_rates': rates must"),
        ({"learning_rates": [0.0, 1e-5]}, WorkflowError, r"instance\['pilot'\]\['learning_rates"),
        ({"learning_rates": [-1e-5]}, WorkflowError, r"instance\['pilot'\]\['learning_rates'\]"),
        ({"learning_rates": []}, WorkflowError, r"instance\['pilot'\]\['learning_rates'\]"),
        ({"steps": 0}, WorkflowError, r"instance\['pilot'\]\['steps'\]"),
        ({"steps": 1.5}, WorkflowError, r"instance\['pilot'\]\['steps'\]"),
        ({"max_ratio_log": 0}, WorkflowError, r"instance\['pilot'\]\['max_ratio_log'\]"),
        ({"max_probe_kl_per_step": -0.1}, WorkflowError, r"\['max_probe_kl_per_step'\]"),
        ({"max_ratio_log": "log(1.2)"}, WorkflowError, r"instance\['pilot'\]\['max_ratio_log'\]"),
        ({"rate": 1e-4}, WorkflowError, r"'rate' was unexpected"),
        ({"grad_accumulation_sequences": [0]}, WorkflowError, r"\['grad_accumulation_seq"),
        ({"grad_accumulation_sequences": []}, WorkflowError, r"\['grad_accumulation_seq"),
        ({"max_grad_norms": [0.0]}, WorkflowError, r"instance\['pilot'\]\['max_grad_norms'\]"),
        ({"max_grad_norms": [0.1, 0.1]}, WorkflowError, r"\['pilot'\]\['max_grad_norms'\]"),
        # The rule asks the control's exact expected reward to rise: only a control arm has it.
        ({"arm": "paper"}, ConfigError, r"'pilot\.arm': 'paper' is no positive-control arm"),
    ],
)
def test_a_bad_pilot_is_named_before_anything_runs(pilot, error, message) -> None:
    with pytest.raises(error, match=message):
        _checked(**pilot)


def test_the_pilot_needs_trainer_torch_and_training_scenarios_of_its_own() -> None:
    config = copy.deepcopy(STUDY)
    # As ART's LocalBackend runs: its warm-up, one row per optimizer step.
    config["training"]["runs"]["control-s1"] |= {
        "trainer": "art",
        "warmup": True,
        "grad_accumulation_sequences": 1,
    }
    with pytest.raises(ConfigError, match=r"'pilot\.arm': its run 'control-s1' uses trainer art"):
        check_cross_keys(config)
    # Its steps play training scenarios: the training range covers them, so that they never
    # reach the ids of another split (here the test split's, placed just after the runs').
    config = copy.deepcopy(STUDY)
    config["scenarios"]["test"] = config["scenarios"]["train"] + 10
    check_cross_keys(copy.deepcopy(config))  # the study's runs use 2 steps x 2 groups
    config["pilot"]["steps"] = 6
    with pytest.raises(ConfigError, match=r"'scenarios\.train' and 'scenarios\.test'"):
        check_cross_keys(config)


def test_asking_for_the_pilot_without_its_section_names_the_key() -> None:
    config = {k: v for k, v in STUDY.items() if k != "pilot"}
    check_cross_keys(copy.deepcopy(config))  # optional for a study
    with pytest.raises(ConfigError, match=r"config key 'pilot' is missing"):
        pilot_recipe(config)


def _history(steps: list[dict[str, float]]) -> pl.DataFrame:
    """A candidate's history: one row per step, the given columns over a plausible step."""
    rows = []
    for step, values in enumerate(steps):
        row = dict.fromkeys(HISTORY_SCHEMA)
        row |= {"run": "control-s1", "step": step, "n": 5, "rows": 30, "clipped_share": 1.0}
        row |= {"optimizer_steps": 1, "r1_exact_base": 0.25, "ascent_cosine": 0.4}
        row |= {f"actions_{tool}": 0.0 for tool in Tool}
        row |= {"actions_pick_up_left": 0.75, "actions_pick_up_right": 0.25}
        row |= {"probe_kl_acting": values["probe_kl"], "seconds_update": 300.0}
        rows.append(row | values)
    return pl.DataFrame(rows, schema=HISTORY_SCHEMA)


def _judged(*per_candidate: list[dict[str, float]], pilot: PilotConfig = PILOT):
    table = pilot_table(
        {
            update: _history(steps)
            for update, steps in zip(candidates(pilot), per_candidate, strict=True)
        },
        SIX,
    )
    return apply_rule(table, pilot)


KEEPS = [
    {"probe_kl": 0.01, "ratio_log_mean": 0.05, "r1_exact": 0.30},
    {"probe_kl": 0.05, "ratio_log_mean": 0.1, "r1_exact": 0.35},
]
# Step 1's KL is its own bound (2 updates x 0.125) and its ratio the ratio bound: both kept;
# the control rises the most of these.
AT_BOUNDS = [
    {"probe_kl": 0.1, "ratio_log_mean": 0.2, "r1_exact": 0.40},
    {"probe_kl": 0.25, "ratio_log_mean": 0.25, "r1_exact": 0.55},
]
# A KL within the whole pilot's bound (0.25) but not within its step's (0.125): step 0 fails.
FAST = [
    {"probe_kl": 0.2, "ratio_log_mean": 0.1, "r1_exact": 0.60},
    {"probe_kl": 0.24, "ratio_log_mean": 0.1, "r1_exact": 0.70},
]
# Later rows off the sampling policy: the second step's mean |log ratio| above the bound.
OFF_POLICY = [
    {"probe_kl": 0.01, "ratio_log_mean": 0.1, "r1_exact": 0.30},
    {"probe_kl": 0.1, "ratio_log_mean": 0.3, "r1_exact": 0.50},
]
# The policy moves within both bounds, but the control falls with the first update: the
# update does not follow its reward.
AGAINST = [
    {"probe_kl": 0.01, "ratio_log_mean": 0.05, "r1_exact": 0.20},
    {"probe_kl": 0.05, "ratio_log_mean": 0.1, "r1_exact": 0.45},
]


def test_the_table_has_a_row_per_candidate_and_step_with_what_the_rule_reads() -> None:
    judged, _ = _judged(KEEPS, KEEPS, KEEPS)
    assert judged.height == 3 * 2
    assert judged.columns == [
        "learning_rate",
        "grad_accumulation_sequences",
        "max_grad_norm",
        "step",
        "probe_kl",
        "probe_kl_acting",
        "ratio_log_mean",
        "clipped_share",
        "r1_exact",
        "ascent_cosine",
        "r1_exact_base",
        *(f"actions_{tool}" for tool in SIX),
        "seconds_update",
        "rows",
        "optimizer_steps",
        "probe_kl_limit",
        "r1_before",
        "step_passes",
        "candidate_passes",
    ]
    assert judged["probe_kl_limit"].to_list() == [0.125, 0.25] * 3
    assert judged["r1_before"].to_list() == [0.25, 0.30] * 3
    assert judged["learning_rate"].to_list() == [1e-5, 1e-5, 1e-4, 1e-4, 1e-3, 1e-3]
    assert set(judged["grad_accumulation_sequences"]) == {"all"}


@pytest.mark.parametrize(
    ("steps", "chosen", "passed"),
    [
        # The candidate that kept the rule and raised the control most, a value on its bound
        # keeping it.
        ((KEEPS, AT_BOUNDS, FAST), 1e-4, True),
        ((AT_BOUNDS, OFF_POLICY, KEEPS), 1e-5, True),
        # Failing any bound at any step fails the candidate, however far its control rose.
        ((KEEPS, FAST, OFF_POLICY), 1e-5, True),
        # A control that fell with an update fails it.
        ((AGAINST, KEEPS, FAST), 1e-4, True),
        # None keeps it: the first, marked as not passed.
        ((FAST, OFF_POLICY, AGAINST), 1e-5, False),
    ],
)
def test_the_rule_chooses_the_candidate_that_raised_the_control_most_within_the_bounds(
    steps, chosen, passed
) -> None:
    judged, choice = _judged(*steps)
    assert choice.update == Candidate(chosen, None, 0.1)
    assert choice.passed is passed
    verdicts = judged.group_by("learning_rate", maintain_order=True).agg(
        pl.col("candidate_passes").all()
    )
    expected = [candidate not in (FAST, OFF_POLICY, AGAINST) for candidate in steps]
    assert verdicts["candidate_passes"].to_list() == expected


def test_a_step_that_trained_nothing_keeps_the_ratio_bound_and_a_missing_value_fails() -> None:
    # Nothing trained at step 0 moves nothing, so the control cannot rise: it fails.
    untrained = [{"probe_kl": 0.0, "ratio_log_mean": math.nan, "rows": 0, "r1_exact": 0.25}]
    unmeasured = [KEEPS[0], {"probe_kl": None, "ratio_log_mean": 0.1, "r1_exact": 0.4}]
    unscored = [KEEPS[0], {"probe_kl": 0.05, "ratio_log_mean": 0.1, "r1_exact": None}]
    judged, choice = _judged([*untrained, KEEPS[1]], unmeasured, unscored)
    assert judged["step_passes"].to_list() == [False, True, True, False, True, False]
    assert not choice.passed


def test_the_markdown_and_the_record_state_the_rule_and_the_choice() -> None:
    judged, choice = _judged(KEEPS, AT_BOUNDS, FAST)
    text = pilot_markdown(judged, choice, PILOT)
    assert (
        "**Chosen: learning rate 0.0001, grad_accumulation_sequences all, max_grad_norm 0.1**"
        in text
    )
    assert "at most 0.25, after its update k = step + 1" in text
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert len(lines) == 2 + judged.height
    assert lines[2].startswith("| 1e-05 | all | 0.1 | 0 | 0.01 | 0.01 | 0.05 | 1 | 0.3 | 0.4 |")
    # The last candidate's second step keeps its own bounds, but it failed at its first.
    assert lines[-1].endswith("| 0.6 | yes | no |")
    _, none = _judged(FAST, FAST, FAST)
    assert "**No candidate kept the rule**: the first, learning rate 1e-05" in pilot_markdown(
        judged, none, PILOT
    )
    record = choice_record(choice, PILOT, "control-s1")
    assert record["learning_rate"] == 1e-4
    assert record["grad_accumulation_sequences"] == "all"
    assert record["max_grad_norm"] == 0.1
    assert record["passed"] is True
    assert record["recipe"] == "control-s1"
    assert record["pilot"]["max_probe_kl_per_step"] == 0.125
    assert record["pilot"]["grad_accumulation_sequences"] == ["all"]
