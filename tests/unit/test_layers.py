"""The layers of src/coordgap and what each may import (docs/architecture.md: Layers)."""

from __future__ import annotations

import pytest

from coordgap.code import PACKAGE_DIR, import_closure

pytestmark = pytest.mark.unit


def _name(path) -> str:
    """``env/table.py`` -> ``env.table``; ``agents/__init__.py`` -> ``agents``."""
    parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(path): path for path in PACKAGE_DIR.rglob("*.py")}


def _matches(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(f"{prefix}.") for prefix in prefixes)


# What play time runs: an episode job imports only these, so that analysis and training code
# never replays an episode (coordgap.code).
PLAY = (
    *("env.table", "env.protocols", "env.observation", "env.reward", "episodes", "data"),
    *("policies", "agents", "config.play", "config.keys"),
)
# What every phase may use: records, seeds and tables, resume state, logs and expected failures,
# tracking, the config.
SHARED = (
    *("provenance", "intervals", "site", "data", "preemption", "resume", "logs", "code"),
    *("errors", "tracking", "config"),
)
# Each rule: the modules it covers, and the prefixes none of them may import, transitively.
RULES = {
    "play": (
        PLAY,
        (
            *("env.variants", "config.analysis", "config.training", "config.checks"),
            *("training", "evaluation", "analysis", "models", "plan", "cli"),
        ),
    ),
    "analysis": (("analysis",), ("policies", "agents", "episodes", "training", "evaluation")),
    "training": (("training",), ("evaluation", "analysis", "plan", "cli")),
    "evaluation": (("evaluation",), ("training", "analysis", "plan", "cli")),
    "shared": (SHARED, ("analysis", "training", "evaluation", "agents", "policies", "plan", "cli")),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_no_module_imports_across_its_layer(rule):
    covered, forbidden = RULES[rule]
    modules = [name for name in MODULES if _matches(name, covered)]
    assert modules, rule
    for name in modules:
        reached = {_name(path) for path in import_closure(MODULES[name], PACKAGE_DIR)}
        crossing = sorted(other for other in reached if _matches(other, forbidden))
        assert not crossing, f"{name} imports {crossing}"


def test_the_rules_cover_every_module():
    covered = {prefix for prefixes, _ in RULES.values() for prefix in prefixes}
    top = {"cli", "plan", "models", "env.variants", "env"}
    left = [name for name in MODULES if not _matches(name, tuple(covered | top)) and name]
    assert not left, left
