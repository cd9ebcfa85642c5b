"""The learning-rate pilot through Snakemake: `snakemake pilot` trains each rate, then chooses.

The tiny trained study's recipe (``tests.conftest.tiny_training_config``: SmolLM2, 1 group of 2
episodes at N = 3, 2 rounds) at 2 rates, 1 step each.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import polars as pl
import pytest
import yaml

from coordgap.config.training import PilotConfig
from coordgap.env.protocols import TOOLS, Protocol
from coordgap.training.pilot import TRAINED_WITH, PilotChoice, apply_rule, pilot_table
from tests.conftest import copy_workflow, planned, run, tiny_training_config

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PILOT = {
    "arm": "tiny-grpo",
    "learning_rates": [1.0e-5, 1.0e-3],
    "steps": 1,
    "max_ratio_log": 0.18,
    "max_probe_kl_per_step": 0.1,
}
OUTPUTS = ("results/pilot/pilot.csv", "results/pilot/pilot.md", "results/pilot/choice.json")
FOLDERS = ("pilot-tiny-grpo-lr1e-05", "pilot-tiny-grpo-lr0.001")


def test_the_pilot_trains_every_rate_and_chooses_by_its_rule(
    tmp_path: Path, smollm2_dir: Path
) -> None:
    config = tiny_training_config(smollm2_dir)
    project = copy_workflow(tmp_path / "project", config)
    # A study needs no pilot section (the tiny study has none), but the pilot target does.
    missing = run(project, "snakemake", "-n", "pilot", check=False)
    assert missing.returncode != 0
    assert "config key 'pilot' is missing" in missing.stdout + missing.stderr

    (project / "config" / "config.yaml").write_text(yaml.safe_dump(config | {"pilot": PILOT}))
    trained = run(project, "snakemake", "--cores", "2", "pilot")
    assert planned(trained.stdout + trained.stderr) == {"prepare_model": 1, "pilot": 1}

    pilot = PilotConfig.from_dict(PILOT)
    histories = {}
    for folder, rate in zip(FOLDERS, pilot.learning_rates, strict=True):
        root = project / "results" / "pilot" / folder
        histories[rate] = pl.read_parquet(root / "history.parquet")
        assert histories[rate]["step"].to_list() == [0]
        assert {"step_0000", "step_0001"} == {p.name for p in (root / "checkpoints").iterdir()}
        assert not (root / ".resume").exists()
    # Every rate played the same step-0 rollouts, up to their decisions' latencies: the rates
    # differ by the learning rate alone.
    first, second = (
        pl.read_parquet(project / "results" / "pilot" / f / "rollouts/step_0000.parquet")
        for f in FOLDERS
    )
    assert first.drop("latency_s").equals(second.drop("latency_s"))

    table = pl.read_csv(project / OUTPUTS[0])
    assert table["learning_rate"].to_list() == [1e-5, 1e-3]
    assert table["step"].to_list() == [0, 0]
    expected, choice = apply_rule(pilot_table(histories, TOOLS[Protocol.TOOLS6]), pilot)
    assert table.equals(expected)
    # At 1e-3 one update moves the probe set's mu far past the bound (KL about 1.4 against
    # 0.1, its rows' |log ratio| about 2.3 against 0.18); at 1e-5 both stay far within.
    assert choice == PilotChoice(1e-5, passed=True)
    assert table["rate_passes"].to_list() == [True, False]
    record = json.loads((project / OUTPUTS[2]).read_text())
    assert (record["learning_rate"], record["passed"]) == (1e-5, True)
    assert record["recipe"] == "tiny-grpo"
    markdown = (project / OUTPUTS[1]).read_text()
    assert len([line for line in markdown.splitlines() if line.startswith("|")]) == 2 + 2
    assert "**Chosen: 1e-05**" in markdown

    # A rerun keeps the rates trained as they are now, and makes the same table.
    for name in OUTPUTS:
        (project / name).unlink()
    run(project, "snakemake", "--cores", "2", "pilot")
    log = (project / "logs" / "pilot" / "pilot.log").read_text()
    assert all(f"{folder}: trained already" in log for folder in FOLDERS)
    assert all((project / "results" / "pilot" / f / TRAINED_WITH).exists() for f in FOLDERS)
    assert pl.read_csv(project / OUTPUTS[0]).equals(table)
