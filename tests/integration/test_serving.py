"""The model-server launcher of served models, driven with llama.cpp's OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import polars as pl
import pytest
import yaml

from coordgap.config.play import EnvironmentConfig, ModelSpec
from coordgap.data import step_label
from coordgap.env.observation import PromptTemplates
from coordgap.env.protocols import TOOLS, Protocol
from coordgap.evaluation.checkpoints import CheckpointJob
from coordgap.policies.remote import OpenAICompatible
from coordgap.policies.serving import SERVED_KEY_ENV, ServerStartError, launch, serve_model
from coordgap.site import SITE_ENV
from tests.conftest import ROOT, copy_workflow, plan_lines, run
from tests.integration.processes import (
    group_alive,
    llama_server_command,
    llama_server_python,
    needs_llama_server,
    smollm2_gguf,
)

LLAMA_PYTHON = llama_server_python()
pytestmark = [pytest.mark.integration, pytest.mark.slow, needs_llama_server]

# llama-cpp-python's server reads its key from API_KEY and has no /health.
SERVER = {"key_env": "API_KEY", "health": "/v1/models", "start_timeout_s": 120.0}
PROMPT = [
    {"role": "system", "content": "You are philosopher 0 at a table of 5. Call one tool."},
    {"role": "user", "content": "Both your forks are free. You hold none. Round 1 of 5."},
]


def _command() -> list[str]:
    assert LLAMA_PYTHON is not None
    return llama_server_command(LLAMA_PYTHON, smollm2_gguf())


def _status(url: str, key: str | None) -> int:
    """The HTTP status of a GET, with the key as a bearer token if given."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code


def _gone(pid: int, within_s: float) -> bool:
    """Whether the process group ``pid`` is empty within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while group_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_server_starts_serves_only_its_job_and_stops(caplog):
    # The server says its key out loud: the launcher must strike it from what it logs.
    command = ["sh", "-c", 'echo "my key is $API_KEY"; exec "$0" "$@"', *_command()]
    with caplog.at_level(logging.INFO), launch(command, **SERVER) as endpoint:
        key = os.environ[SERVED_KEY_ENV]
        assert len(key) >= 32
        assert group_alive(endpoint.pid)
        assert endpoint.base_url.startswith("http://127.0.0.1:")
        # Never on a command line, which every user of the node can read.
        assert key.encode() not in Path(f"/proc/{endpoint.pid}/cmdline").read_bytes()
        models = f"{endpoint.base_url}/models"
        assert _status(models, key) == 200
        assert _status(models, None) == 401
        assert _status(models, "not-the-job-key") == 401

        backend = OpenAICompatible(
            model="smollm2",
            base_url=endpoint.base_url,
            api_key_env=endpoint.key_env,
            extra_body={"max_tokens": 32},  # llama-cpp-python reads max_tokens only
            timeout_s=120.0,
            max_retries=0,
        )
        decision = asyncio.run(backend.decide(PROMPT, TOOLS[Protocol.TOOLS6], seed=1))
        assert backend.stats.transport_errors == 0, decision.raw
        assert decision.tokens_in > 0
    assert _gone(endpoint.pid, within_s=1), "the server outlived the block"
    assert SERVED_KEY_ENV not in os.environ
    assert "server: my key is [job key]" in caplog.text
    assert key not in caplog.text


def test_a_server_that_exits_at_start_fails_the_job_with_its_last_lines():
    command = [*_command()]
    command[command.index("--model") + 1] = "/nonexistent/model.gguf"
    with pytest.raises(ServerStartError) as failure, launch(command, **SERVER):
        pytest.fail("a server without its model became healthy")
    message = str(failure.value)
    assert "exited with status" in message
    assert "Its last lines:" in message
    assert "/nonexistent/model.gguf" in message  # llama.cpp's own complaint, quoted


def test_a_server_that_never_gets_healthy_is_stopped_after_its_timeout(caplog):
    # A health path the server does not have: it answers 404 for ever.
    settings = {**SERVER, "health": "/never", "start_timeout_s": 8.0}
    started = time.monotonic()
    with (
        caplog.at_level(logging.INFO),
        pytest.raises(ServerStartError) as failure,
        launch(_command(), **settings),
    ):
        pytest.fail("a server became healthy on a path it does not have")
    assert "not ready within 8 s" in str(failure.value)
    assert '"GET /never HTTP/1.1" 404' in str(failure.value)
    assert time.monotonic() - started < 8 + 15
    pid = int(next(r.args[1] for r in caplog.records if r.msg.startswith("started %s")))
    assert _gone(pid, within_s=1)


# A job that starts a server, says the server's PID, and waits as episode generation does.
JOB = """
import asyncio, json, sys
from coordgap import preemption
from coordgap.policies.serving import launch

settings = json.loads(sys.argv[1])
with launch(**settings) as endpoint:
    print(endpoint.pid, flush=True)
    preemption.run(asyncio.sleep(600))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_no_server_outlives_its_job(signum):
    settings = json.dumps({"command": _command(), **SERVER})
    job = subprocess.Popen([sys.executable, "-c", JOB, settings], stdout=subprocess.PIPE, text=True)
    server = int(job.stdout.readline())
    try:
        assert group_alive(server)
        os.kill(job.pid, signum)  # the job alone: its server must follow it by itself
        assert job.wait(timeout=60) != 0
        # SIGTERM: the launcher stops its server. SIGKILL: the kernel tells the server.
        assert _gone(server, within_s=30), f"server {server} outlived its job ({signum.name})"
    finally:
        job.kill()
        job.wait()
        if group_alive(server):  # the failure above; leave no orphan behind
            os.killpg(server, signal.SIGKILL)


def test_a_checkpoint_is_served_with_the_lora_arguments_and_asked_for_by_name(tmp_path):
    adapter = tmp_path / "checkpoints" / "step_0003"
    adapter.mkdir(parents=True)
    entry = {
        "kind": "openai",
        "provider": "openai",
        "base_url": None,
        "model": "smollm2",
        "api_key_env": None,
        "extra_body": {},
        "model_kwargs": {},
        # What checkpoint_model adds to a base model's entry.
        "adapter": str(adapter),
        "serve": {
            **SERVER,
            "gpu_memory_gb": 0,
            "source": None,
            "command": _command(),
            # llama.cpp serves GGUF LoRAs only: these stand in for vLLM's --lora-modules, and
            # show where each placeholder lands (lora_base is unused without a lora_path).
            "lora": ["--model_alias", "{adapter_name}", "--lora_base", "{adapter}"],
        },
    }
    with serve_model(ModelSpec.from_dict("run@last", entry), None, "loopback") as served:
        assert served.entry["model"] == "step_0003"
        assert served.entry["api_key_env"] == SERVED_KEY_ENV
        url = f"{served.entry['base_url']}/models"
        request = urllib.request.Request(
            url, headers={"Authorization": f"Bearer {os.environ[SERVED_KEY_ENV]}"}
        )
        with urllib.request.urlopen(request) as reply:
            listed = [model["id"] for model in json.load(reply)["data"]]
    assert listed == ["step_0003"]


def _served_entry(command: list[str], lora: list[str] | None) -> dict:
    """SmolLM2 served by llama.cpp inside its jobs, as a ``models:`` entry."""
    return {
        "kind": "openai",
        "provider": "openai",
        "base_url": None,
        "model": "smollm2",
        "api_key_env": None,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 48,
        "extra_body": {"max_tokens": 48},  # llama-cpp-python reads max_tokens only
        "model_kwargs": {},
        "tool_choice": "auto",
        "timeout_s": 120,
        "max_retries": 1,
        "backoff_base_s": 0.1,
        "backoff_max_s": 1.0,
        "requests_per_second": None,
        "max_in_flight": 2,
        "episodes_per_cell": 3,
        "serve": {**SERVER, "gpu_memory_gb": 0, "source": None, "command": command, "lora": lora},
    }


def test_a_runs_validation_plays_every_checkpoint_through_one_server(
    tmp_path, tiny_config, caplog, monkeypatch
):
    checkpoints = tmp_path / "checkpoints"
    steps = [0, 2]
    for step in steps:
        (checkpoints / step_label(step)).mkdir(parents=True)
    # llama.cpp serves GGUF LoRAs only: the server records the LoRA arguments it was given
    # (everything after "server") and serves the base model under whatever name is asked for.
    # It also says where its vLLM cache is: under the site's scratch folder.
    argv, cache = tmp_path / "argv", tmp_path / "cache"
    script = (
        f'printf "%s\\n" "$@" > {argv}; printf %s "$VLLM_CACHE_ROOT" > {cache}; '
        f"exec {shlex.join(_command())}"
    )
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"scratch": str(tmp_path / "scratch")}))
    monkeypatch.setenv(SITE_ENV, str(site))
    lora = ["--enable-lora", "--lora-modules", "{adapter_name}={adapter}"]
    base = _served_entry(["sh", "-c", script, "server"], lora)
    folder = tmp_path / "validation"
    with caplog.at_level(logging.INFO, logger="coordgap.policies.serving"):
        CheckpointJob(
            base=base,
            checkpoints=checkpoints,
            env=EnvironmentConfig.from_dict({**tiny_config["environment"], "rounds": 2}),
            base_seed=0,
            first_scenario=0,
            weights=tmp_path,
            templates=PromptTemplates.load(ROOT / "config" / "prompts"),
        ).validate("run", steps, n=3, episodes=1, folder=folder)
    assert sum(record.getMessage().startswith("started ") for record in caplog.records) == 1
    assert argv.read_text().split() == [
        "--enable-lora",
        "--lora-modules",
        *(f"{step_label(step)}={(checkpoints / step_label(step)).resolve()}" for step in steps),
    ]
    assert cache.read_text() == str(tmp_path / "scratch" / "vllm")
    for step in steps:
        episodes = pl.read_parquet(folder / f"{step_label(step)}.parquet")
        assert episodes["checkpoint"].to_list() == [step_label(step)]
        assert episodes["status"].to_list() == ["ok"]
    assert not (tmp_path / "validation.partial").exists()


def _served_study(tiny_config: dict, key_file: Path) -> dict:
    """The tiny design with SmolLM2 served by llama.cpp inside its jobs, at N = 3 and 4."""
    # The server writes its key where the test can find it, outside the project.
    command = ["sh", "-c", f'printf %s "$API_KEY" > {key_file}; exec "$0" "$@"', *_command()]
    config = copy.deepcopy(tiny_config)
    config["environment"]["rounds"] = 2
    config["experiment"] = {**config["experiment"], "sizes": [3, 4], "episodes_per_cell": 2}
    config["models"] = {
        "resource_hierarchy": config["models"]["resource_hierarchy"],
        "smollm2-served": _served_entry(command, lora=None),
    }
    config["analysis"]["comparisons"] = [["smollm2-served", "resource_hierarchy"]]
    config["analysis"]["timeline"] = {"model": "resource_hierarchy", "n": 3, "episode": 0}
    return config


def test_a_served_model_plays_through_the_workflow_and_a_pilot_prices_the_rest(
    tmp_path, tiny_config
):
    key_file = tmp_path / "key.txt"
    project = copy_workflow(tmp_path / "project", _served_study(tiny_config, key_file))
    served = ("generate_served_episodes", "smollm2-served")
    # A pilot cell measures the model; the plan then prices the whole study from it.
    run(project, "snakemake", "--cores", "2", "results/episodes/smollm2-served/n3.parquet")
    estimate = plan_lines(project)[served]
    run(project, "snakemake", "--cores", "2", "episodes")

    tables = sorted((project / "results" / "episodes" / "smollm2-served").glob("n?.parquet"))
    used = pl.concat(pl.read_parquet(path) for path in tables)
    assert [path.name for path in tables] == ["n3.parquet", "n4.parquet"]
    assert (used["status"] == "ok").all()
    assert (used["decisions"] > 0).all()
    benchmarks = (project / "logs" / "generate_served_episodes" / "smollm2-served").glob("*.tsv")
    wall_h = sum(pl.read_csv(path, separator="\t")["s"].sum() for path in benchmarks) / 3600
    for field, value in [
        ("decisions", used["decisions"].sum()),
        ("tokens_in", used["tokens_in"].sum()),
        ("tokens_out", used["tokens_out"].sum()),
        ("gpu_hours", wall_h),
    ]:
        assert 0.5 <= estimate[field] / value <= 2, (field, estimate[field], value)

    # The job's key never reached a log, an output or Snakemake's records.
    key = key_file.read_text()
    assert len(key) >= 32
    for path in project.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
