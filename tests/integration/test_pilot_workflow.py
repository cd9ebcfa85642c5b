"""The pilot through Snakemake: `snakemake pilot` trains each candidate update, then chooses.

The tiny trained study's recipe (``tests.conftest.tiny_training_config``: SmolLM2, 1 group of 2
episodes at N = 3, 2 rounds) as a positive control, with all its rows in one optimizer step at
2 rates, 1 step each.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import polars as pl
import pytest
import yaml

from coordgap.config.training import PilotConfig
from coordgap.env.protocols import TOOLS, Protocol
from coordgap.training.pilot import TRAINED_WITH, Candidate, apply_rule, pilot_table
from tests.conftest import copy_workflow, planned, run, tiny_training_config

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PILOT = {
    "arm": "tiny-control",
    "learning_rates": [1.0e-5, 1.0e-3],
    "grad_accumulation_sequences": ["all"],
    "max_grad_norms": [0.1],
    "steps": 1,
    "max_ratio_log": 0.18,
    "max_probe_kl_per_step": 0.1,
}
OUTPUTS = ("results/pilot/pilot.csv", "results/pilot/pilot.md", "results/pilot/choice.json")
FOLDERS = (
    "pilot-tiny-control-lr1e-05-rowsall-clip0.1",
    "pilot-tiny-control-lr0.001-rowsall-clip0.1",
)


def test_the_pilot_trains_every_candidate_and_chooses_by_its_rule(
    tmp_path: Path, smollm2_dir: Path
) -> None:
    config = tiny_training_config(smollm2_dir)
    project = copy_workflow(tmp_path / "project", config)
    # A study needs no pilot section (the tiny study has none), but the pilot target does.
    missing = run(project, "snakemake", "-n", "pilot", check=False)
    assert missing.returncode != 0
    assert "config key 'pilot' is missing" in missing.stdout + missing.stderr

    # The pilot trains a positive control: the tiny recipe, rewarded for reaching right.
    control = config["training"]["runs"]["tiny-grpo"]
    control = control | {"reward": control["reward"] | {"variant": "control"}}
    config["training"]["runs"]["tiny-control"] = control
    (project / "config" / "config.yaml").write_text(yaml.safe_dump(config | {"pilot": PILOT}))
    trained = run(project, "snakemake", "--cores", "2", "pilot")
    assert planned(trained.stdout + trained.stderr) == {"prepare_model": 1, "pilot": 1}

    pilot = PilotConfig.from_dict(PILOT)
    histories = {}
    for folder, rate in zip(FOLDERS, pilot.learning_rates, strict=True):
        root = project / "results" / "pilot" / folder
        history = pl.read_parquet(root / "history.parquet")
        histories[Candidate(rate, None, 0.1)] = history
        assert history["step"].to_list() == [0]
        # One optimizer step of all the rows, and the control's exact expectation measured.
        assert history["optimizer_steps"].to_list() == [min(1, history["rows"][0])]
        assert history["r1_exact_base"][0] > 0
        assert {"step_0000", "step_0001"} == {p.name for p in (root / "checkpoints").iterdir()}
        assert not (root / ".resume").exists()
    # Every candidate played the same step-0 rollouts, up to their decisions' latencies: the
    # candidates differ by their update alone.
    first, second = (
        pl.read_parquet(project / "results" / "pilot" / f / "rollouts/step_0000.parquet")
        for f in FOLDERS
    )
    assert first.drop("latency_s").equals(second.drop("latency_s"))

    table = pl.read_csv(project / OUTPUTS[0])
    assert table["learning_rate"].to_list() == [1e-5, 1e-3]
    assert table["grad_accumulation_sequences"].to_list() == ["all", "all"]
    assert table["step"].to_list() == [0, 0]
    expected, choice = apply_rule(pilot_table(histories, TOOLS[Protocol.TOOLS6]), pilot)
    assert table.equals(expected)
    record = json.loads((project / OUTPUTS[2]).read_text())
    assert (record["learning_rate"], record["grad_accumulation_sequences"]) == (
        choice.update.learning_rate,
        "all",
    )
    assert record["passed"] is choice.passed
    assert record["recipe"] == "tiny-control"
    markdown = (project / OUTPUTS[1]).read_text()
    assert len([line for line in markdown.splitlines() if line.startswith("|")]) == 2 + 2
    assert "**Chosen: learning rate" in markdown or "**No candidate kept the rule**" in markdown

    # A rerun keeps the candidates trained as they are now, and makes the same table.
    for name in OUTPUTS:
        (project / name).unlink()
    run(project, "snakemake", "--cores", "2", "pilot")
    log = (project / "logs" / "pilot" / "pilot.log").read_text()
    assert all(f"{folder}: trained already" in log for folder in FOLDERS)
    assert all((project / "results" / "pilot" / f / TRAINED_WITH).exists() for f in FOLDERS)
    assert pl.read_csv(project / OUTPUTS[0]).equals(table)
