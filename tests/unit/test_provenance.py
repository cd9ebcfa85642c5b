"""Provenance records: each output's config digest, checked against the current config."""

from __future__ import annotations

import json
from importlib import metadata

import pytest
import yaml

from coordgap.provenance import (
    ProvenanceMismatch,
    check_records,
    output_identity,
    write_record,
)
from tests.conftest import ROOT, changed

pytestmark = pytest.mark.unit

PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
# One output of every kind, as the paper study writes them.
OUTPUTS = [
    ("episodes", "gpt-5.4", "results/episodes/gpt-5.4/n5.provenance.json"),
    ("episodes", "qwen3-14b", "results/episodes/qwen3-14b/n5.provenance.json"),
    ("train", "qwen3-14b-grpo", "results/train/qwen3-14b-grpo/provenance.json"),
    ("eval", "qwen3-14b-grpo", "results/eval/qwen3-14b-grpo/validation.provenance.json"),
    ("test", "qwen3-14b-grpo@last", "results/test/qwen3-14b-grpo@last/n5.provenance.json"),
]


@pytest.fixture
def records(tmp_path):
    """The records of ``OUTPUTS``, written under the paper config."""
    paths = []
    for kind, name, relative in OUTPUTS:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        write_record(path, output_identity(PAPER, kind, name), root=ROOT)
        paths.append(path)
    return paths


def test_a_record_says_where_its_output_comes_from(records):
    record = json.loads(records[1].read_text())
    assert record["kind"] == "episodes"
    assert record["model"] == {
        "name": "qwen3-14b",
        "kind": "openai",
        "provider": "openai",
        "model": "qwen3-14b",
        "source": PAPER["models"]["qwen3-14b"]["serve"]["source"],
    }
    assert record["seeds"] == {"seed": PAPER["seed"]}
    assert record["sections"] == [
        "seed",
        "environment",
        "scenarios.test",
        "models.qwen3-14b",
        "episodes per cell",
    ]
    assert record["packages"]["polars"] != "not installed"
    assert record["commit"]  # this checkout's
    trained = json.loads(records[2].read_text())
    assert trained["seeds"] == {"seed": PAPER["seed"], "run seed": 1}
    check_records(PAPER, records)


@pytest.mark.parametrize(
    ("dotted", "value", "stale"),
    [
        # Every output depends on the table's rules.
        ("environment/rounds", 4, [0, 1, 2, 3, 4]),
        # One model's entry: its episodes, and what is trained on it.
        ("models/qwen3-14b/temperature", 0.2, [1, 2, 3, 4]),
        ("models/gpt-5.4/max_tokens", 1024, [0]),
        # The recipe: training and everything after it, never the untrained episodes.
        ("training/runs/qwen3-14b-grpo/learning_rate", 1e-5, [2, 3, 4]),
        ("evaluation/episodes", 20, [3, 4]),
        ("reward/weights/idle", 0.2, [4]),  # selection reads the reward
        # Sections no output depends on.
        ("analysis/monitors/no_call_rate", 0.9, []),
        ("plan/server_start_s", 1, []),
    ],
)
def test_outputs_of_another_config_are_refused_and_named(records, dotted, value, stale):
    config = changed(PAPER, dotted, value)
    if not stale:
        check_records(config, records)
        return
    with pytest.raises(ProvenanceMismatch) as refused:
        check_records(config, records)
    message = str(refused.value)
    assert message.startswith(f"{len(stale)} output(s) were made with another config")
    for index, path in enumerate(records):
        assert (str(path) in message) == (index in stale), (path, message)


def test_a_record_names_the_trainers_servers_and_provider_clients_installed_or_not(
    tmp_path, monkeypatch
):
    installed = metadata.version
    absent = {"unsloth", "vllm", "langchain-google-genai"}

    def version(name):
        if name in absent:
            raise metadata.PackageNotFoundError(name)
        return installed(name)

    monkeypatch.setattr(metadata, "version", version)
    path = tmp_path / "provenance.json"
    write_record(path, output_identity(PAPER, "train", "qwen3-14b-grpo"), root=ROOT)
    packages = json.loads(path.read_text())["packages"]
    # The test extra installs the provider integrations (pyproject.toml).
    for name in (
        "openpipe-art",
        "openai",
        "anthropic",
        "google-genai",
        "langchain-openai",
        "langchain-anthropic",
    ):
        assert packages[name] == installed(name)
    assert {name: packages[name] for name in absent} == dict.fromkeys(absent, "not installed")
