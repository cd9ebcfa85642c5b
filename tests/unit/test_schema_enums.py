"""Every enum of the config schema names exactly the values the code has a meaning for."""

from __future__ import annotations

import typing

import pytest
import yaml

from coordgap.analysis.monitors import MONITORS
from coordgap.config.keys import SCHEMA
from coordgap.config.play import ModelKind, ScriptedPolicy
from coordgap.config.training import Trainer, TrainingRunConfig
from coordgap.env.protocols import Protocol
from coordgap.env.table import TieBreak, TurnOrder
from coordgap.env.variants import RewardVariant
from coordgap.evaluation.selection import RANKINGS
from coordgap.policies.factory import BACKENDS
from coordgap.policies.local import DTYPES, Decoding
from coordgap.policies.scripted import SCRIPTED_POLICIES
from coordgap.tracking import TRACKERS

pytestmark = pytest.mark.unit


# The schema key of each enum, and the values the code that reads it handles.
CODE_VALUES: dict[str, set[str]] = {
    "protocol": set(Protocol),
    "turn_order": set(TurnOrder),
    "tie_break": set(TieBreak),
    "kind": set(ModelKind),
    "policies": set(RANKINGS),
    "variants": set(RewardVariant),
    "variant": set(RewardVariant),
    "policy": set(SCRIPTED_POLICIES),
    "dtype": set(DTYPES),
    "decoding": set(typing.get_args(Decoding)),
    "trainer": set(Trainer),
    "loss": set(typing.get_args(typing.get_type_hints(TrainingRunConfig)["loss"])),
    "tracking": {"none", *TRACKERS},
}


def _enums(node: object, key: str = "") -> list[tuple[str, list[str]]]:
    """(the key it constrains, its values) for every enum under ``node``."""
    if isinstance(node, list):
        return [found for item in node for found in _enums(item, key)]
    if not isinstance(node, dict):
        return []
    found = [(key, node["enum"])] if "enum" in node else []
    for name, value in node.items():
        if name == "properties":
            found += [item for prop, sub in value.items() for item in _enums(sub, prop)]
        elif name != "enum":
            found += _enums(value, key)
    return found


def test_each_schema_enum_is_the_set_of_values_the_code_handles():
    enums = _enums(yaml.safe_load(SCHEMA.read_text()))
    assert {key for key, _ in enums} == set(CODE_VALUES), "a schema enum the code does not read"
    for key, values in enums:
        assert set(values) == CODE_VALUES[key], key


def test_every_language_model_kind_has_a_backend_and_scripted_none():
    assert set(BACKENDS) == set(ModelKind) - {ModelKind.SCRIPTED}
    assert set(SCRIPTED_POLICIES) == set(ScriptedPolicy)


def test_the_monitor_thresholds_of_the_schema_are_the_registered_monitors():
    # MonitorConfig.from_dict reads every key but degenerate_reward as a monitor's threshold.
    schema = yaml.safe_load(SCHEMA.read_text())
    monitors = schema["properties"]["analysis"]["properties"]["monitors"]
    shares = {check.share for check in MONITORS.values()}
    assert (
        set(monitors["properties"]) == set(monitors["required"]) == shares | {"degenerate_reward"}
    )
    assert monitors["additionalProperties"] is False
