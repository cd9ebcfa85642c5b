"""Every shipped study config: an overlay says only what it changes, and plan counts its jobs."""

from __future__ import annotations

import collections
import re

import pytest
import yaml
from snakemake.utils import available_cpu_count

from coordgap.config.overlays import BASE, REPLACE, resolve
from coordgap.plan import RULES
from coordgap.site import has_gpu_devices
from tests.conftest import ROOT, copy_workflow, plan_lines, planned, run

pytestmark = pytest.mark.workflow

# Every config/*.yaml is a study but the paper's published figures, which reports read; so is
# each example of config/examples/ (README: "Add your own model"), each dry-run here.
STUDIES = sorted(
    path.relative_to(ROOT / "config").as_posix()
    for path in [*(ROOT / "config").glob("*.yaml"), *(ROOT / "config" / "examples").glob("*.yaml")]
    if path.name != "paper_reference.yaml"
)
# The rules that run SmolLM2 in-process, and the job's threads Snakemake prints (none at 1).
MODEL_RULES = {"generate_episodes", "train_grpo", "evaluate_checkpoints", "test_checkpoint"}
JOB = re.compile(r"^rule (\w+):$(.*?)^\s*resources: (.*?)$", re.MULTILINE | re.DOTALL)
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


def _model_jobs(log: str) -> set[tuple[str, str]]:
    """(threads, gpu slots) of every job of a dry run that runs SmolLM2 in-process."""
    jobs = set()
    for rule, body, resources in JOB.findall(log):
        if rule not in MODEL_RULES or (
            rule == "generate_episodes" and "model=smollm2-135m" not in body
        ):
            continue
        threads = re.search(r"^\s*threads: (\d+)$", body, re.MULTILINE)
        gpu = re.search(r"\bgpu=(\d+)", resources)
        jobs.add((threads.group(1) if threads else "1", gpu.group(1) if gpu else "0"))
    return jobs


@pytest.mark.skipif(has_gpu_devices(), reason="on a GPU machine each in-process job holds the slot")
def test_one_thread_jobs_of_a_model_run_side_by_side_on_a_machine_without_a_gpu(tmp_path):
    """The CPU study's ``threads: 1``: each SmolLM2 job takes 1 of --cores 2 and no `gpu` slot.

    So Snakemake runs two at once. The default (``threads: null``) keeps every core for each
    such job and the profile's one `gpu` slot: one at a time.
    """
    project = copy_workflow(tmp_path / "project")
    cores = ("snakemake", "-n", "--cores", "2")
    study = run(project, *cores, "--configfile", "config/study_cpu.yaml")
    assert _model_jobs(study.stdout + study.stderr) == {("1", "0")}
    default = run(project, *cores)
    every_core = str(min(2, available_cpu_count()))
    assert _model_jobs(default.stdout + default.stderr) == {(every_core, "1")}
