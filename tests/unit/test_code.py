"""The code a job executes (coordgap.code): import closures, and digests of their meaning."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from coordgap.code import code_digest, import_closure, meaning

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "coordgap"
SCRIPTS = ROOT / "workflow" / "scripts"


def _closure(script: str) -> set[str]:
    """The closure of an adapter as paths relative to src/coordgap."""
    return {str(path.relative_to(SRC)) for path in import_closure(SCRIPTS / f"{script}.py", SRC)}


def test_play_time_code_holds_no_analysis_or_training_settings():
    episodes = _closure("generate_episodes")
    assert {"env/table.py", "env/reward.py", "episodes.py", "config/play.py"} <= episodes
    # A reward variant's formula, the analysis' or training's settings: none replays episodes.
    assert not episodes & {"env/variants.py", "config/analysis.py", "config/training.py"}
    assert not any(path.startswith(("training/", "evaluation/")) for path in episodes)
    stats = _closure("compute_stats")
    assert "env/variants.py" in stats
    assert not stats & {"env/table.py", "episodes.py", "config/play.py"}


@pytest.mark.parametrize("script", ["generate_episodes", "compute_stats", "write_report"])
def test_the_static_closure_holds_every_module_the_adapter_really_imports(script):
    # The oracle: import what the adapter imports (it cannot run without Snakemake) and list
    # the package's modules Python loaded. The static closure may hold more (lazy imports).
    tree = ast.parse((SCRIPTS / f"{script}.py").read_text())
    imports = [
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom) and node.module != "__future__"
    ]
    probe = "\n".join(
        [
            *imports,
            "import sys",
            "print('\\n'.join(sorted(m for m in sys.modules if m.split('.')[0] == 'coordgap')))",
        ]
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert loaded, "the adapter imports nothing of the package"
    closure = {
        ".".join(("coordgap", *Path(path).with_suffix("").parts)).removesuffix(".__init__")
        for path in _closure(script)
    }
    assert set(loaded) <= closure, set(loaded) - closure


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "coordgap"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_relative_and_submodule_imports_are_followed(tmp_path):
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": "",
            "a/b.py": "from . import c\nfrom ..d import e\n",
            "a/c.py": "",
            "d.py": "def e():\n    from coordgap import f\n",
            "f.py": "",
            "unused.py": "",
        },
    )
    script = tmp_path / "script.py"
    script.write_text("import json\nfrom coordgap.a.b import something\n")
    closure = {str(p.relative_to(package)) for p in import_closure(script, package)}
    assert closure == {"__init__.py", "a/__init__.py", "a/b.py", "a/c.py", "d.py", "f.py"}


BODY = '''"""A module."""

LIMIT = 3


def step(x):
    """Advance."""
    # Why: the table wraps.
    return (x + 1) % LIMIT
'''


@pytest.mark.parametrize(
    ("edited", "same"),
    [
        (BODY + "# a comment at the end\n", True),
        (BODY.replace('"""Advance."""', '"""Advance by one seat."""'), True),
        (BODY.replace('"""A module."""', '"""A module, documented better."""'), True),
        (BODY.replace("    # Why: the table wraps.\n", ""), True),
        (BODY.replace("(x + 1) % LIMIT", "(x+1)   %   LIMIT"), True),
        (BODY.replace("LIMIT = 3", "LIMIT = 4"), False),
        (BODY.replace("(x + 1)", "(x + 2)"), False),
        (BODY.replace('    """Advance."""\n', ""), True),
    ],
)
def test_the_digest_follows_meaning_not_text(tmp_path, edited, same):
    original = _package(tmp_path / "original", {"__init__.py": "", "table.py": BODY})
    changed = _package(tmp_path / "changed", {"__init__.py": "", "table.py": edited})
    script = tmp_path / "script.py"
    script.write_text("from coordgap.table import step\n")
    assert (code_digest(script, original) == code_digest(script, changed)) is same
    assert (meaning(original / "table.py") == meaning(changed / "table.py")) is same
