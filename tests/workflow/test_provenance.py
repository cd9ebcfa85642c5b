"""Every output folder carries its provenance; the report refuses outputs of another config."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import run

pytestmark = [pytest.mark.workflow, pytest.mark.slow]


def test_the_report_refuses_outputs_that_another_config_made(tiny_workflow, tiny_config):
    tiny_config["experiment"]["sizes"] = [3]
    config_path = tiny_workflow / "config" / "config.yaml"
    config_path.write_text(yaml.safe_dump(tiny_config))
    run(tiny_workflow, "snakemake", "--cores", "2", "all")
    for model in tiny_config["models"]:
        record = json.loads(
            (tiny_workflow / "results" / "episodes" / model / "n3.provenance.json").read_text()
        )
        assert (record["kind"], record["name"], record["model"]["kind"]) == (
            "episodes",
            model,
            "scripted",
        )
    assert "| Output records | 3, each made with the current config's sections |" in (
        (tiny_workflow / "results" / "report.md").read_text()
    )

    # The outputs stay, the config changes under them (as after restoring outputs of another
    # experiment), and Snakemake is told they are current: the report must not mix them in.
    tiny_config["models"]["silent"] = {"kind": "scripted", "policy": "think_only"}
    config_path.write_text(yaml.safe_dump(tiny_config))
    run(tiny_workflow, "snakemake", "--cores", "1", "--touch", "all")
    result = run(
        tiny_workflow, "snakemake", "--cores", "1", "--forcerun", "write_report", check=False
    )
    log = (tiny_workflow / "logs" / "write_report" / "write_report.log").read_text()
    assert result.returncode != 0
    assert "1 output(s) were made with another config than the current one" in log
    assert "results/episodes/silent/n3.provenance.json (episodes of silent" in log
    assert "models.silent" in log
    assert not (tiny_workflow / "results" / "report.md").exists()
