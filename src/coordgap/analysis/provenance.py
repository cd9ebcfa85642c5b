"""Where a report comes from: the config's digest, the code's git commit, the package versions.

Collected once, when the report is written, so the report states the setup it was made with;
nothing here carries a time, so the same setup gives the same report.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

# The packages whose versions decide the numbers: the analysis stack, the workflow, the models.
PACKAGES = (
    "coordgap",
    "numpy",
    "polars",
    "pingouin",
    "scipy",
    "matplotlib",
    "snakemake",
    "dvc",
    "langgraph",
    "torch",
    "transformers",
    "peft",
)


@dataclass(frozen=True)
class Provenance:
    """The setup a report was made with.

    Attributes:
        config_digest: SHA-256 of the config as the workflow ran it (canonical JSON).
        commit: The git commit of the workflow, with ``+ uncommitted changes`` when its
            tracked files differ from it; None outside a git checkout.
        python: The Python version.
        packages: Package name -> version (``not installed`` when absent), in ``PACKAGES``
            order.
    """

    config_digest: str
    commit: str | None
    python: str
    packages: dict[str, str]

    @classmethod
    def collect(cls, config: dict[str, Any], root: str | Path) -> Provenance:
        """Collect the provenance of a run of the workflow.

        Args:
            config: The whole config the workflow ran with.
            root: The workflow's folder, whose git commit is reported.

        Returns:
            The provenance.
        """
        return cls(
            config_digest=config_digest(config),
            commit=git_commit(root),
            python=platform.python_version(),
            packages={name: _version(name) for name in PACKAGES},
        )


def config_digest(config: dict[str, Any]) -> str:
    """Hash a config canonically: the same values give the same digest, whatever key order.

    Args:
        config: The config.

    Returns:
        The SHA-256 hex digest of its JSON with sorted keys.
    """
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git(root: str | Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:  # no git on this machine
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit(root: str | Path) -> str | None:
    """The commit checked out at ``root``, marked when tracked files have changed since.

    Args:
        root: A folder inside a git working tree.

    Returns:
        The full commit hash (with ``+ uncommitted changes``), or None outside a git checkout.
    """
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None:
        return None
    changed = _git(root, "status", "--porcelain", "--untracked-files=no")
    return f"{commit} + uncommitted changes" if changed else commit
