"""The ``art`` trainer on a CPU: its config mapping, the rollouts it records, its refusal.

ART's LocalBackend needs a CUDA GPU and ART's backend extra, which this machine kind has not:
everything up to the backend is tested here for real (the recipe's mapping onto ART's
arguments; a served model's replies, with vLLM's token-id log-probs, turned into trajectories
that ART's own preprocessing tokenizes; the history read from ART's own ``LocalBackend.train``,
only its GPU service stood in for), and the job's refusal is checked. The GPU run itself is
marked ``gpu`` and skips without CUDA, ART's backend and its prepared vLLM runtime.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import json
import math
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordgap.config.training import TrainingRunConfig
from coordgap.env.protocols import TOOLS, Protocol, Tool
from coordgap.episodes import transcript_row
from coordgap.policies.remote import OpenAICompatible
from coordgap.training._art import art
from coordgap.training.art_trainer import (
    ArtBackendUnavailable,
    PackedRowsBackend,
    check_requirements,
    internal_config,
    missing_requirements,
    train_arguments,
    update_stats,
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


def upstream_metric_names() -> dict[str, str]:
    """ART's names for the Hugging Face trainer's logs, from its Unsloth trainer's source.

    Read from the source: importing ``art.unsloth.train`` needs trl, of ART's backend extra.
    """
    source = Path(art.__file__).with_name("unsloth") / "train.py"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            "_UPSTREAM_TRAIN_METRIC_KEYS"
        ]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{source} names no upstream metrics")


class StandInService:
    """What ART's LocalBackend asks of its Unsloth service, without a GPU.

    It yields one result per packed row, as ART's trainer does after each optimizer step: the
    Hugging Face trainer's logs (loss, gradient norm, learning rate) under ART's names.
    """

    def __init__(self) -> None:
        self.names = upstream_metric_names()
        self.packed: dict[str, Any] | None = None

    async def train(self, disk_packed_tensors, config, _config, verbose=False):
        self.packed = disk_packed_tensors
        for row in range(disk_packed_tensors["num_sequences"]):
            logs = {"loss": 0.25 * (row + 1), "grad_norm": 2.0, "learning_rate": 5e-6}
            yield {self.names[key]: value for key, value in logs.items()}


def one_call_group(rewards: list[float]) -> art.TrajectoryGroup:
    call = {
        "messages": json.dumps([{"role": "user", "content": "Eat?"}]),
        "tools": None,
        "completion": "eat",
        "token_ids": [i for i, _ in SAMPLED],
        "logprobs": [lp for _, lp in SAMPLED],
        "temperature": 1.0,
        "candidates": None,
    }
    return art.TrajectoryGroup(
        [philosopher_trajectory([call], r, {"seat": i}, 1.0) for i, r in enumerate(rewards)]
    )


def test_the_history_of_an_update_is_what_art_s_backend_reports(
    tmp_path, smollm2_dir, monkeypatch
) -> None:
    """ART 0.5.18's own ``LocalBackend.train`` on the CPU; only its GPU service is stood in for.

    Tokenizing and packing the groups and the metrics ART adds and averages are ART's code, so
    a metric ART renames or stops reporting fails this test.
    """
    backend = PackedRowsBackend(path=str(tmp_path))
    service = StandInService()

    async def get_service(model: art.TrainableModel) -> StandInService:
        return service

    monkeypatch.setattr(backend, "_get_service", get_service)
    # ART asks W&B for a run after each step; W&B is not installed here, and without
    # WANDB_API_KEY ART's own check returns no run.
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace())
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    model = art.TrainableModel(
        name="art-run",
        project="coordgap",
        base_model=str(smollm2_dir),
        _internal_config=internal_config(run()),
    )
    # Two groups: one whose rewards differ (two rows, one call each), one ART drops.
    groups = [one_call_group([1.0, 0.0]), one_call_group([0.5, 0.5])]
    result = asyncio.run(backend.train(model, groups, **train_arguments(run())))
    stats = update_stats(groups, result.metrics, backend.rows_shape)
    assert service.packed is not None
    rows, length = service.packed["num_sequences"], service.packed["sequence_length"]
    assert (rows, length) == (2, 2048)
    assert backend.rows_shape == (rows, length)
    assert (stats.groups, stats.groups_trainable, stats.trajectories) == (2, 1, 4)
    assert stats.rows == 2
    assert stats.tokens == 2 * 2048  # the padded rows ART's trainer runs
    assert stats.trained_tokens == 2 * len(SAMPLED)
    assert stats.loss == pytest.approx((0.25 + 0.5) / 2)
    assert stats.grad_norm == pytest.approx(2.0)
    assert 0 < stats.seconds < 60
    assert all(math.isnan(x) for x in (stats.clipped_share, stats.ratio_log_first))
    # A step with nothing to train: ART runs no row, and no loss is made up.
    result = asyncio.run(backend.train(model, groups[1:], **train_arguments(run())))
    idle = update_stats(groups[1:], result.metrics, backend.rows_shape)
    assert (idle.groups_trainable, idle.rows, idle.tokens, idle.trained_tokens) == (0, 0, 0, 0)
    assert math.isnan(idle.loss)
    assert math.isnan(idle.grad_norm)


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


@pytest.fixture
def restored_environ():
    """The environment as it was once the test is done: the art trainer sets a GPU job's."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.gpu
@pytest.mark.skipif(
    bool(missing_requirements()),
    reason="needs CUDA, ART's backend extra and its vLLM runtime (make art-runtime)",
)
@pytest.mark.usefixtures("restored_environ")
def test_art_trains_one_step_on_the_gpu(tmp_path, smollm2_dir) -> None:
    """ART's LocalBackend trains the tiny model one step; its checkpoint lands in our layout."""
    from coordgap.config.play import EnvironmentConfig, ModelSpec
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
