"""The site file: where this cluster wants each kind of job, and where GPU jobs keep caches.

Settings that belong to a cluster and a user, not to a study, live in one YAML file outside the
repository: ``$COORDGAP_SITE`` if set, else ``~/.config/coordgap/site.yaml``. No file means the
cluster's defaults. The workflow reads it when it is parsed and turns it into each job's
resources (partition, account, QOS, GPU model or constraint); a Snakemake profile's
``default-resources`` cannot carry these, because the workflow profile replaces a user profile's
values for that option whole. Nothing here changes what a job computes, so no output depends on
this file and editing it reruns nothing. ``profiles/slurm/site.example.yaml`` documents every
key; ``workflow/schemas/site.schema.yaml`` checks them, naming the offending key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from coordgap.errors import ExpectedFailure

SITE_ENV = "COORDGAP_SITE"
DEFAULT_SITE_FILE = Path("~/.config/coordgap/site.yaml")
SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "site.schema.yaml"


class SiteError(ExpectedFailure, ValueError):
    """An invalid site file; the message names the file and the offending key."""


class ApiJobs(StrEnum):
    """Where the cells of hosted-API models run."""

    # Submitted like every other job (the compute nodes reach the providers).
    CLUSTER = "cluster"
    # Run by the Snakemake process itself, on the submit host (compute nodes without egress).
    SUBMIT_HOST = "submit_host"


@dataclass(frozen=True, slots=True)
class GpuCard:
    """A GPU model the cluster offers, as its scheduler names it, and its memory."""

    model: str
    memory_gb: float


@dataclass(frozen=True, slots=True)
class SlurmSite:
    """Where jobs go: the values the executor plugin turns into sbatch options."""

    account: str | None = None
    qos: str | None = None
    cpu_partition: str | None = None
    gpu_partition: str | None = None
    # sbatch --constraint of every GPU job (node features, e.g. "a100|h100").
    gpu_constraint: str | None = None
    # The cluster's GPU models; empty means any GPU (sbatch --gpus=N).
    gpu_cards: tuple[GpuCard, ...] = ()

    def resources(self, *, gpus: int, gpu_memory_gb: float) -> dict[str, Any]:
        """The site's Snakemake resources of one job.

        Args:
            gpus: GPUs the job asks for (0 for a CPU job).
            gpu_memory_gb: Memory one of its GPUs must have (0: any card).

        Returns:
            The resources to add to the job's own: slurm_partition, slurm_account, qos and, for
            a GPU job, constraint and gpu_model (the smallest listed card that holds the job).

        Raises:
            SiteError: No listed card has the memory the job needs.
        """
        partition = self.gpu_partition if gpus else self.cpu_partition
        chosen = {"slurm_partition": partition, "slurm_account": self.account, "qos": self.qos}
        if gpus:
            chosen["constraint"] = self.gpu_constraint
            chosen["gpu_model"] = self.card_for(gpu_memory_gb)
        return {key: value for key, value in chosen.items() if value is not None}

    def resource_keys(self) -> tuple[str, ...]:
        """The resources this site gives some job: the keys ``resources`` may return."""
        given = {
            "slurm_partition": self.cpu_partition or self.gpu_partition,
            "slurm_account": self.account,
            "qos": self.qos,
            "constraint": self.gpu_constraint,
            "gpu_model": self.gpu_cards,
        }
        return tuple(key for key, value in given.items() if value)

    def card_for(self, memory_gb: float) -> str | None:
        """The smallest listed GPU model with at least ``memory_gb``; None when none are listed.

        Raises:
            SiteError: Cards are listed and none is large enough.
        """
        if not self.gpu_cards:
            return None
        fitting = [card for card in self.gpu_cards if card.memory_gb >= memory_gb]
        if not fitting:
            listed = ", ".join(f"{card.model} ({card.memory_gb:g} GB)" for card in self.gpu_cards)
            raise SiteError(
                f"site key 'slurm.gpu_cards': a job needs a GPU with {memory_gb:g} GB and the "
                f"site lists only {listed}"
            )
        return min(fitting, key=lambda card: card.memory_gb).model


# Each cache's variable and its folder under the scratch folder. XDG_CACHE_HOME is the scratch
# folder itself, so that the tools that follow it and have no variable here land there too;
# the others here ignore it (ART, Triton, torch inductor, FlashInfer, Unsloth).
SCRATCH_CACHES = {
    "XDG_CACHE_HOME": ".",
    "ART_VLLM_RUNTIME_CACHE_DIR": "art/vllm_runtime",
    "UV_CACHE_DIR": "uv",
    # Not inside uv's cache: the runtime's venv links to this Python, and `uv cache clean`
    # would delete it.
    "UV_PYTHON_INSTALL_DIR": "uv-python",
    "HF_HOME": "huggingface",
    "VLLM_CACHE_ROOT": "vllm",
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    # FlashInfer keeps its JIT-compiled kernels in <this>/.cache/flashinfer.
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    # Unsloth writes its compiled modules to ./unsloth_compiled_cache unless told otherwise.
    "UNSLOTH_COMPILE_LOCATION": "unsloth_compiled_cache",
}


def cache_variables(scratch: Path | None) -> dict[str, str]:
    """The variables that put a GPU job's caches under ``scratch`` (``SCRATCH_CACHES``).

    Args:
        scratch: The site's scratch folder; None leaves each tool's default (mostly $HOME).

    Returns:
        Variable -> folder; empty without a scratch folder.
    """
    if scratch is None:
        return {}
    return {name: str(scratch / folder) for name, folder in SCRATCH_CACHES.items()}


@dataclass(frozen=True, slots=True)
class Site:
    """The whole site file; the defaults are what no file means."""

    path: Path | None = None
    slurm: SlurmSite = field(default_factory=SlurmSite)
    api_jobs: ApiJobs = ApiJobs.CLUSTER
    # Caches of GPU jobs (model hub, ART's vLLM runtime, uv, vLLM, Triton); None: their defaults
    # under $HOME.
    scratch: Path | None = None
    # Whether ART may start Weights & Biases (it does whenever WANDB_API_KEY is set).
    wandb: bool = False

    @property
    def api_jobs_local(self) -> bool:
        """Whether API cells run on the submit host instead of being submitted."""
        return self.api_jobs is ApiJobs.SUBMIT_HOST


def has_gpu_devices(dev: Path = Path("/dev")) -> bool:
    """Whether this machine has a GPU torch could run on: NVIDIA's or ROCm's device nodes.

    Read without importing torch, which would add a second to every Snakemake command.
    """
    return any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists()


def site_file() -> Path:
    """The site file's path: ``$COORDGAP_SITE``, else ``~/.config/coordgap/site.yaml``."""
    return Path(os.environ.get(SITE_ENV) or DEFAULT_SITE_FILE).expanduser()


def load_site(path: Path | None = None) -> Site:
    """Read and check the site file (``site_file()`` unless given); no file gives the defaults.

    Raises:
        SiteError: The file does not parse or breaks the schema; the message names the file
            and the key.
    """
    path = site_file() if path is None else path
    if not path.is_file():
        return Site()
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise SiteError(f"site file {path}: not YAML: {error}") from error
    schema = yaml.safe_load(SCHEMA.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(document), key=str)
    if errors:
        first = errors[0]
        key = ".".join(str(part) for part in first.absolute_path) or "(top level)"
        raise SiteError(f"site file {path}: key '{key}': {first.message}")
    slurm = document.get("slurm") or {}
    cards = tuple(GpuCard(card["model"], float(card["memory_gb"])) for card in
                  slurm.get("gpu_cards", []))  # fmt: skip
    scratch = document.get("scratch")
    return Site(
        path=path,
        slurm=SlurmSite(
            account=slurm.get("account"),
            qos=slurm.get("qos"),
            cpu_partition=slurm.get("cpu_partition"),
            gpu_partition=slurm.get("gpu_partition"),
            gpu_constraint=slurm.get("gpu_constraint"),
            gpu_cards=cards,
        ),
        api_jobs=ApiJobs(document.get("api_jobs", ApiJobs.CLUSTER)),
        scratch=Path(os.path.expandvars(scratch)).expanduser() if scratch else None,
        wandb=bool(document.get("wandb", False)),
    )
