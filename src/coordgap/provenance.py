"""Where results come from: config digests, the code's git commit, the package versions.

``Provenance`` is collected once, when the report is written, so the report states the setup
it was made with; nothing here carries a time, so the same setup gives the same report.

Every job that plays episodes or trains also leaves a small record beside its outputs
(``<output>.provenance.json``; ``provenance.json`` of a training run): the digest of exactly
the config sections its output depends on (``output_sections``), the git commit, the package
versions, the model's source and revision, and the seeds. Before the report is written,
``check_records`` compares every record it is made of with the current config and refuses
outputs that another config made (restored by ``dvc checkout``, copied in, or ``--touch``ed),
naming each of them.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordgap.config.play import ModelSpec, cell_episodes
from coordgap.errors import ExpectedFailure

if TYPE_CHECKING:
    from collections.abc import Sequence

# The packages whose versions decide the numbers: the analysis stack, the workflow, the models,
# the trainers and servers (ART's own vLLM runtime is locked by ART's version), the providers'
# clients. A job's environment holds only some of them; the others are recorded as absent.
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
    "openpipe-art",
    "unsloth",
    "vllm",
    "openai",
    "anthropic",
    "google-genai",
    "langchain-openai",
    "langchain-anthropic",
    "langchain-google-genai",
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


class ProvenanceMismatch(ExpectedFailure, RuntimeError):
    """Outputs were made with other config values than the current config's."""


# What kind of output a record describes: episodes of a model, a training run, a run's
# validation, a selected checkpoint's test grid.
OUTPUT_KINDS = ("episodes", "train", "eval", "test")


def output_sections(config: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    """The config values an output depends on, by dotted key (derived values by a label).

    Args:
        config: The validated config.
        kind: One of ``OUTPUT_KINDS``.
        name: The model (episodes), the run (train, eval) or ``<run>@<policy>`` (test).

    Returns:
        Key -> value; any change among them changes the output.
    """
    common = {"seed": config["seed"], "environment": config["environment"]}
    if kind == "episodes":
        return {
            **common,
            "scenarios.test": config["scenarios"]["test"],
            f"models.{name}": config["models"][name],
            "episodes per cell": cell_episodes(config, name),
        }
    run = name.partition("@")[0]
    base = config["training"]["runs"][run]["base_model"]
    trained = {
        f"training.runs.{run}": config["training"]["runs"][run],
        f"models.{base}": config["models"][base],
    }
    if kind == "train":
        return {**common, "scenarios.train": config["scenarios"]["train"], **trained}
    if kind == "eval":
        return {
            **common,
            "scenarios.validation": config["scenarios"]["validation"],
            **trained,
            "evaluation.every": config["evaluation"]["every"],
            "evaluation.episodes": config["evaluation"]["episodes"],
        }
    if kind == "test":
        # The selection behind the checkpoint reads the validation and its intervals too.
        analysis = config["analysis"]
        return {
            **output_sections(config, "eval", run),
            "scenarios.test": config["scenarios"]["test"],
            "episodes per cell": cell_episodes(config, base),
            "reward": config["reward"],
            **{
                f"analysis.{key}": analysis[key]
                for key in ("confidence", "bootstrap_resamples", "seed")
            },
        }
    raise ValueError(f"output kind must be one of {', '.join(OUTPUT_KINDS)}, not {kind!r}")


def output_identity(config: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    """What a job's record says about its output before the job runs (passed as a param).

    Args:
        config: The validated config.
        kind: One of ``OUTPUT_KINDS``.
        name: As for ``output_sections``.

    Returns:
        The kind, name, digest of ``output_sections``, the section keys, the model and seeds.
    """
    sections = output_sections(config, kind, name)
    if kind == "episodes":
        model, seeds = name, {"seed": config["seed"]}
    else:
        run = config["training"]["runs"][name.partition("@")[0]]
        model, seeds = run["base_model"], {"seed": config["seed"], "run seed": run["seed"]}
    return {
        "kind": kind,
        "name": name,
        "config_digest": config_digest(sections),
        "sections": list(sections),
        "model": ModelSpec.from_dict(model, config["models"][model]).identity(),
        "seeds": seeds,
    }


def write_record(path: str | Path, identity: dict[str, Any], root: str | Path) -> None:
    """Write a job's provenance record: its identity, plus the code and software it ran.

    Args:
        path: The record file (``<output>.provenance.json``).
        identity: ``output_identity`` of the output, as the job's params hold it.
        root: The workflow's folder (its git commit is recorded).
    """
    setup = Provenance.collect({}, root)
    record = {
        **identity,
        "commit": setup.commit,
        "python": setup.python,
        "packages": setup.packages,
    }
    Path(path).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def check_records(config: dict[str, Any], records: Sequence[Path]) -> None:
    """Refuse outputs whose records disagree with the current config.

    Args:
        config: The current config.
        records: The records of every output the report is made of.

    Raises:
        ProvenanceMismatch: Naming every output made with other values, and which sections
            the digests cover.
    """
    stale = []
    for path in records:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
        expected = output_identity(config, record["kind"], record["name"])["config_digest"]
        if record["config_digest"] != expected:
            stale.append(
                f"{path} ({record['kind']} of {record['name']}: made with config digest "
                f"{record['config_digest'][:12]} of {', '.join(record['sections'])}; the "
                f"current config gives {expected[:12]})"
            )
    if stale:
        raise ProvenanceMismatch(
            f"{len(stale)} output(s) were made with another config than the current one; "
            "rerun them (snakemake --forcerun <their rules>) or restore the config they were "
            "made with:\n  " + "\n  ".join(stale)
        )
