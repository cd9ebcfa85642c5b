"""The config rules of served models and placeholders, on config/paper.yaml."""

from __future__ import annotations

import copy
import ipaddress

import pytest
import yaml

from coordgap.config.checks import check_cross_keys
from coordgap.config.keys import ConfigError
from coordgap.config.play import EnvironmentConfig, ModelSpec
from coordgap.env.observation import PromptTemplates
from coordgap.policies.factory import open_policy_factory
from coordgap.policies.serving import listen_address
from tests.conftest import ROOT, changed

pytestmark = pytest.mark.unit

PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("models/qwen3-14b/base_url", "http://gpu:8000/v1", "'models.qwen3-14b.base_url'"),
        ("models/qwen3-14b/api_key_env", "VLLM_KEY", "'models.qwen3-14b.api_key_env'"),
        (
            "models/qwen3-8b/serve/command",
            ["vllm", "serve", "{weight}"],
            "'models.qwen3-8b.serve.command': unknown placeholder {weight}",
        ),
        (
            "models/qwen3-8b/serve/lora",
            ["--lora-modules", "{name}={adapter}"],
            "'models.qwen3-8b.serve.lora': unknown placeholder {name}",
        ),
        ("models/qwen3-8b/serve/source", None, "uses {weights} but serve.source is null"),
        ("models/qwen3-8b/serve/lora", None, "'models.qwen3-8b.serve.lora'"),
        ("training/runs/qwen3-8b-grpo/trainer", "torch", "'training.runs.qwen3-8b-grpo.trainer'"),
        (
            "training/runs/qwen3-8b-grpo/base_model",
            "grok-4.2",
            "'training.runs.qwen3-8b-grpo.base_model': 'grok-4.2' has no weights",
        ),
        # Settings ART's LocalBackend would silently override.
        (
            "training/runs/qwen3-8b-grpo/optimizer/weight_decay",
            0.0,
            "'training.runs.qwen3-8b-grpo.optimizer.weight_decay': trainer art cannot use 0.0",
        ),
        (
            "training/runs/qwen3-8b-grpo/warmup",
            False,
            "'training.runs.qwen3-8b-grpo.warmup': trainer art cannot use False",
        ),
        (
            "training/runs/qwen3-8b-grpo/compile_update",
            True,
            "'training.runs.qwen3-8b-grpo.compile_update': trainer art updates with ART's own",
        ),
        # ART's LocalBackend takes one optimizer step per row whatever this says.
        (
            "training/runs/qwen3-8b-grpo/grad_accumulation_sequences",
            "all",
            "'training.runs.qwen3-8b-grpo.grad_accumulation_sequences': trainer art takes one "
            "optimizer step per row",
        ),
        ("plan/prices/qwen3-8b", {"input": 1, "output": 1}, "'plan.prices.qwen3-8b'"),
        ("plan/prices/nobody", {"input": 1, "output": 1}, "'plan.prices.nobody'"),
    ],
)
def test_a_served_model_config_is_refused_naming_the_key(path, value, named):
    check_cross_keys(copy.deepcopy(PAPER))
    with pytest.raises(ConfigError, match="config key") as refused:
        check_cross_keys(changed(PAPER, path, value))
    assert named in str(refused.value)


def test_a_job_refuses_a_placeholder_before_it_opens_anything(monkeypatch):
    # The key is set: the placeholder, not a missing key, must stop the job.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    model = ModelSpec.from_dict("gpt-5.4", PAPER["models"]["gpt-5.4"])
    env = EnvironmentConfig.from_dict(PAPER["environment"])
    templates = PromptTemplates.load(ROOT / "config" / "prompts")
    with (
        pytest.raises(ConfigError, match=r"'models\.gpt-5\.4\.model' is still a placeholder"),
        open_policy_factory(model, env, templates, None),
    ):
        pytest.fail("a job opened a model whose name is a placeholder")


def test_a_server_listens_on_loopback_unless_a_profile_asks_for_the_node():
    assert listen_address("loopback") == "127.0.0.1"
    assert ipaddress.ip_address(listen_address("node")).version == 4
    with pytest.raises(ValueError, match="serve_host must be one of loopback, node"):
        listen_address("0.0.0.0")
