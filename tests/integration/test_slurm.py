"""The workflow through profiles/slurm: resources in a dry run, and a run on a real cluster.

The run goes through a real Slurm cluster with the real executor plugin (sbatch, squeue). CI
starts a single-node cluster with .ci/slurm.sh; elsewhere, without `sinfo` or without an idle
node, that test skips (COORDGAP_REQUIRE_SLURM=1 makes it fail instead, so CI cannot skip it
silently). The dry run needs no cluster.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
import yaml

from coordgap.analysis.catalog import STATISTICS_FIGURES
from tests.conftest import JOB_HEADER, ROOT, copy_workflow, dry_run_jobs, run, tiny_training_config
from tests.integration.fault_server import FaultServer, api_model_entry, ok

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.slurm]

PROFILE = ("--workflow-profile", "profiles/slurm")
# What a single-node test cluster needs on top of the profile: no account to charge (plugin
# 2.8.0 accepts the flag but still tries to guess one, fails harmlessly and submits without),
# and polling every 2 s instead of intervals sized for a busy shared cluster (the plugin waits
# 40 s before its first status check by default). `--jobs 4`: the profile's 50 is for a cluster.
TEST_CLUSTER_FLAGS = (
    "--slurm-no-account",
    "--slurm-init-seconds-before-status-checks",
    "2",
    "--seconds-between-status-checks",
    "2",
    "--jobs",
    "4",
)
# Rules of the tiny run that go to sbatch, and the localrules (rules/common.smk) it runs.
CLUSTER_RULES = {
    "generate_episodes",
    "compute_stats",
    "compare_models",
    "compare_seeds",
    "compute_monitors",
}
LOCAL_RULES = (
    {"all", "write_model_manifest", "compute_power", "write_report"}
    | {f"index_{phase}" for phase in ("training", "selections", "tests")}
    | {f"plot_{figure.name}" for figure in STATISTICS_FIGURES}
    | {"plot_timeline"}
)
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (.+?)\)\.")


def _no_cluster_reason() -> str | None:
    """Why this machine cannot run a job through Slurm now, or None when it can."""
    if not all(shutil.which(tool) for tool in ("sinfo", "sbatch", "scontrol")):
        return "no Slurm client (sinfo, sbatch, scontrol) on PATH; CI starts one with .ci/slurm.sh"
    try:
        # scontrol ping answers at once when slurmctld is down; sinfo retries for ~10 s.
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
        if ping.returncode != 0:
            answer = (ping.stdout.strip().splitlines() or [""])[0]
            return f"slurmctld is not running (.ci/slurm.sh starts it): {answer}"
        idle = subprocess.run(
            ["sinfo", "--noheader", "--states=idle", "--format=%N"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired as error:
        return f"{error.cmd[0]} did not answer within 30 s (is slurmctld running?)"
    if idle.returncode != 0:
        return f"sinfo failed: {idle.stderr.strip()}"
    if not idle.stdout.strip():
        return "no idle Slurm node (`sinfo --states=idle` lists none)"
    return None


@pytest.fixture
def slurm_cluster() -> None:
    """Skip (or, under COORDGAP_REQUIRE_SLURM=1, fail) without a cluster that takes jobs."""
    reason = _no_cluster_reason()
    if reason is None:
        return
    if os.environ.get("COORDGAP_REQUIRE_SLURM") == "1":
        pytest.fail(f"COORDGAP_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


def _small_config(tiny_config: dict) -> dict:
    """The tiny design cut to three Slurm jobs: two policies, one size, two short episodes."""
    config = copy.deepcopy(tiny_config)
    config["models"] = {name: config["models"][name] for name in ("resource_hierarchy", "silent")}
    config["experiment"] = {**config["experiment"], "sizes": [3], "episodes_per_cell": 2}
    config["environment"]["rounds"] = 2
    config["analysis"]["bootstrap_resamples"] = 100  # the schema's minimum
    config["analysis"]["comparisons"] = [["silent", "resource_hierarchy"]]
    config["analysis"]["timeline"] = {"model": "resource_hierarchy", "n": 3, "episode": 0}
    return config


def _jobs(log: str) -> dict[str, tuple[str, bool]]:
    """Snakemake job id -> (rule, ran as a localrule), from the job headers of a run's log."""
    jobs: dict[str, tuple[str, bool]] = {}
    header: tuple[str, bool] | None = None
    for line in log.splitlines():
        if match := JOB_HEADER.match(line.strip()):
            header = (match.group(2), match.group(1) is not None)
        elif header is not None and line.strip().startswith("jobid:"):
            jobs[line.split(":", 1)[1].strip()] = header
            header = None
    return jobs


def _scontrol_job(slurm_id: str) -> dict[str, str]:
    """A job's record in slurmctld (MinJobAge keeps finished jobs there; no sacct needed)."""
    shown = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", slurm_id],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    # Comment and the paths hold no spaces here; Command= is the last field and may.
    return dict(field.split("=", 1) for field in shown.stdout.split() if "=" in field)


def test_slurm_profile_dry_run_gives_each_rule_its_resources(tmp_path, tiny_config):
    config = copy.deepcopy(tiny_config)
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    # A local model adds a GPU job and a prepare_model job; nothing is executed.
    config["models"]["smollm2-135m"] = default["models"]["smollm2-135m"]
    project = copy_workflow(tmp_path / "project", config)
    result = run(project, "snakemake", *PROFILE, "--dry-run", "all")
    log = result.stdout + result.stderr
    assert "Using workflow specific profile profiles/slurm" in log

    jobs = dry_run_jobs(log)
    by_rule: dict[str, list[tuple[dict[str, str], dict[str, str]]]] = {}
    for rule, wildcards, resources in jobs:
        by_rule.setdefault(rule, []).append((wildcards, resources))
    sizes = len(config["experiment"]["sizes"])
    assert len(by_rule["generate_episodes"]) == len(config["models"]) * sizes, log
    assert len(by_rule["prepare_model"]) == 1, log

    # The rules' presets (rules/common.smk) at the first attempt.
    for wildcards, resources in by_rule["generate_episodes"]:
        assert resources["mem_mb"] == "4000", resources
        assert resources["runtime"] == "60", resources
        # Only the in-process model asks Slurm for a GPU; scripted policies ask for none.
        gpus = "1" if wildcards["model"] == "smollm2-135m" else "0"
        assert resources["gpu"] == gpus, (wildcards, resources)
    # prepare_model as the profile sizes it (a download); compute_stats by its preset.
    sized = [("prepare_model", "8000", "120"), ("compute_stats", "1000", "15")]
    for rule, mem_mb, runtime in sized:
        for _, resources in by_rule[rule]:
            assert (resources["mem_mb"], resources["runtime"]) == (mem_mb, runtime), rule
            assert resources.get("gpu", "0") == "0", (rule, resources)
    # Rules without a preset get the profile's default-resources.
    for rule in ("write_report", "plot_reward"):
        for _, resources in by_rule[rule]:
            assert (resources["mem_mb"], resources["runtime"]) == ("2000", "30"), rule


def test_the_site_file_places_jobs_through_the_workflow_profile(tmp_path):
    """The paper's study in a dry run: the site's values reach every submitted job although
    profiles/slurm sets default-resources and set-resources (which would drop a global
    profile's), and each GPU job asks for the smallest card that holds its model."""
    project = copy_workflow(tmp_path / "project")
    site = _site_file(
        tmp_path,
        slurm={
            "account": "lab",
            "qos": "normal",
            "cpu_partition": "cpu",
            "gpu_partition": "gpu",
            "gpu_cards": [{"model": "l40s", "memory_gb": 48}, {"model": "h100", "memory_gb": 80}],
        },
    )
    # The target goes before --configfile, which takes a list.
    result = run(project, "snakemake", "all", *PROFILE, "--dry-run", "--configfile",
                 "config/paper.yaml", site=site)  # fmt: skip
    jobs = dry_run_jobs(result.stdout + result.stderr)
    local = {"all", "write_model_manifest", "select_checkpoint", "summarize_selection"}
    placed_rules = set()
    for rule, wildcards, resources in jobs:
        if rule in local or rule.startswith(("plot_", "index_", "write_", "compute_power")):
            continue
        placed = {key: resources.get(key) for key in ("slurm_partition", "slurm_account", "qos")}
        gpu = resources.get("gpu", "0") == "1"
        placed_rules.add(rule)
        assert placed == {
            "slurm_partition": "gpu" if gpu else "cpu",
            "slurm_account": "lab",
            "qos": "normal",
        }, (rule, wildcards, resources)
        if gpu:
            # Mistral-Small-24B and the trained Qwen3 models need 80 GB; the 7B fits 48.
            small = wildcards.get("model") == "deepseek-r1-distill-qwen-7b"
            assert resources["gpu_model"] == ("l40s" if small else "h100"), (rule, wildcards)
    assert placed_rules >= {"prepare_model", "generate_api_episodes", "generate_served_episodes",
                            "train_grpo", "evaluate_checkpoints", "test_checkpoint",
                            "compute_stats"}, placed_rules  # fmt: skip


def test_a_model_no_card_of_the_site_holds_stops_before_any_job(tmp_path):
    project = copy_workflow(tmp_path / "project")
    site = _site_file(tmp_path, slurm={"gpu_cards": [{"model": "a10", "memory_gb": 24}]})
    result = run(project, "snakemake", "all", *PROFILE, "--dry-run", "--configfile",
                 "config/paper.yaml", check=False, site=site)  # fmt: skip
    log = result.stdout + result.stderr
    assert result.returncode != 0
    # Whichever job's resources Snakemake evaluates first stops it: a 48 or an 80 GB model.
    needs = r"site key 'slurm.gpu_cards': a job needs a GPU with (48|80) GB and the site lists"
    assert re.search(f"{needs} only a10 \\(24 GB\\)", log), log


# What the 2-CPU test node can give the model rules of profiles/slurm; its one "GPU" is a
# generic resource without a device (.ci/slurm.sh), which CPU torch never looks for. These
# options take lists: the target goes before them.
MODEL_RULES = ("generate_episodes", "train_grpo", "evaluate_checkpoints", "test_checkpoint")
SMALL_NODE = (
    "--set-resources",
    "prepare_model:mem_mb=4000",
    *(f"{rule}:{key}" for rule in MODEL_RULES for key in ("mem_mb=6000", "runtime=60")),
    "--set-threads",
    *(f"{rule}=2" for rule in MODEL_RULES),
)  # fmt: skip
# The site file of the test cluster: two partitions, an account, and its GPU model.
CI_SITE = {
    "slurm": {
        "account": "coordgap-ci",
        "cpu_partition": "cpu",
        "gpu_partition": "gpu",
        "gpu_cards": [{"model": "ci_card", "memory_gb": 16}],
    },
}


def _site_file(folder: Path, **settings: object) -> Path:
    """Write the test cluster's site file, with ``settings`` on top, into ``folder``."""
    path = folder / "site.yaml"
    path.write_text(yaml.safe_dump({**CI_SITE, **settings}))
    return path


def _placement(slurm_id: str) -> tuple[str, str, str]:
    """Where Slurm ran a job: its partition, account and generic resources (GPUs) asked for."""
    record = _scontrol_job(slurm_id)
    return record["Partition"], record["Account"], record.get("TresPerJob", "")


@pytest.mark.usefixtures("slurm_cluster")
def test_the_training_study_runs_through_a_real_slurm_cluster(tmp_path, smollm2_dir):
    """The tiny trained study, every phase through sbatch: train, validate, select, test.

    With the site file: GPU jobs land in its GPU partition and ask for its card by name, the
    others in its CPU partition, all under its account, as `scontrol show job` records them.
    """
    config = tiny_training_config(smollm2_dir)
    # One step is every phase already: placement is the point here, not what training learns.
    config["training"]["runs"]["tiny-grpo"]["steps"] = 1
    project = copy_workflow(tmp_path / "project", config)
    site = _site_file(tmp_path)
    result = run(
        project,
        "snakemake",
        "all",
        *PROFILE,
        *TEST_CLUSTER_FLAGS,
        *SMALL_NODE,
        check=False,
        site=site,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    jobs = _jobs(log)
    submitted = {job: slurm_id for job, slurm_id, _ in SUBMITTED.findall(log)}
    rules = sorted(jobs[job][0] for job in submitted)
    for rule, count in [
        ("train_grpo", 1),
        ("evaluate_checkpoints", 1),
        ("select_checkpoint", 0),  # a localrule: it reads two small tables
        ("test_checkpoint", 2),
        ("generate_episodes", 2),
    ]:
        assert rules.count(rule) == count, (rule, rules)
    for slurm_id in submitted.values():
        record = _scontrol_job(slurm_id)
        assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), record
    placements = {}
    for job, slurm_id in submitted.items():
        placements.setdefault(jobs[job][0], set()).add(_placement(slurm_id))
    gpu_job = ("gpu", "coordgap-ci", "gres:gpu:ci_card:1")
    cpu_job = ("cpu", "coordgap-ci", "")
    for rule in ("train_grpo", "evaluate_checkpoints", "test_checkpoint"):
        assert placements[rule] == {gpu_job}, (rule, placements)
    # The cells of the in-process model use the GPU; the scripted cells do not.
    assert placements["generate_episodes"] == {gpu_job, cpu_job}, placements
    for rule in ("prepare_model", *sorted(CLUSTER_RULES - {"generate_episodes"})):
        assert placements[rule] == {cpu_job}, (rule, placements)
    results = project / "results"
    assert (results / "train/tiny-grpo/checkpoints/step_0001/adapter_model.safetensors").exists()
    assert (results / "test/tiny-grpo@best_val/n3.parquet").exists()
    assert "## Training and checkpoint selection" in (results / "report.md").read_text()


@pytest.mark.usefixtures("slurm_cluster")
def test_a_job_that_fails_on_the_cluster_is_reported_with_its_log(tmp_path, tiny_config):
    config = _small_config(tiny_config)
    # A local model whose weights are nowhere: its preparation fails on the cluster.
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["models"]["lost"] = {**default["models"]["smollm2-135m"], "source": "/nowhere/lost"}
    project = copy_workflow(tmp_path / "project", config)
    result = run(project, "snakemake", "all", *PROFILE, *TEST_CLUSTER_FLAGS, *SMALL_NODE,
                 check=False)  # fmt: skip
    log = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Error in rule prepare_model" in log, log
    # The job's own log is printed (show-failed-logs), naming what went wrong.
    assert "/nowhere/lost" in log, log
    # keep-going: the other cells still ran on the cluster.
    assert (project / "results/episodes/resource_hierarchy/n3.parquet").exists()


@pytest.mark.usefixtures("slurm_cluster")
def test_tiny_workflow_runs_through_a_real_slurm_cluster_with_api_cells_on_the_submit_host(
    tmp_path, tiny_config
):
    """The tiny design through sbatch: one job per episode cell and statistics rule, the
    localrules in Snakemake's own process. With the site file's ``api_jobs: submit_host``, the
    API cell is a localrule too (its loopback endpoint is only reachable from this host), and
    every other job goes to the site's CPU partition."""
    config = _small_config(tiny_config)
    with FaultServer([ok("think")]) as server:
        config["models"]["api"] = api_model_entry(server.base_url, timeout_s=5, episodes_per_cell=2)
        project = copy_workflow(tmp_path / "project", config)
        site = _site_file(tmp_path, api_jobs="submit_host")
        result = run(project, "snakemake", *PROFILE, *TEST_CLUSTER_FLAGS, "all", check=False,
                     site=site)  # fmt: skip
        log = result.stdout + result.stderr
        assert result.returncode == 0, log
        assert server.requests, "the API cell never called its endpoint"
    assert "Using workflow specific profile profiles/slurm" in log
    assert (project / "results" / "report.md").stat().st_size > 0
    jobs = _jobs(log)
    submissions = SUBMITTED.findall(log)
    submitted = {job: slurm_id for job, slurm_id, _ in submissions}
    # Exactly the cluster rules went to sbatch: one job per scripted episode cell (two), one
    # per statistics rule.
    submitted_rules = sorted(jobs[job][0] for job in submitted)
    cells = ["generate_episodes"] * 2
    assert submitted_rules == sorted([*CLUSTER_RULES - {"generate_episodes"}, *cells]), log
    assert not any(jobs[job][1] for job in submitted), "a localrule was submitted"
    # Job logs go where the profile's slurm-logdir says (the plugin deletes those of
    # successful jobs, so only the paths are checked).
    for job, _, job_log in submissions:
        logdir = (project / "logs" / "slurm" / f"rule_{jobs[job][0]}").resolve()
        assert Path(job_log).resolve().is_relative_to(logdir), log
    # The localrules ran in this process, never through sbatch: the API cell among them.
    local = {rule for job, (rule, is_local) in jobs.items() if is_local and job not in submitted}
    assert local == LOCAL_RULES | {"generate_api_episodes"}, log
    api_jobs = [job for job, (rule, _) in jobs.items() if rule == "generate_api_episodes"]
    assert len(api_jobs) == 1, log

    # Slurm itself ran them: slurmctld still lists each job as completed on the node, under
    # the comment the executor gives it, in the site's CPU partition and account.
    for job, slurm_id in submitted.items():
        record = _scontrol_job(slurm_id)
        assert record["JobState"] == "COMPLETED", record
        assert record["ExitCode"] == "0:0", record
        assert record["Comment"].startswith(f"rule_{jobs[job][0]}"), record
        assert record["NodeList"] != "(null)", record
        assert _placement(slurm_id) == ("cpu", "coordgap-ci", ""), jobs[job]
    # The jobs' outputs and Snakemake logs came back to the project folder.
    for model in ("resource_hierarchy", "silent"):
        assert (project / "results" / "episodes" / model / "n3.parquet").is_file()
        assert (project / "logs" / "generate_episodes" / model / "n3.benchmark.tsv").is_file()
    episodes = pl.read_parquet(project / "results/episodes/api/n3.parquet")
    assert episodes.height == 2
    assert (episodes["status"] == "ok").all(), episodes
