"""What every phase's settings share: the schema, the config error, placeholders to fill in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coordgap.errors import ExpectedFailure

# The config schema: every key's type and description, and a model entry's defaults.
SCHEMA = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ExpectedFailure, ValueError):
    """An invalid configuration; the message starts with the offending key."""


def check_schema(config: dict[str, Any]) -> None:
    """Check a resolved config against :data:`SCHEMA`, as the workflow does before any job.

    The defaults were filled in as the files were resolved
    (:func:`coordgap.config.overlays.resolve`), so the check sets none: Snakemake's filler
    would also descend into a null ``serve:`` block and fail there.

    Raises:
        snakemake.exceptions.WorkflowError: The first violation, naming the offending key.
    """
    from snakemake.utils import validate

    validate(config, schema=str(SCHEMA), set_default=False)


# Marks a value the user must fill in (config/paper.yaml's API model names): plans and dry runs
# accept it, a job that would use it stops, naming the key.
FILL_IN = "FILL-IN"


def unfilled_keys(node: Any, key: str) -> list[str]:
    """The dotted keys under ``node`` whose value is still a ``FILL-IN`` placeholder.

    Args:
        node: A config value (a section, an entry or a leaf).
        key: Its dotted key, e.g. ``models.gpt-5.4``.

    Returns:
        The keys whose string value starts with ``FILL-IN``, in config order.
    """
    if isinstance(node, dict):
        return [k for name, v in node.items() for k in unfilled_keys(v, f"{key}.{name}")]
    if isinstance(node, list):
        return [k for i, v in enumerate(node) for k in unfilled_keys(v, f"{key}[{i}]")]
    return [key] if isinstance(node, str) and node.startswith(FILL_IN) else []


def check_filled(node: Any, key: str) -> None:
    """Refuse to use a config value that is still a ``FILL-IN`` placeholder.

    Args:
        node: The config value a job is about to use.
        key: Its dotted key.

    Raises:
        ConfigError: Naming the first such key and what it holds.
    """
    keys = unfilled_keys(node, key)
    if keys:
        raise ConfigError(
            f"config key '{keys[0]}' is still a placeholder: fill in the value it describes "
            f"(all placeholders: {', '.join(keys)})"
        )
