"""The ``art`` trainer on a cluster: the GPU job's environment, the node checks, the prepare step.

ART's vLLM runtime cannot be built or run here (no GPU, and building it downloads 10-20 GB),
so these test what surrounds it. The environment is read back through the code that reads it
(ART's cache folder and W&B decision, the model hub's client in a new process, torch
inductor); the runtime's needs are read from the project ART ships; a runtime laid out as
ART's installer leaves it is found by ART's own check. The node checks run on monkeypatched
platform facts (CPU architecture, glibc, the driver's version file): that tests our checking
logic on nodes this machine is not. ``coordgap art-runtime`` runs with ART's installer stood
in for, since the real one downloads the runtime.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch._inductor.runtime.cache_dir_utils
import yaml

from coordgap.cli import main
from coordgap.config.play import ModelSpec
from coordgap.config.training import TrainingRunConfig
from coordgap.site import SCRATCH_CACHES, SITE_ENV
from coordgap.training import art_runtime
from coordgap.training._art import art
from coordgap.training.art_runtime import (
    WANDB_KEY,
    RuntimeNeeds,
    apply_job_environment,
    gpu_job_shortfalls,
    prepared_runtime,
    runtime_needs,
)
from coordgap.training.art_trainer import ArtBackendUnavailable, ArtTrainer
from tests.conftest import ROOT

pytestmark = pytest.mark.unit

CONFIG = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
RHEL8_DRIVER_535 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    "GCC version:  gcc version 8.5.0 20210514 (Red Hat 8.5.0-18) (GCC)\n"
)
OPEN_DRIVER_570 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
    "(dvs-builder@U16-I3-C03-3-3)  Thu Jan 23 23:44:41 UTC 2025\n"
)


class WandbStarted(Exception):
    """ART called ``wandb.init``."""


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """This process's environment as a copy the test may change, without a site file."""
    copy = {
        name: value
        for name, value in os.environ.items()
        if name
        not in {*SCRATCH_CACHES, "HF_HUB_OFFLINE", "WANDB_MODE", WANDB_KEY, "ART_VLLM_RUNTIME_BIN"}
    }
    copy[SITE_ENV] = str(tmp_path / "no-site.yaml")
    monkeypatch.setattr(os, "environ", copy)
    return copy


def on_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, machine: str, glibc: str, driver: str | None
) -> None:
    """Make this machine report another node's CPU, glibc and NVIDIA driver (None: none)."""
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", glibc) if glibc else ("", ""))
    version_file = tmp_path / "proc-driver-nvidia-version"
    if driver is not None:
        version_file.write_text(driver)
    monkeypatch.setattr(art_runtime, "DRIVER_VERSION_FILE", version_file)


def lay_out_runtime(cache: Path) -> Path:
    """A runtime folder as ART's installer leaves it, its marker written with ART's model."""
    runtime = art.vllm_runtime
    manifest = runtime._load_bundled_manifest()
    digest = runtime._manifest_hash(manifest)
    venv = cache / digest / ".venv"
    server = venv / "bin" / runtime.RUNTIME_SERVER
    server.parent.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    marker = runtime.VllmRuntimeInstallMarker(
        runtime_version=manifest.runtime_version,
        protocol_version=manifest.protocol_version,
        manifest_hash=digest,
        runtime_wheel_sha256=manifest.runtime_wheel_sha256,
        cache_root=str(cache.resolve()),
    )
    (cache / digest / "install.json").write_text(marker.model_dump_json())
    return server


def write_site(path: Path, scratch: Path) -> Path:
    path.write_text(yaml.safe_dump({"scratch": str(scratch)}))
    return path


def test_a_gpu_job_keeps_its_caches_under_scratch_where_their_readers_look(
    environ: dict[str, str], tmp_path: Path
) -> None:
    scratch = tmp_path / "scratch"
    variables = apply_job_environment(scratch, wandb=False)
    assert {
        "ART_VLLM_RUNTIME_CACHE_DIR",
        "UV_CACHE_DIR",
        "HF_HOME",
        "VLLM_CACHE_ROOT",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
    } <= set(variables)
    folders = [Path(environ[name]) for name in SCRATCH_CACHES]
    assert all(folder.is_relative_to(scratch) for folder in folders)
    # Each cache in a folder of its own, but XDG_CACHE_HOME (the catch-all) is scratch itself.
    assert len(set(folders)) == len(folders)
    assert art.vllm_runtime.get_vllm_runtime_cache_root() == scratch / "art" / "vllm_runtime"
    assert torch._inductor.runtime.cache_dir_utils.cache_dir() == str(scratch / "torchinductor")
    # ART's trainer and vLLM are new processes: the model hub's client reads these on import.
    hub = subprocess.run(
        [sys.executable, "-c", "import huggingface_hub.constants as c; print(c.HF_HOME, "
         "c.HF_HUB_OFFLINE)"],
        env=environ, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert hub == [str(scratch / "huggingface"), "True"]
    # Without a scratch folder every cache keeps its default; the hub stays offline.
    environ.clear()
    environ["HOME"] = str(tmp_path / "home")
    assert apply_job_environment(None, wandb=False) == {
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
    }
    assert art.vllm_runtime.get_vllm_runtime_cache_root() == Path(
        environ["HOME"], ".cache", "art", "vllm_runtime"
    )


def test_art_starts_wandb_only_where_the_site_allows_it(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ART's own decision (``TrainableModel._get_wandb_run``), W&B itself stood in for."""

    def init(**_: object) -> None:
        raise WandbStarted

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init, Settings=dict))
    model = art.TrainableModel(name="run", project="coordgap", base_model="base")
    environ[WANDB_KEY] = "a key"
    apply_job_environment(None, wandb=True)
    assert environ[WANDB_KEY] == "a key"
    assert "WANDB_MODE" not in environ
    with pytest.raises(WandbStarted):
        model._get_wandb_run()
    apply_job_environment(None, wandb=False)
    assert WANDB_KEY not in environ
    assert environ["WANDB_MODE"] == "disabled"
    assert model._get_wandb_run() is None


def test_the_runtime_s_needs_are_read_from_the_project_art_ships() -> None:
    # ART 0.5.18: vLLM's wheel is manylinux_2_34_x86_64, torch's is built for CUDA 12.8.
    assert runtime_needs() == RuntimeNeeds(
        machine="x86_64", glibc=(2, 34), cuda=(12, 8), driver="570.26"
    )


def test_an_unfit_node_stops_the_art_trainer_naming_what_it_lacks(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An aarch64 RHEL 8 node with a 535 driver, as monkeypatched platform facts.

    This tests our checking logic: the facts are those of a node this machine is not.
    """
    on_node(monkeypatch, tmp_path, "aarch64", "2.28", RHEL8_DRIVER_535)
    scratch = tmp_path / "scratch"
    environ[SITE_ENV] = str(write_site(tmp_path / "site.yaml", scratch))
    run = TrainingRunConfig.from_dict(
        "art-run", {**CONFIG["training"]["runs"]["smollm2-grpo"], "trainer": "art"}
    )
    base = ModelSpec.from_dict("smollm2-135m", CONFIG["models"]["smollm2-135m"])
    with pytest.raises(ArtBackendUnavailable) as stopped:
        ArtTrainer(run, base, tmp_path / "weights", tmp_path / "work", 0)
    message = str(stopped.value)
    assert "an x86_64 CPU (this node's is aarch64" in message
    assert "glibc >= 2.34 (this node has glibc 2.28" in message
    assert "an NVIDIA driver >= 570.26, the first for CUDA 12.8" in message
    assert "found 535.104.05" in message
    # The site's environment was in place first: the runtime was looked for in its scratch.
    assert f"built beforehand in {scratch / 'art' / 'vllm_runtime'} by `make art-runtime`" in (
        message
    )
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    ("glibc", "driver", "lacking"),
    [
        ("2.34", OPEN_DRIVER_570, None),
        ("2.39", OPEN_DRIVER_570.replace("570.86.15", "580.65.06"), None),
        ("2.33", OPEN_DRIVER_570, "glibc >= 2.34 (this node has glibc 2.33"),
        ("", OPEN_DRIVER_570, "glibc >= 2.34 (this node has another C library"),
        ("2.34", OPEN_DRIVER_570.replace("570.86.15", "565.57.01"), "found 565.57.01"),
        ("2.34", None, "found none: no "),
    ],
)
def test_a_node_fits_the_runtime_from_glibc_2_34_and_driver_570_26(
    environ: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    glibc: str,
    driver: str | None,
    lacking: str | None,
) -> None:
    """Monkeypatched platform facts of x86_64 nodes, and a runtime prepared in the cache."""
    on_node(monkeypatch, tmp_path, "x86_64", glibc, driver)
    cache = tmp_path / "cache"
    environ["ART_VLLM_RUNTIME_CACHE_DIR"] = str(cache)
    assert prepared_runtime() is None
    server = lay_out_runtime(cache)
    assert prepared_runtime() == server
    shortfalls = gpu_job_shortfalls()
    if lacking is None:
        assert shortfalls == []
    else:
        assert len(shortfalls) == 1
        assert lacking in shortfalls[0]


def test_coordgap_art_runtime_builds_with_art_s_installer_into_the_scratch_cache(
    environ: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """ART's installer is stood in for: the real one downloads the runtime with uv."""
    on_node(monkeypatch, tmp_path, "x86_64", "2.34", None)  # building needs no GPU
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    scratch = tmp_path / "scratch"
    environ[SITE_ENV] = str(write_site(tmp_path / "site.yaml", scratch))
    environ[WANDB_KEY] = "a key"
    built_in = []

    def install() -> Path:
        built_in.append((art.vllm_runtime.get_vllm_runtime_cache_root(), dict(environ)))
        return Path("/runtime/server")

    monkeypatch.setattr(art.vllm_runtime, "ensure_vllm_runtime", install)
    assert main(["art-runtime"]) == 0
    ((cache, seen),) = built_in
    assert cache == scratch / "art" / "vllm_runtime"
    # uv, and the Python it installs, are kept in scratch too.
    assert seen["UV_CACHE_DIR"] == str(scratch / "uv")
    assert seen["UV_PYTHON_INSTALL_DIR"] == str(scratch / "uv-python")
    assert WANDB_KEY not in seen
    assert capsys.readouterr().out == "ART's vLLM runtime is ready: /runtime/server\n"


def test_coordgap_art_runtime_refuses_a_node_unlike_the_gpu_nodes(
    environ: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Monkeypatched platform facts: an aarch64 RHEL 8 node without uv."""
    on_node(monkeypatch, tmp_path, "aarch64", "2.28", None)
    monkeypatch.setattr(shutil, "which", lambda name: None)

    def install() -> Path:
        raise AssertionError("ART's installer ran on a node it cannot build on")

    monkeypatch.setattr(art.vllm_runtime, "ensure_vllm_runtime", install)
    assert main(["art-runtime"]) == 1
    error = capsys.readouterr().err
    assert error.startswith("ART's vLLM runtime cannot be built on this node, which lacks ")
    for lacking in ("an x86_64 CPU", "glibc >= 2.34", "the uv binary on PATH"):
        assert lacking in error
    assert "NVIDIA driver" not in error
