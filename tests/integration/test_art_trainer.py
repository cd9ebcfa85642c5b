"""The ``art`` trainer on a CPU: its config mapping, the rollouts it records, its refusal.

ART's LocalBackend needs a CUDA GPU and ART's backend extra, which this machine kind has not:
everything up to the backend is tested here for real (the recipe's mapping onto ART's
arguments; a served model's replies, with vLLM's token-id log-probs, turned into trajectories
that ART's own preprocessing tokenizes), and the job's refusal is checked. The GPU run itself
is marked ``gpu`` and skips without CUDA and ART's backend.
"""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
import yaml

from coordgap.config import TrainingRunConfig
from coordgap.env.protocols import TOOLS, Protocol, Tool
from coordgap.episodes import transcript_row
from coordgap.policies.remote import OpenAICompatible
from coordgap.training._art import art
from coordgap.training.art_trainer import (
    ArtBackendUnavailable,
    check_requirements,
    internal_config,
    missing_requirements,
    train_arguments,
)
from coordgap.training.trajectories import philosopher_trajectory
from tests.conftest import ROOT
from tests.integration.fault_server import FaultServer, completion_body, message_body, raw

pytestmark = pytest.mark.integration

CONFIG = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
SIX = TOOLS[Protocol.TOOLS6]
# What vLLM returns for a call with --return-tokens-as-token-ids: ids, not text.
SAMPLED = [(1001, -0.5), (1002, -0.25), (7, -0.125)]


def run(**changes: object) -> TrainingRunConfig:
    entry = copy.deepcopy(CONFIG["training"]["runs"]["smollm2-grpo"])
    entry.update(trainer="art", **changes)
    return TrainingRunConfig.from_dict("art-run", entry)


def test_the_recipe_maps_onto_art_s_arguments() -> None:
    config = internal_config(
        run(
            art_internal_config={
                "engine_args": {"gpu_memory_utilization": 0.7, "max_lora_rank": 4},
                "peft_args": {"r": 99},
                "init_args": {"load_in_4bit": False},
            }
        )
    )
    assert config["peft_args"] == {
        "r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "target_modules": [
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
        ],
    }  # fmt: skip
    assert config["trainer_args"] == {
        "adam_beta1": 0.9,
        "adam_beta2": 0.99,
        "weight_decay": 0.1,
        "max_grad_norm": 0.1,
    }
    # vLLM must be able to load the adapter: its LoRA rank limit is raised to the run's.
    assert config["engine_args"] == {"gpu_memory_utilization": 0.7, "max_lora_rank": 8}
    assert config["init_args"] == {"load_in_4bit": False}
    assert config["chat_template_kwargs"] == {"enable_thinking": False}
    assert train_arguments(run()) == {"learning_rate": 5e-6, "loss_fn": "cispo"}
    assert train_arguments(run(loss="ppo", epsilon=0.1, epsilon_high=0.3)) == {
        "learning_rate": 5e-6,
        "loss_fn": "ppo",
        "epsilon": 0.1,
        "epsilon_high": 0.3,
    }
    # The run's own internal config is left as it was.
    assert run().art_internal_config == {}


def test_a_served_reply_becomes_a_trajectory_art_tokenizes(smollm2_dir) -> None:
    from transformers import AutoTokenizer

    logprobs = {
        "content": [
            {"token": f"token_id:{i}", "logprob": lp, "bytes": None, "top_logprobs": []}
            for i, lp in SAMPLED
        ]
    }
    choice = {
        "index": 0,
        "message": message_body(None, [("eat", "{}")]),
        "logprobs": logprobs,
        "finish_reason": "tool_calls",
    }
    body = json.dumps(completion_body("served", [choice])).encode()
    messages = [{"role": "system", "content": "You dine."}, {"role": "user", "content": "Eat?"}]
    with FaultServer([raw(body)]) as server:
        model = OpenAICompatible(model="served", base_url=server.base_url, record_transcripts=True)
        decision = asyncio.run(model.decide(messages, SIX, 0))
        assert server.requests[0].body["logprobs"] is True
    assert decision.tool is Tool.EAT
    transcript = decision.transcript
    assert transcript is not None
    assert transcript.token_ids == tuple(i for i, _ in SAMPLED)
    assert transcript.logprobs == tuple(lp for _, lp in SAMPLED)
    assert [tool["function"]["name"] for tool in transcript.tools] == [t.value for t in SIX]
    assert transcript.temperature == 1.0
    call = transcript_row(transcript)
    trajectory = philosopher_trajectory([call], 1.0, {"episode": 0}, 1.0)
    assert trajectory.tools == list(transcript.tools)
    other = philosopher_trajectory([call], 0.0, {"episode": 1}, 1.0)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    (result, *_) = art.preprocessing.tokenize.tokenize_trajectory_groups(
        tokenizer, [art.TrajectoryGroup([trajectory, other])], False, True
    )
    trained = [t for t, m in zip(result.token_ids, result.assistant_mask, strict=True) if m]
    assert trained == [i for i, _ in SAMPLED]


def test_a_reply_that_names_tokens_by_text_records_no_transcript() -> None:
    logprobs = {"content": [{"token": "<tool_call>", "logprob": -0.1}]}
    choice = {"index": 0, "message": message_body(None, [("eat", "{}")]), "logprobs": logprobs}
    body = json.dumps(completion_body("served", [choice])).encode()
    with FaultServer([raw(body)]) as server:
        model = OpenAICompatible(model="s", base_url=server.base_url, record_transcripts=True)
        decision = asyncio.run(model.decide([{"role": "user", "content": "Eat?"}], SIX, 0))
    assert decision.tool is Tool.EAT
    assert decision.transcript is None


@pytest.mark.skipif(not missing_requirements(), reason="this machine can run ART's backend")
def test_without_a_gpu_the_art_trainer_stops_naming_what_is_missing() -> None:
    with pytest.raises(ArtBackendUnavailable) as stopped:
        check_requirements(run())
    message = str(stopped.value)
    assert "'art-run'" in message
    for missing in missing_requirements():
        assert missing in message
    assert "openpipe-art[backend]==0.5.18" in message
    assert "trainer: torch" in message


@pytest.mark.gpu
@pytest.mark.skipif(bool(missing_requirements()), reason="needs CUDA and ART's backend extra")
def test_art_trains_one_step_on_the_gpu(tmp_path, smollm2_dir) -> None:
    """ART's LocalBackend trains the tiny model one step; its checkpoint lands in our layout."""
    from coordgap.config import EnvironmentConfig, ModelSpec
    from coordgap.env.observation import PromptTemplates
    from coordgap.training.loop import RunOutputs, train_run

    tiny = run(steps=1, groups_per_step=1, episodes_per_group=2, n=3)
    base = ModelSpec.from_dict("smollm2-135m", CONFIG["models"]["smollm2-135m"])
    env = EnvironmentConfig.from_dict({**CONFIG["environment"], "rounds": 2})
    outputs = RunOutputs(tmp_path / "run", tiny.steps)
    templates = PromptTemplates.load(ROOT / "config" / "prompts")
    train_run(tiny, base, smollm2_dir, env, templates, 1, 0, outputs, progress=False)
    for step in (0, 1):
        assert (outputs.checkpoint(step) / "adapter_model.safetensors").exists()
