"""The site file (coordgap.site): defaults, checks naming the key, and each job's resources."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from coordgap.site import (
    SITE_ENV,
    ApiJobs,
    GpuCard,
    SiteError,
    SlurmSite,
    has_gpu_devices,
    load_site,
    site_file,
)

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "profiles" / "slurm" / "site.example.yaml"


def _write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_no_site_file_means_the_cluster_defaults(tmp_path):
    site = load_site(tmp_path / "absent.yaml")
    assert site.slurm.resource_keys() == ()
    assert site.slurm.resources(gpus=1, gpu_memory_gb=80) == {}
    assert (site.api_jobs, site.scratch, site.wandb) == (ApiJobs.CLUSTER, None, False)


def test_the_site_file_is_named_by_the_environment_else_the_user_config(monkeypatch, tmp_path):
    monkeypatch.setenv(SITE_ENV, str(tmp_path / "mine.yaml"))
    assert site_file() == tmp_path / "mine.yaml"
    monkeypatch.delenv(SITE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert site_file() == tmp_path / ".config" / "coordgap" / "site.yaml"


def test_the_example_gives_cpu_and_gpu_jobs_their_partitions_account_and_card():
    site = load_site(EXAMPLE)
    assert site.slurm.resources(gpus=0, gpu_memory_gb=0) == {
        "slurm_partition": "cpu",
        "slurm_account": "my_project",
    }
    # The smallest listed card that holds the model: 48 GB for 30, 80 GB for 60.
    for memory_gb, card in [(0, "l40s"), (30, "l40s"), (48, "l40s"), (60, "h100")]:
        assert site.slurm.resources(gpus=1, gpu_memory_gb=memory_gb) == {
            "slurm_partition": "gpu",
            "slurm_account": "my_project",
            "gpu_model": card,
        }
    assert site.api_jobs_local


def test_a_model_no_listed_card_holds_is_refused_naming_the_key():
    slurm = SlurmSite(gpu_cards=(GpuCard("l40s", 48), GpuCard("a10", 24)))
    with pytest.raises(SiteError, match=r"'slurm.gpu_cards'.*80 GB.*l40s \(48 GB\), a10 \(24 GB\)"):
        slurm.card_for(80)


def test_only_the_keys_the_site_sets_become_resources():
    slurm = SlurmSite(gpu_partition="gpu", gpu_constraint="a100|h100")
    assert slurm.resource_keys() == ("slurm_partition", "constraint")
    # A CPU job of such a site keeps the cluster's default partition.
    assert slurm.resources(gpus=0, gpu_memory_gb=0) == {}
    assert slurm.resources(gpus=1, gpu_memory_gb=0) == {
        "slurm_partition": "gpu",
        "constraint": "a100|h100",
    }


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"slurm": {"partition": "cpu"}}, "key 'slurm': Additional properties"),
        ({"api_jobs": "login_node"}, "key 'api_jobs'"),
        ({"slurm": {"gpu_cards": [{"model": "h100"}]}}, "key 'slurm.gpu_cards.0'"),
        ({"slurm": {"gpu_cards": [{"model": "h100", "memory_gb": 0}]}}, "memory_gb"),
        ({"wandb": "yes"}, "key 'wandb'"),
    ],
)
def test_a_bad_site_file_is_refused_naming_the_file_and_key(tmp_path, document, named):
    path = _write(tmp_path, document)
    with pytest.raises(SiteError, match=f"site file {path}: .*") as raised:
        load_site(path)
    assert named in str(raised.value)


def test_a_site_file_that_is_no_yaml_is_refused_naming_it(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text("slurm: [unclosed\n")
    with pytest.raises(SiteError, match=f"site file {path}: not YAML"):
        load_site(path)


def test_scratch_expands_variables_and_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("COORDGAP_TEST_USER", "ada")
    site = load_site(_write(tmp_path, {"scratch": "~/scratch/$COORDGAP_TEST_USER"}))
    assert site.scratch == tmp_path / "scratch" / "ada"


def test_a_gpu_is_found_by_its_device_nodes_alone(tmp_path):
    # The driver's control nodes exist without a card; a card's node or ROCm's is a GPU.
    (tmp_path / "nvidiactl").touch()
    (tmp_path / "nvidia-uvm").touch()
    assert not has_gpu_devices(tmp_path)
    (tmp_path / "nvidia0").touch()
    assert has_gpu_devices(tmp_path)
    rocm = tmp_path / "rocm"
    rocm.mkdir()
    assert not has_gpu_devices(rocm)
    (rocm / "kfd").touch()
    assert has_gpu_devices(rocm)
