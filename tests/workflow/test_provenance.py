"""Every output folder carries its provenance; the report refuses outputs of another config."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import run

pytestmark = [pytest.mark.workflow, pytest.mark.slow]


def test_the_report_refuses_outputs_that_another_config_made(finished_tiny, tiny_config):
    sizes = tiny_config["experiment"]["sizes"]
    for model in tiny_config["models"]:
        for n in sizes:
            record = json.loads(
                (
                    finished_tiny / "results" / "episodes" / model / f"n{n}.provenance.json"
                ).read_text()
            )
            assert (record["kind"], record["name"], record["model"]["kind"]) == (
                "episodes",
                model,
                "scripted",
            )
    cells = len(tiny_config["models"]) * len(sizes)
    assert f"| Output records | {cells}, each made with the current config's sections |" in (
        (finished_tiny / "results" / "report.md").read_text()
    )

    # The outputs stay, the config changes under them (as after restoring outputs of another
    # experiment), and Snakemake is told they are current: the report must not mix them in.
    tiny_config["models"]["silent"] = {"kind": "scripted", "policy": "think_only"}
    (finished_tiny / "config" / "config.yaml").write_text(yaml.safe_dump(tiny_config))
    run(finished_tiny, "snakemake", "--cores", "1", "--touch", "all")
    result = run(
        finished_tiny, "snakemake", "--cores", "1", "--forcerun", "write_report", check=False
    )
    log = (finished_tiny / "logs" / "write_report" / "write_report.log").read_text()
    assert result.returncode != 0
    assert f"{len(sizes)} output(s) were made with another config than the current one" in log
    assert "results/episodes/silent/n3.provenance.json (episodes of silent" in log
    assert "models.silent" in log
    assert not (finished_tiny / "results" / "report.md").exists()
