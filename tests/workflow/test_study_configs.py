"""Every shipped study config: an overlay says only what it changes, and plan counts its jobs."""

from __future__ import annotations

import collections

import pytest
import yaml

from coordgap.config.overlays import BASE, REPLACE, resolve
from coordgap.plan import RULES
from tests.conftest import ROOT, copy_workflow, plan_lines, planned, run

pytestmark = pytest.mark.workflow

# Every config/*.yaml is a study but the paper's published figures, which reports read; so is
# each example of config/examples/ (README: "Add your own model"), each dry-run here.
STUDIES = sorted(
    path.relative_to(ROOT / "config").as_posix()
    for path in [*(ROOT / "config").glob("*.yaml"), *(ROOT / "config" / "examples").glob("*.yaml")]
    if path.name != "paper_reference.yaml"
)
# The studies that are overlays; the others write every key out.
OVERLAYS = [
    name for name in STUDIES if BASE in yaml.safe_load((ROOT / "config" / name).read_text())
]


def _leaves(node: object, key: str, replaced: set[str]) -> dict[str, object]:
    """Dotted key -> value of every leaf under ``node``; a replaced mapping counts as one."""
    if not isinstance(node, dict) or not node or key in replaced:
        return {key: node}
    return {
        k: v
        for name, value in node.items()
        for k, v in _leaves(value, f"{key}.{name}", replaced).items()
    }


@pytest.mark.parametrize("name", OVERLAYS)
def test_an_overlay_sets_only_what_differs_from_its_base(name):
    path = ROOT / "config" / name
    overlay = yaml.safe_load(path.read_text())
    base = resolve([path.parent / overlay.pop(BASE)]).config
    replaced = {f".{key}" for key in overlay.pop(REPLACE, [])}
    below = _leaves(base, "", set())
    leaves = _leaves(overlay, "", replaced).items()
    same = [key for key, value in leaves if key in below and below[key] == value]
    assert not same, f"{name} restates its base's {same}"


@pytest.mark.parametrize("name", STUDIES)
def test_plan_counts_the_jobs_of_a_dry_run(tmp_path, name):
    """Per rule, ``coordgap plan`` plans as many jobs as ``snakemake -n`` schedules.

    Only the rules that play episodes (``coordgap.plan.RULES``) are priced, so only those are
    compared: preparing weights, selecting checkpoints and the analysis are not planned.
    """
    project = copy_workflow(tmp_path / "project")
    configfile = ("--configfile", f"config/{name}")
    dry_run = planned(run(project, "snakemake", "-n", *configfile).stdout)
    jobs: collections.Counter[str] = collections.Counter()
    for (rule, _), figures in plan_lines(project, *configfile).items():
        jobs[rule] += int(figures["jobs"])
    assert {rule: count for rule, count in dry_run.items() if rule in RULES} == dict(jobs)


def test_snakemake_and_plan_resolve_several_overlays_alike(tmp_path):
    project = copy_workflow(tmp_path / "project")
    # The default down to one model: its other models, runs and comparisons replaced whole.
    (project / "one.yaml").write_text(
        yaml.safe_dump(
            {
                BASE: "config/config.yaml",
                REPLACE: ["models", "training.runs"],
                "models": {"random": {"kind": "scripted", "policy": "random"}},
                "training": {"runs": {}},
                "analysis": {"comparisons": [], "timeline": {"model": "random"}},
            }
        )
    )
    (project / "small.yaml").write_text(yaml.safe_dump({"experiment": {"sizes": [5, 10]}}))
    files = ("--configfile", "one.yaml", "small.yaml")
    result = run(project, "snakemake", "-n", "episodes", *files)
    assert planned(result.stdout) == {"generate_episodes": 2, "episodes": 1}, result.stdout
    lines = plan_lines(project, *files)
    assert list(lines) == [("generate_episodes", "random")]
    assert lines["generate_episodes", "random"]["jobs"] == 2
    # --config applies last: a model it adds survives one.yaml's replacing the models.
    override = ("--config", "models={extra: {kind: scripted, policy: silent}}")
    result = run(project, "snakemake", "-n", "episodes", *files, *override)
    assert planned(result.stdout) == {"generate_episodes": 4, "episodes": 1}, result.stdout

    # A missing base stops Snakemake and plan alike, naming the file.
    (project / "broken.yaml").write_text(yaml.safe_dump({BASE: "gone.yaml"}))
    for command in (("snakemake", "-n"), ("coordgap", "plan")):
        result = run(project, *command, "--configfile", "broken.yaml", check=False)
        assert result.returncode != 0
        assert "broken.yaml: config key 'base': no such file" in result.stdout + result.stderr
