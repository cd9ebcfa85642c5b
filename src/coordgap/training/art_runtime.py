"""ART's vLLM runtime on a cluster: where a GPU job keeps its caches, what a node must offer.

ART 0.5.18 serves the policy with a vLLM runtime of its own, which it builds at the first
``register()`` (``art.vllm_runtime.ensure_vllm_runtime``): uv installs the project locked in
ART's wheel (``art/_vllm_runtime``: a Python 3.12, torch built for CUDA 12.8, a vLLM wheel for
x86_64 with glibc >= 2.34; 10-20 GB) into ``ART_VLLM_RUNTIME_CACHE_DIR``. That needs network
access, which GPU nodes often lack, so ``coordgap art-runtime`` (``make art-runtime``) builds
it once beforehand, on a node with the GPU nodes' OS, into the cache the GPU jobs then read;
a GPU job that finds it missing stops at once instead of downloading. docs/art.md has the
steps.

A GPU job of the ``art`` trainer runs with ``job_environment``: its caches under the site's
scratch folder, the model hub offline (weights are prepared beforehand) and W&B off unless
the site allows it, since ART starts a W&B run whenever ``WANDB_API_KEY`` is set and that
stalls on a node without network access.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

from coordgap.errors import ExpectedFailure
from coordgap.site import cache_variables

if TYPE_CHECKING:
    from collections.abc import MutableMapping

# ART is imported inside the functions, so that a process can set the environment here before
# anything imports it (the model hub's client, which ART loads, reads its variables on import).

WANDB_KEY = "WANDB_API_KEY"
DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
# The first Linux driver of each CUDA release (NVIDIA's CUDA Toolkit release notes, "CUDA
# Toolkit and Corresponding Driver Versions").
FIRST_DRIVER = {
    (12, 4): "550.54.14",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}
_WHEEL_PLATFORM = re.compile(r"manylinux_(\d+)_(\d+)_(\w+)\.whl$")
_TORCH_CUDA = re.compile(r"/torch-[^/]*\+cu(\d+)(\d)-")
# "... Kernel Module  570.86.15  ..." or "... Open Kernel Module for x86_64  570.86.15  ...".
_DRIVER_VERSION = re.compile(r"Kernel Module.*?\s(\d+(?:\.\d+)+)\s")


class RuntimeUnavailable(ExpectedFailure, RuntimeError):
    """ART's vLLM runtime cannot be built on this node; the message says what is missing."""


def job_environment(scratch: Path | None, *, wandb: bool) -> dict[str, str]:
    """The variables a GPU job of the ``art`` trainer runs with.

    Args:
        scratch: The folder for the job's caches (``Site.scratch``); None leaves each tool's
            default, mostly under $HOME.
        wandb: Whether ART may start W&B (``Site.wandb``).

    Returns:
        Variable -> value: the cache folders (``coordgap.site.cache_variables``),
        ``HF_HUB_OFFLINE=1`` and,
        unless W&B is allowed, ``WANDB_MODE=disabled``.
    """
    variables = cache_variables(scratch)
    # The weights are prepared beforehand; a hub request from a node without network access
    # would only stall.
    variables["HF_HUB_OFFLINE"] = "1"
    if not wandb:
        variables["WANDB_MODE"] = "disabled"
    return variables


def apply_job_environment(
    scratch: Path | None, *, wandb: bool, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Put ``job_environment`` into effect for this process and the processes it starts.

    ART starts W&B whenever ``WANDB_API_KEY`` is set, so unless W&B is allowed the key is
    removed as well. ART starts its trainer and vLLM as new processes with a copy of this
    environment, so they import the model hub's client with it.

    Args:
        scratch: As for ``job_environment``.
        wandb: As for ``job_environment``.
        environ: The environment to change; ``os.environ`` when None.

    Returns:
        The variables set.
    """
    environ = os.environ if environ is None else environ
    variables = job_environment(scratch, wandb=wandb)
    environ.update(variables)
    if not wandb:
        environ.pop(WANDB_KEY, None)
    return variables


@dataclass(frozen=True, slots=True)
class RuntimeNeeds:
    """What ART's vLLM runtime needs of a node, read from the project ART builds it from.

    Attributes:
        machine: The CPU architecture of its wheels, as ``platform.machine()`` spells it.
        glibc: The oldest glibc all its wheels run on (the newest manylinux tag among them).
        cuda: The CUDA version of its torch build.
        driver: The first NVIDIA Linux driver of that CUDA release.
    """

    machine: str
    glibc: tuple[int, int]
    cuda: tuple[int, int]
    driver: str


def runtime_needs() -> RuntimeNeeds:
    """What ART's vLLM runtime needs, from the wheels its bundled project pins by URL.

    Raises:
        RuntimeUnavailable: Its torch is built for a CUDA release ``FIRST_DRIVER`` lacks.
    """
    from coordgap.training._art import art

    bundle = art.vllm_runtime._bundled_runtime_dir()
    manifest = art.vllm_runtime._load_bundled_manifest(bundle)
    project = tomllib.loads((bundle / manifest.pyproject).read_text())
    requirements = [
        *project["project"]["dependencies"],
        *project["tool"]["uv"]["override-dependencies"],
    ]
    # "name @ <url> ; <marker>": the pinned wheels name their platform in the file name.
    urls = [
        unquote(requirement.split("@", 1)[1].split(";", 1)[0].strip())
        for requirement in requirements
        if "@" in requirement
    ]
    platforms = [match.groups() for url in urls if (match := _WHEEL_PLATFORM.search(url))]
    # ART 0.5.18 pins wheels of one architecture only.
    (machine,) = {machine for _, _, machine in platforms}
    cuda = next((int(m[1]), int(m[2])) for url in urls if (m := _TORCH_CUDA.search(url)))
    if cuda not in FIRST_DRIVER:
        raise RuntimeUnavailable(
            f"ART's vLLM runtime uses torch for CUDA {_dotted(cuda)}, whose minimum NVIDIA "
            "driver coordgap.training.art_runtime.FIRST_DRIVER does not list"
        )
    return RuntimeNeeds(
        machine=machine,
        glibc=max((int(major), int(minor)) for major, minor, _ in platforms),
        cuda=cuda,
        driver=FIRST_DRIVER[cuda],
    )


def node_glibc() -> tuple[int, int] | None:
    """This node's glibc version; None where the C library is another (musl)."""
    library, version = platform.libc_ver()
    if library != "glibc":
        return None
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def node_driver() -> str | None:
    """The loaded NVIDIA kernel driver's version; None where none is loaded."""
    try:
        text = DRIVER_VERSION_FILE.read_text()
    except OSError:
        return None
    match = _DRIVER_VERSION.search(text)
    return None if match is None else match[1]


def platform_shortfalls(needs: RuntimeNeeds) -> list[str]:
    """What this node lacks to build or run ART's vLLM runtime: its CPU and its glibc."""
    shortfalls = []
    machine = platform.machine()
    if machine != needs.machine:
        shortfalls.append(
            f"an {needs.machine} CPU (this node's is {machine}; ART's vLLM runtime has wheels "
            f"for {needs.machine} only)"
        )
    glibc = node_glibc()
    if glibc is None or glibc < needs.glibc:
        found = "another C library" if glibc is None else f"glibc {_dotted(glibc)}"
        shortfalls.append(
            f"glibc >= {_dotted(needs.glibc)} (this node has {found}, RHEL 8 has 2.28; ART's "
            f"vLLM wheel is built for manylinux_{needs.glibc[0]}_{needs.glibc[1]})"
        )
    return shortfalls


def driver_shortfall(needs: RuntimeNeeds) -> str | None:
    """The NVIDIA driver this node lacks for the runtime's CUDA release; None if it has it."""
    driver = node_driver()
    if driver is not None and _numbers(driver) >= _numbers(needs.driver):
        return None
    found = f"found {driver}" if driver else f"found none: no {DRIVER_VERSION_FILE}"
    return (
        f"an NVIDIA driver >= {needs.driver}, the first for CUDA "
        f"{_dotted(needs.cuda)} of the torch in ART's vLLM runtime ({found})"
    )


def prepared_runtime() -> Path | None:
    """ART's vLLM runtime server if it is built in ART's cache folder, else None.

    It is checked as ART checks it before deciding to build it. ``ART_VLLM_RUNTIME_BIN``, a
    server command ART then runs instead, counts as prepared.
    """
    from coordgap.training._art import art

    if command := os.environ.get("ART_VLLM_RUNTIME_BIN"):
        return Path(shlex.split(command)[0])
    runtime = art.vllm_runtime
    manifest = runtime._load_bundled_manifest()
    digest = runtime._manifest_hash(manifest)
    cache = runtime.get_vllm_runtime_cache_root().resolve()
    return runtime._validate_managed_runtime(
        cache / digest, cache_root=cache, manifest=manifest, manifest_hash=digest
    )


def gpu_job_shortfalls() -> list[str]:
    """What this node lacks to serve with ART's vLLM runtime in a GPU job (empty: nothing).

    Run after ``apply_job_environment``: the prepared runtime is looked for in the job's cache.
    """
    from coordgap.training._art import art

    needs = runtime_needs()
    shortfalls = platform_shortfalls(needs)
    if (driver := driver_shortfall(needs)) is not None:
        shortfalls.append(driver)
    if prepared_runtime() is None:
        cache = art.vllm_runtime.get_vllm_runtime_cache_root()
        shortfalls.append(
            f"ART's vLLM runtime, built beforehand in {cache} by `make art-runtime` on a node "
            "with network access and the GPU nodes' OS (GPU jobs download nothing)"
        )
    return shortfalls


def prepare_runtime(scratch: Path | None) -> Path:
    """Build ART's vLLM runtime into the GPU jobs' cache with ART's own installer.

    Building needs network access and no GPU: a login node with the GPU nodes' OS will do.

    Args:
        scratch: The GPU jobs' cache folder (``Site.scratch``; None: the defaults).

    Returns:
        The runtime's server executable.

    Raises:
        RuntimeUnavailable: Naming what this node lacks (CPU architecture, glibc, uv).
    """
    apply_job_environment(scratch, wandb=False)
    from coordgap.training._art import art

    missing = platform_shortfalls(runtime_needs())
    if shutil.which("uv") is None:
        missing.append("the uv binary on PATH (ART installs its runtime with it)")
    if missing:
        raise RuntimeUnavailable(
            "ART's vLLM runtime cannot be built on this node, which lacks " + "; ".join(missing)
        )
    return art.vllm_runtime.ensure_vllm_runtime()


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))
