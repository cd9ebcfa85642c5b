"""Each rule runs in the conda env its jobs' software needs, and each env resolves with pip."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, copy_workflow, run

pytestmark = pytest.mark.workflow

ENVS = ROOT / "workflow" / "envs"
ENV_FILES = sorted(path.name for path in ENVS.glob("*.yaml"))
DEFAULT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())

# Every job of the DAG with its conda env, through Snakemake's own API: its command line
# prints a job's env only under --sdm conda, which runs `conda info` even for a dry run (and a
# test machine has no conda). The DAG is the dry run's (-F), so every job of the study is in it.
JOB_ENVS = """
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, DAGSettings, ResourceSettings

with SnakemakeApi() as api:
    workflow_api = api.workflow(
        resource_settings=ResourceSettings(cores=1),
        config_settings=ConfigSettings(configfiles=[Path(p) for p in sys.argv[1:]]),
        snakefile=Path("Snakefile"),
        workdir=Path.cwd(),
    )
    workflow_api.dag(DAGSettings(forceall=True))
    workflow = workflow_api._workflow
    workflow._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True)
    workflow._build_dag()
    env = lambda spec: spec and str(spec.file.get_path_or_uri(secret_free=True))
    print(json.dumps({
        "rules": {rule.name: [rule.norun, rule.conda_env is not None] for rule in workflow.rules},
        "jobs": [[job.rule.name, dict(job.wildcards_dict), env(job.conda_env_spec)]
                 for job in workflow.dag.jobs],
    }))
"""


@pytest.fixture(scope="module")
def workflow_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the workflow with the default config and config/paper.yaml."""
    return copy_workflow(tmp_path_factory.mktemp("envs") / "project")


@pytest.fixture(scope="module")
def job_envs(workflow_copy: Path) -> dict[str, dict]:
    """Config name -> the rules (norun, has an env) and jobs (rule, wildcards, env file)."""
    plans = {}
    for name, configfiles in (("default", ()), ("paper", ("config/paper.yaml",))):
        result = run(workflow_copy, "python", "-c", JOB_ENVS, *configfiles)
        plans[name] = json.loads(result.stdout.splitlines()[-1])
    return plans


def _normalized(name: str) -> str:
    """A distribution's name as pip's report and a requirement may both spell it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _served(entry: dict) -> bool:
    return entry["kind"] == "openai" and entry["serve"] is not None


def _expected_env(config: dict, rule: str, wildcards: dict[str, str]) -> str:
    """The env file a job needs, from what its model or run is."""
    models, runs = config["models"], config["training"]["runs"]
    if rule.startswith("generate_"):  # a cell of one model, whichever rule plays it
        entry = models[wildcards["model"]]
        if entry["kind"] != "openai":
            return "coordgap.yaml"  # scripted, or in-process on CPU torch
        return "vllm.yaml" if _served(entry) else "api.yaml"
    if rule == "train_grpo":
        return "art.yaml" if runs[wildcards["run"]]["trainer"] == "art" else "coordgap.yaml"
    if rule in ("evaluate_checkpoints", "test_checkpoint"):
        base = models[runs[wildcards["run"]]["base_model"]]
        return "vllm.yaml" if _served(base) else "coordgap.yaml"
    return "coordgap.yaml"


def test_every_rule_that_runs_code_names_an_env(job_envs):
    # The rules are the same under any config: every one that has a script has an env.
    rules = job_envs["paper"]["rules"]
    assert [name for name, (norun, has_env) in rules.items() if not norun and not has_env] == []
    assert {name for name, (norun, _) in rules.items() if norun} == {
        "all",
        "episodes",
        "models",
        "train",
        "evaluate",
    }


@pytest.mark.parametrize("name", ["default", "paper"])
def test_each_job_gets_the_env_file_its_model_kind_needs(job_envs, workflow_copy, name):
    config = DEFAULT if name == "default" else PAPER
    envs_dir = (workflow_copy / "workflow" / "envs").resolve()
    wrong = []
    for rule, wildcards, env in job_envs[name]["jobs"]:
        if env is None:
            continue  # a target rule: no code, no env (the previous test checks that)
        path = Path(env).resolve()
        assert path.parent == envs_dir, f"{rule}: {env}"
        assert path.is_file(), f"{rule}: {env}"
        if path.name != _expected_env(config, rule, wildcards):
            wrong.append((rule, wildcards, path.name))
    assert wrong == []


def test_the_two_configs_use_every_env_file(job_envs):
    # So that the test above checks each env's jobs, and no env file is left unused.
    used = {Path(env).name for plan in job_envs.values() for *_, env in plan["jobs"] if env}
    assert used == set(ENV_FILES)
    paper_rules = {(rule, Path(env).name) for rule, _, env in job_envs["paper"]["jobs"] if env}
    assert {
        ("generate_api_episodes", "api.yaml"),
        ("generate_served_episodes", "vllm.yaml"),
        ("train_grpo", "art.yaml"),
        ("evaluate_checkpoints", "vllm.yaml"),
        ("test_checkpoint", "vllm.yaml"),
    } <= paper_rules
    default_rules = {(rule, Path(env).name) for rule, _, env in job_envs["default"]["jobs"] if env}
    assert {
        ("generate_episodes", "coordgap.yaml"),
        ("train_grpo", "coordgap.yaml"),
        ("evaluate_checkpoints", "coordgap.yaml"),
    } <= default_rules


def _resolve(env_file: str, folder: Path) -> subprocess.Popen[str]:
    """Start pip resolving an env's pip: section as conda would install it, without installing.

    conda writes the section to a requirements file beside its copy of the env file, which
    Snakemake keeps in .snakemake/conda/ of the workdir, and runs pip there: `-e ../..` is the
    checkout. fast-deps reads each wheel's metadata by HTTP range requests, so the CUDA builds
    of torch (GBs with their libraries) are never downloaded: 25-40 s and about 100 MB each.
    """
    env = yaml.safe_load((ENVS / env_file).read_text())
    (pip,) = [dep["pip"] for dep in env["dependencies"] if isinstance(dep, dict)]
    checkout = copy_workflow(folder / "project")
    for part in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / part, checkout / part)
    conda_dir = checkout / ".snakemake" / "conda"
    conda_dir.mkdir(parents=True)
    (conda_dir / "condaenv.requirements.txt").write_text("\n".join(pip) + "\n")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--use-feature=fast-deps",
            "--quiet",
            "--report",
            str(folder / "report.json"),
            "-r",
            "condaenv.requirements.txt",
        ],
        cwd=conda_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, Path]]:
    """Env file -> pip's exit status, its stderr and its report: all envs resolved at once,
    since resolving waits on the package index far more than it computes."""
    folders = {name: tmp_path_factory.mktemp(Path(name).stem) for name in ENV_FILES}
    started = {name: _resolve(name, folder) for name, folder in folders.items()}
    done = {}
    for name, process in started.items():
        _, stderr = process.communicate(timeout=600)
        done[name] = (process.returncode, stderr, folders[name] / "report.json")
    return done


@pytest.mark.slow
@pytest.mark.parametrize("env_file", ENV_FILES)
def test_the_pip_requirements_of_each_env_resolve_together(env_file, resolutions):
    """pip resolves each env's pip: section (``_resolve``), with its pins as written."""
    env = yaml.safe_load((ENVS / env_file).read_text())
    conda = [dep for dep in env["dependencies"] if isinstance(dep, str)]
    (python,) = [dep.split("=", 1)[1] for dep in conda if dep.startswith("python=")]
    # This interpreter resolves it: for another one, pip would take wheels only, and a
    # dependency of dvc (hydra-core's antlr4 runtime) has none.
    assert python == f"{sys.version_info.major}.{sys.version_info.minor}"
    (pip,) = [dep["pip"] for dep in env["dependencies"] if isinstance(dep, dict)]
    returncode, stderr, report = resolutions[env_file]
    assert returncode == 0, stderr[-4000:]

    resolved = {
        _normalized(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert "coordgap" in resolved
    for requirement in pip:
        if pin := re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)", requirement):
            name, version = _normalized(pin.group(1)), pin.group(2)
            assert resolved[name].split("+")[0] == version, requirement
