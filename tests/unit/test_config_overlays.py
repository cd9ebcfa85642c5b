"""Study configs as overlays on a base (coordgap.config.overlays), resolved before validation."""

from __future__ import annotations

import copy

import pytest
import yaml
from snakemake.exceptions import WorkflowError

from coordgap.cli import main
from coordgap.config.checks import check_cross_keys
from coordgap.config.keys import SCHEMA, ConfigError, check_schema
from coordgap.config.overlays import merge, resolve
from coordgap.config.training import (
    TrainingRunConfig,
    arms,
    checkpoint_families,
    compared_arms,
    compared_checkpoints,
)
from tests.conftest import ROOT, changed

pytestmark = pytest.mark.unit

BASE = {
    "seed": 1,
    "models": {"a": {"kind": "scripted", "policy": "random"}, "b": {"kind": "local"}},
    "tracking": "none",
}


def _write(folder, name: str, keys: dict) -> str:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(keys, sort_keys=False))
    return str(path)


def test_mappings_merge_key_by_key_and_the_rest_replaces():
    overlay = {"models": {"a": {"policy": "silent"}, "c": {"kind": "scripted"}}, "tracking": "w"}
    merged = merge(BASE, overlay)
    assert merged == {
        "seed": 1,
        "models": {
            "a": {"kind": "scripted", "policy": "silent"},
            "b": {"kind": "local"},
            "c": {"kind": "scripted"},
        },
        "tracking": "w",
    }
    # The base's keys keep their order, a new one comes after; neither input changes.
    assert list(merged["models"]) == ["a", "b", "c"]
    assert BASE["models"]["a"]["policy"] == "random"
    assert "c" not in BASE["models"]


def test_a_replaced_mapping_drops_what_the_base_had():
    merged = merge(BASE, {"models": {"c": {"kind": "scripted"}}}, replace=["models"])
    assert merged["models"] == {"c": {"kind": "scripted"}}
    # A dotted key names a nested mapping; a name holding a dot is matched whole.
    base = {"models": {"qwen3-0.6b": {"serve": {"a": 1, "b": 2}}}}
    overlay = {"models": {"qwen3-0.6b": {"serve": {"a": 3}}}}
    assert merge(base, overlay, replace=["models.qwen3-0.6b.serve"]) == overlay


def test_replacing_a_key_the_overlay_does_not_set_is_refused():
    with pytest.raises(ConfigError, match=r"'replace' lists 'training\.runs', which this file"):
        merge(BASE, {"models": {}}, replace=["training.runs"])


def test_files_resolve_through_their_base_chain_then_in_order_then_overrides(tmp_path):
    _write(tmp_path, "default.yaml", BASE)
    # A base is relative to the file naming it, not to where the command runs.
    _write(tmp_path, "studies/mid.yaml", {"base": "../default.yaml", "seed": 2, "tracking": "w"})
    top = _write(tmp_path, "studies/top.yaml", {"base": "mid.yaml", "seed": 3})
    tweak = _write(tmp_path, "tweak.yaml", {"replace": ["models"], "models": {"c": {}}})
    resolved = resolve([top, tweak], {"tracking": "mlflow"})
    assert resolved.config == {"seed": 3, "models": {"c": {}}, "tracking": "mlflow"}
    assert [path.name for path in resolved.files] == [
        "default.yaml",
        "mid.yaml",
        "top.yaml",
        "tweak.yaml",
    ]


def test_a_missing_base_is_named_with_the_file_that_names_it(tmp_path):
    study = _write(tmp_path, "study.yaml", {"base": "gone.yaml", "seed": 2})
    with pytest.raises(ConfigError, match=r"study\.yaml: config key 'base': no such file .*gone"):
        resolve([study])
    with pytest.raises(ConfigError, match=r"nothing\.yaml: no such config file"):
        resolve([tmp_path / "nothing.yaml"])


def test_a_base_cycle_is_refused_naming_its_files(tmp_path):
    _write(tmp_path, "a.yaml", {"base": "b.yaml", "seed": 1})
    b = _write(tmp_path, "b.yaml", {"base": "a.yaml", "seed": 2})
    with pytest.raises(ConfigError, match=r"a\.yaml: config key 'base' makes a cycle: .*b\.yaml"):
        resolve([b])
    itself = _write(tmp_path, "self.yaml", {"base": "self.yaml"})
    with pytest.raises(ConfigError, match="makes a cycle"):
        resolve([itself])


def test_only_the_first_file_names_a_base(tmp_path):
    first = _write(tmp_path, "first.yaml", BASE)
    second = _write(tmp_path, "second.yaml", {"base": "first.yaml", "seed": 2})
    with pytest.raises(ConfigError, match=r"second\.yaml: config key 'base': only the first"):
        resolve([first, second])


def test_a_bad_replace_is_named_with_its_file(tmp_path):
    _write(tmp_path, "default.yaml", BASE)
    study = _write(tmp_path, "s.yaml", {"base": "default.yaml", "replace": ["model"], "models": {}})
    with pytest.raises(ConfigError, match=r"s\.yaml: config key 'replace' lists 'model'"):
        resolve([study])
    study = _write(tmp_path, "s.yaml", {"base": "default.yaml", "replace": "models"})
    with pytest.raises(ConfigError, match=r"s\.yaml: config key 'replace' is a list"):
        resolve([study])


def test_an_unknown_key_of_an_overlay_is_named_by_the_schema(tmp_path):
    study = _write(
        tmp_path,
        "study.yaml",
        {"base": str(ROOT / "config" / "config.yaml"), "evaluation": {"evry": 1}},
    )
    config = resolve([study]).config
    with pytest.raises(WorkflowError, match="evry"):
        check_schema(copy.deepcopy(config))


def test_an_unknown_top_level_key_is_named_with_its_file_and_the_known_keys(tmp_path):
    study = _write(tmp_path, "study.yaml", {"base": str(ROOT / "config" / "config.yaml"), "sed": 1})
    with pytest.raises(ConfigError) as raised:
        resolve([study])
    message = str(raised.value)
    assert message.startswith(f"{study}: config key 'sed' is unknown")
    assert "seed, scenarios, environment" in message
    # One line, not the schema's and config's dump.
    assert "\n" not in message
    with pytest.raises(ConfigError, match="--config: config key 'sed' is unknown"):
        resolve([str(ROOT / "config" / "config.yaml")], {"sed": 1})


def test_coordgap_config_writes_the_resolved_study_with_its_overrides(tmp_path):
    study = ROOT / "config" / "interventions.yaml"
    out = tmp_path / "resolved.yaml"
    argv = ["config", "--root", str(ROOT), "--configfile", str(study), "--config", "seed=7"]
    assert main([*argv, "--out", str(out)]) == 0
    written = yaml.safe_load(out.read_text())
    assert written == resolve([study], {"seed": 7}).config
    assert written["seed"] == 7
    assert "base" not in written
    # The written file is a complete config: resolved on its own it is itself.
    assert resolve([out]).config == written


def test_an_override_that_breaks_the_config_is_named_before_anything_runs(tmp_path, capsys):
    argv = ["--root", str(ROOT), "--configfile", str(ROOT / "config" / "config.yaml")]
    for command in ("config", "plan"):
        assert main([command, *argv, "--config", "seed=-1"]) == 1
        assert "seed" in capsys.readouterr().err


def test_a_model_entry_gets_the_defaults_of_its_kind_and_keeps_its_own(tmp_path):
    """A short entry means its kind's schema defaults, its own keys win, serve: too."""
    study = _write(
        tmp_path,
        "study.yaml",
        {
            "base": str(ROOT / "config" / "config.yaml"),
            "models": {
                "mine": {"kind": "openai", "model": "m", "api_key_env": "K", "max_tokens": 99},
                "served": {
                    "kind": "openai",
                    "model": "s",
                    "api_key_env": None,
                    "serve": {"command": ["server", "{port}"]},
                },
            },
        },
    )
    config = resolve([study]).config
    check_schema(copy.deepcopy(config))
    openai = yaml.safe_load(SCHEMA.read_text())["$defs"]["openai_model"]["properties"]
    mine = config["models"]["mine"]
    assert list(mine)[:4] == ["kind", "model", "api_key_env", "max_tokens"]
    assert mine["max_tokens"] == 99
    assert set(mine) == set(openai)
    for key, node in openai.items():
        if key not in {"kind", "model", "api_key_env", "max_tokens"}:
            assert mine[key] == node["default"], key
    serve = config["models"]["served"]["serve"]
    assert serve["command"] == ["server", "{port}"]
    assert set(serve) == set(openai["serve"]["properties"])
    assert serve["health"] == openai["serve"]["properties"]["health"]["default"]
    # A complete entry is left exactly as it is: the default study's local model.
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    assert config["models"]["smollm2-135m"] == default["models"]["smollm2-135m"]


def test_a_model_entry_without_a_required_key_is_named_by_the_schema(tmp_path):
    study = _write(
        tmp_path,
        "study.yaml",
        {"base": str(ROOT / "config" / "config.yaml"), "models": {"mine": {"kind": "openai"}}},
    )
    with pytest.raises(WorkflowError, match="'model' is a required property"):
        check_schema(resolve([study]).config)


def _seeded_study(tmp_path, **keys) -> str:
    """The default study whose run smollm2-grpo carries ``keys`` in place of its seed."""
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    run = {k: v for k, v in default["training"]["runs"]["smollm2-grpo"].items() if k != "seed"}
    return _write(
        tmp_path,
        "study.yaml",
        {
            "base": str(ROOT / "config" / "config.yaml"),
            "replace": ["training.runs"],
            "training": {"runs": {"smollm2-grpo": run | keys}},
        },
    )


def test_a_run_with_seeds_becomes_one_run_per_seed_of_its_arm(tmp_path):
    config = resolve([_seeded_study(tmp_path, seeds=[3, 1, 2])]).config
    check_schema(copy.deepcopy(config))
    check_cross_keys(config)
    runs = config["training"]["runs"]
    assert list(runs) == ["smollm2-grpo-s3", "smollm2-grpo-s1", "smollm2-grpo-s2"]
    assert [runs[run]["seed"] for run in runs] == [3, 1, 2]
    assert {runs[run]["arm"] for run in runs} == {"smollm2-grpo"}
    assert all("seeds" not in entry for entry in runs.values())
    assert arms(config) == {"smollm2-grpo": list(runs)}
    # A run with a seed is an arm of one under its own name.
    single = resolve([ROOT / "config" / "config.yaml"]).config
    assert arms(single) == {"smollm2-grpo": ["smollm2-grpo"]}


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"seeds": [1, 1]}, "a list of distinct non-negative integers"),
        ({"seeds": []}, "a list of distinct non-negative integers"),
        ({"seeds": "1,2"}, "a list of distinct non-negative integers"),
        ({"seeds": [1, 2], "seed": 1}, "give seed or seeds, not both"),
        ({"seeds": [[1], [2]]}, "a list of distinct non-negative integers"),
    ],
)
def test_bad_seeds_are_named_before_anything_runs(tmp_path, keys, message):
    with pytest.raises(ConfigError, match=rf"'training\.runs\.smollm2-grpo\.seeds': {message}"):
        resolve([_seeded_study(tmp_path, **keys)])


def test_a_seeds_run_may_not_take_the_name_of_another_run(tmp_path):
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    run = default["training"]["runs"]["smollm2-grpo"]
    seeded = {k: v for k, v in run.items() if k != "seed"} | {"seeds": [1]}
    study = _write(
        tmp_path,
        "study.yaml",
        {
            "base": str(ROOT / "config" / "config.yaml"),
            "training": {"runs": {"a": seeded, "a-s1": run}},
        },
    )
    with pytest.raises(ConfigError, match=r"its run 'a-s1' is a run's name already"):
        resolve([study])


def test_the_runs_of_one_arm_train_one_base_model(tmp_path):
    study = _seeded_study(tmp_path, seeds=[1])
    config = resolve([study]).config
    other = copy.deepcopy(config["training"]["runs"]["smollm2-grpo-s1"])
    config["models"]["other"] = config["models"]["smollm2-135m"]
    config["training"]["runs"]["mine"] = other | {"base_model": "other", "arm": "smollm2-grpo"}
    with pytest.raises(ConfigError, match=r"'training\.runs\.mine\.arm': the runs of arm"):
        check_cross_keys(config)


def _control_study(tmp_path, control: dict | None = None, **analysis) -> dict:
    """The default study beside a positive-control arm of two seeds, trained on the control
    reward, with the control check ``control`` (the valid one by default) and ``analysis``."""
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    recipe = {k: v for k, v in default["training"]["runs"]["smollm2-grpo"].items() if k != "seed"}
    arm = recipe | {"seeds": [1, 2], "reward": {**recipe["reward"], "variant": "control"}}
    check = {"run": "control", "model": "smollm2-135m", "policy": "last", "n": 5, "min_gain": 0.1}
    study = _write(
        tmp_path,
        "study.yaml",
        {
            "base": str(ROOT / "config" / "config.yaml"),
            "training": {"runs": {"control": arm}},
            "analysis": {"control": check | (control or {}), **analysis},
        },
    )
    return resolve([study]).config


def test_a_control_arm_is_checked_and_enters_no_comparison(tmp_path):
    config = _control_study(tmp_path)
    check_schema(copy.deepcopy(config))
    check_cross_keys(config)
    assert arms(config)["control"] == ["control-s1", "control-s2"]
    assert list(compared_arms(config)) == ["smollm2-grpo"]
    assert all(run == "smollm2-grpo" for run, _ in compared_checkpoints(config).values())
    assert all(not family.startswith("control") for family in checkpoint_families(config))
    # Without a control section nothing is checked, and the default has none.
    assert resolve([ROOT / "config" / "config.yaml"]).config["analysis"]["control"] is None


@pytest.mark.parametrize(
    ("variants", "message"),
    [
        (["control", "paper"], r"'reward\.variants\[0\]': 'control' cannot be the headline"),
        (["paper", "control"], r"'reward\.variants\[1\]': 'control' cannot be a coordination"),
    ],
)
def test_the_control_reward_is_never_a_coordination_reward(tmp_path, variants, message):
    config = _control_study(tmp_path)
    config["reward"]["variants"] = variants
    check_schema(copy.deepcopy(config))
    with pytest.raises(ConfigError, match=message):
        check_cross_keys(config)


@pytest.mark.parametrize(
    ("control", "message"),
    [
        ({"run": "placebo"}, r"'analysis\.control\.run': unknown training run 'placebo'"),
        ({"run": "smollm2-grpo"}, r"'analysis\.control\.run': 'smollm2-grpo' trains on the"),
        ({"model": "random"}, r"'analysis\.control\.model': 'random' is not the model"),
        ({"policy": "lcb_val"}, r"'analysis\.control\.policy': 'lcb_val' is not in evaluation"),
        ({"n": 7}, r"'analysis\.control\.n': 7 is not in experiment\.sizes"),
        ({"n": 10}, r"'analysis\.control\.n': 'control' trains at N in \[5\], not at 10 only"),
    ],
)
def test_a_bad_control_check_is_named_before_anything_runs(tmp_path, control, message):
    config = _control_study(tmp_path, control)
    check_schema(copy.deepcopy(config))
    with pytest.raises(ConfigError, match=message):
        check_cross_keys(config)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            ("training", "runs", "control-s1", "trainer"),
            "art",
            r"'analysis\.control\.run': 'control' uses trainer art, which cannot score",
        ),
        (
            ("environment", "turn_order"),
            "sequential",
            r"'analysis\.control': the check needs environment\.turn_order: simultaneous",
        ),
    ],
)
def test_a_control_without_an_exact_expectation_is_refused(tmp_path, key, value, message):
    """The check reads the exact expected reward that trainer torch records under
    simultaneous turns, and nothing else."""
    config = _control_study(tmp_path)
    *parents, last = key
    section = config
    for parent in parents:
        section = section[parent]
    section[last] = value
    check_schema(copy.deepcopy(config))
    with pytest.raises(ConfigError, match=message):
        check_cross_keys(config)


@pytest.mark.parametrize("min_gain", [0, -0.1, 1.5, "ten points"])
def test_a_bad_control_threshold_is_named_by_the_schema(tmp_path, min_gain):
    config = _control_study(tmp_path, {"min_gain": min_gain})
    with pytest.raises(WorkflowError, match=r"\['analysis'\]\['control'\]\['min_gain'\]"):
        check_schema(config)


@pytest.mark.parametrize(
    ("analysis", "message"),
    [
        (
            {"comparisons": [["control-s1@last", "smollm2-135m"]]},
            r"'analysis\.comparisons\[0\]\[0\]': 'control-s1@last' is a control run's",
        ),
        (
            {"seed_comparisons": [["control@last", "smollm2-135m"]]},
            r"'analysis\.seed_comparisons\[0\]\[0\]': 'control@last' is a control arm",
        ),
    ],
)
def test_a_comparison_naming_the_control_arm_is_refused(tmp_path, analysis, message):
    config = _control_study(tmp_path, **analysis)
    with pytest.raises(ConfigError, match=message):
        check_cross_keys(config)


def test_accumulated_rows_are_a_setting_of_the_torch_trainer_without_arts_warm_up():
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    key = "training/runs/smollm2-grpo"
    for rows, parsed in (("all", None), (8, 8)):
        config = changed(default, f"{key}/grad_accumulation_sequences", rows)
        config = changed(config, f"{key}/warmup", False)
        check_schema(copy.deepcopy(config))
        check_cross_keys(config)
        entry = config["training"]["runs"]["smollm2-grpo"]
        assert TrainingRunConfig.from_dict("r", entry).grad_accumulation_sequences == parsed
    # ART's warm-up is its one-step-per-row loop's; accumulating is its Megatron loop's.
    with pytest.raises(ConfigError, match=r"'training\.runs\.smollm2-grpo\.warmup': grad_acc"):
        check_cross_keys(changed(default, f"{key}/grad_accumulation_sequences", "all"))
    for bad in (0, "every", 1.5):
        with pytest.raises(WorkflowError, match="grad_accumulation_sequences"):
            check_schema(changed(default, f"{key}/grad_accumulation_sequences", bad))
