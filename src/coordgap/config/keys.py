"""What every phase's settings share: the config error, and placeholders a user fills in."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """An invalid configuration; the message starts with the offending key."""


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
