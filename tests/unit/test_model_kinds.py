"""Each model kind is one class that says what the workflow needs of its models."""

from __future__ import annotations

import pytest
import yaml

from coordgap.config.play import (
    MODEL_CLASSES,
    LocalModel,
    ModelKind,
    ModelSpec,
    OpenAIModel,
    ScriptedModel,
)
from coordgap.policies.factory import BACKENDS
from tests.conftest import ROOT

pytestmark = pytest.mark.unit

DEFAULT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["models"]
PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())["models"]


def test_every_kind_has_one_class_and_every_language_model_kind_a_backend():
    assert set(MODEL_CLASSES) == set(ModelKind)
    assert all(cls.kind is kind for kind, cls in MODEL_CLASSES.items())
    languages = {kind for kind, cls in MODEL_CLASSES.items() if cls.is_language_model}
    assert set(BACKENDS) == languages == {ModelKind.LOCAL, ModelKind.OPENAI}
    with pytest.raises(ValueError, match="'vllm' is not a valid ModelKind"):
        ModelSpec.from_dict("m", {"kind": "vllm"})


@pytest.mark.parametrize(
    ("entries", "name", "cls", "facts"),
    [
        # (rule, gpus, in process, weights source key, GPU memory, paid API)
        (
            DEFAULT,
            "resource_hierarchy",
            ScriptedModel,
            ("generate_episodes", 0, False, None, 0, False),
        ),
        (DEFAULT, "smollm2-135m", LocalModel, ("generate_episodes", 1, True, "source", 0, False)),
        (PAPER, "gpt-5.4", OpenAIModel, ("generate_api_episodes", 0, False, None, 0, True)),
        (
            PAPER,
            "qwen3-14b",
            OpenAIModel,
            ("generate_served_episodes", 1, False, "serve.source", 80, False),
        ),
    ],
)
def test_what_each_kind_tells_the_workflow(entries, name, cls, facts):
    entry = entries[name]
    model = ModelSpec.from_dict(name, entry)
    assert type(model) is cls
    rule, gpus, in_process, source_key, memory, paid = facts
    assert model.generation_rule == rule
    assert (model.gpus, model.in_process, model.is_paid_api) == (gpus, in_process, paid)
    assert model.served_gpu_memory_gb == memory
    if source_key is None:
        assert (model.weights_source, model.weights_source_key) == (None, None)
    else:
        assert model.weights_source_key == f"models.{name}.{source_key}"
        section, _, key = source_key.rpartition(".")
        assert model.weights_source == (entry[section] if section else entry)[key]


def test_identity_names_the_kind_and_where_the_model_comes_from():
    hosted = ModelSpec.from_dict("gpt-5.4", PAPER["gpt-5.4"]).identity()
    assert hosted == {
        "name": "gpt-5.4",
        "kind": "openai",
        "provider": "openai",
        "model": PAPER["gpt-5.4"]["model"],
    }
    served = ModelSpec.from_dict("qwen3-14b", PAPER["qwen3-14b"]).identity()
    assert served["source"] == PAPER["qwen3-14b"]["serve"]["source"]
    local = ModelSpec.from_dict("smollm2-135m", DEFAULT["smollm2-135m"]).identity()
    assert local == {
        "name": "smollm2-135m",
        "kind": "local",
        "source": DEFAULT["smollm2-135m"]["source"],
    }
    scripted = ModelSpec.from_dict("silent", DEFAULT["silent"])
    assert scripted.identity() == {"name": "silent", "kind": "scripted"}
    assert scripted.own_episodes_per_cell is None


def test_completion_limits_and_episode_counts_of_language_models():
    local = ModelSpec.from_dict("smollm2-135m", DEFAULT["smollm2-135m"])
    assert local.completion_limit == DEFAULT["smollm2-135m"]["max_new_tokens"]
    assert local.own_episodes_per_cell == DEFAULT["smollm2-135m"]["episodes_per_cell"]
    hosted = ModelSpec.from_dict("gpt-5.4", PAPER["gpt-5.4"])
    assert hosted.completion_limit == PAPER["gpt-5.4"]["max_tokens"]
    assert hosted.api_key_env == PAPER["gpt-5.4"]["api_key_env"]
