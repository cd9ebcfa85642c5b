"""Each DVC stage depends on exactly the code its jobs import (coordgap.code's closures)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from coordgap.code import import_closure
from tests.conftest import ROOT

pytestmark = pytest.mark.workflow

SCRIPTS = Path("workflow") / "scripts"
SRC = Path("src") / "coordgap"
# Adapters of rules outside the study DVC reproduces. The learning-rate pilot runs before a
# study, by hand (README: "Choosing the update: the pilot"); as a stage its outputs would
# have to exist, since `dvc commit` (in `make all`) and `dvc repro` refuse a stage whose outputs
# are absent, a frozen one too.
OUTSIDE_STUDY = {"train_pilot.py"}


def _stages() -> dict[str, list[str]]:
    return {
        name: stage["deps"]
        for name, stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items()
    }


def test_each_stage_lists_the_import_closure_of_its_adapters_and_nothing_else():
    for name, deps in _stages().items():
        scripts = [dep for dep in deps if Path(dep).parent == SCRIPTS]
        assert scripts, f"stage {name} lists no adapter script"
        closure = {
            str(path.relative_to(ROOT))
            for script in scripts
            for path in import_closure(ROOT / script, ROOT / SRC)
        }
        listed = {dep for dep in deps if Path(dep).is_relative_to(SRC)}
        assert listed == closure, (
            f"stage {name}: list these src deps (coordgap.code.import_closure): "
            f"missing {sorted(closure - listed)}, not imported {sorted(listed - closure)}"
        )


def test_every_adapter_belongs_to_a_stage():
    listed = {Path(dep).name for deps in _stages().values() for dep in deps}
    adapters = {path.name for path in (ROOT / SCRIPTS).glob("*.py")} - OUTSIDE_STUDY
    assert adapters <= listed, adapters - listed
    assert not OUTSIDE_STUDY & listed, OUTSIDE_STUDY & listed
