"""Hub weights as published: pinned, downloaded unchanged, checked, and never fetched on a GPU.

huggingface_hub downloads from a loopback hub (``hub_server``) that ``HF_ENDPOINT`` points
at. The client reads that variable when it is imported, so every preparation runs in a fresh
interpreter, as the prepare_model job does.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import numpy as np
import pytest
import yaml
from safetensors.numpy import save

from coordgap.config.checks import check_cross_keys
from coordgap.config.keys import ConfigError
from coordgap.config.play import ModelSpec
from coordgap.models.manifest import write_manifest
from coordgap.models.prepare import PROVENANCE, prepare_model
from coordgap.policies.serving import launch
from tests.conftest import ROOT, changed, copy_workflow, run
from tests.integration.hub_server import HubServer, PublishedRepo

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.integration

DEFAULT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
# A tiny model as a hub publishes one: weights in LFS, a transformers-5 tokenizer config (its
# extra_special_tokens a list) that must reach a server byte for byte, and a subfolder of
# Mistral-format files.
REPO = PublishedRepo(
    "tiny-org/tiny-model",
    files={
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "config.json": json.dumps({"model_type": "llama", "hidden_size": 4}).encode(),
        "tokenizer_config.json": json.dumps(
            {"tokenizer_class": "TokenizersBackend", "extra_special_tokens": ["<tool>"]}
        ).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode(),
        "model.safetensors": save({"embed.weight": np.arange(12, dtype=np.float32).reshape(3, 4)}),
        "original/params.json": json.dumps({"dim": 4}).encode(),
        "original/consolidated.safetensors": save({"w": np.ones((2, 2), dtype=np.float16)}),
    },
    lfs=frozenset({"model.safetensors", "original/consolidated.safetensors"}),
)
SOURCE = f"hf:{REPO.repo_id}@{REPO.commit}"
# Another commit id, one the hub does not have.
ABSENT = hashlib.sha1(b"a commit nobody made").hexdigest()
# Runs one preparation, as workflow/scripts/prepare_model.py does.
PREPARE = (
    "import sys; from pathlib import Path; from coordgap.models.prepare import prepare_model; "
    "prepare_model(sys.argv[1], Path(sys.argv[2]))"
)
# A stand-in model server: healthy only if it was started with the hub offline. It is a
# command template, so it has no braces.
OFFLINE_SERVER = """
import os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

if os.environ.get("HF_HUB_OFFLINE") != "1":
    sys.exit("HF_HUB_OFFLINE is " + repr(os.environ.get("HF_HUB_OFFLINE")))

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


@pytest.fixture
def hub() -> Iterator[HubServer]:
    with HubServer(REPO) as server:
        yield server


def _prepare(hub: HubServer, source: str, dest: Path) -> subprocess.CompletedProcess[str]:
    """Prepare ``source`` into ``dest`` in a fresh interpreter that knows only the loopback hub.

    ``dest`` is ``<tmp>/models/<name>``; the client's home is ``<tmp>/hf-home``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env |= {
        "HF_ENDPOINT": hub.url,
        # No token, cache or settings of the user's: the test's own, empty.
        "HF_HOME": str(dest.parent.parent / "hf-home"),
        "NO_PROXY": "127.0.0.1,localhost",
    }
    return subprocess.run(
        [sys.executable, "-c", PREPARE, source, str(dest)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative path, with its bytes."""
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file()
    }


def test_a_hub_source_is_prepared_as_published_at_its_commit(hub, tmp_path):
    dest = tmp_path / "models" / "tiny"
    result = _prepare(hub, SOURCE, dest)
    assert result.returncode == 0, result.stderr

    files = _files(dest)
    provenance = json.loads(files.pop(PROVENANCE))
    assert files == dict(REPO.files)  # byte for byte: nothing was re-saved
    assert provenance["source"] == SOURCE
    assert provenance["repo"] == REPO.repo_id
    assert provenance["revision"] == REPO.commit
    assert provenance["files"] == {
        name: hashlib.sha256(content).hexdigest() for name, content in REPO.files.items()
    }
    assert provenance["huggingface_hub"]
    # Downloaded through a temporary sibling that is gone once renamed.
    assert [path.name for path in dest.parent.iterdir()] == ["tiny"]
    # Every request for the repo asked for the pinned commit, none for a branch. (The client
    # also asks the hub for its list of agent harnesses, and takes the 404 for no list.)
    asked_for_repo = [request for request in hub.requests if f"/{REPO.repo_id}/" in request]
    assert asked_for_repo
    assert all(f"/{REPO.commit}" in request for request in asked_for_repo), asked_for_repo

    write_manifest([dest], tmp_path / "manifest.json")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["tiny"]["revision"] == REPO.commit

    # Prepared once: a second preparation asks the hub nothing and leaves the files as they are.
    asked = len(hub.requests)
    again = _prepare(hub, SOURCE, dest)
    assert again.returncode == 0, again.stderr
    assert hub.requests[asked:] == []
    assert json.loads(_files(dest).pop(PROVENANCE)) == provenance


@pytest.mark.parametrize(
    "revision", ["", "@main", "@v1.0", f"@{REPO.commit[:12]}", f"@{REPO.commit.upper()}"]
)
def test_a_source_that_pins_no_commit_is_refused_before_the_hub_is_asked(hub, tmp_path, revision):
    source = f"hf:{REPO.repo_id}{revision}"
    with pytest.raises(ValueError, match="pin a commit") as refused:
        prepare_model(source, tmp_path / "tiny")
    assert repr(source) in str(refused.value)
    assert hub.requests == []
    assert not (tmp_path / "tiny").exists()


@pytest.mark.parametrize(
    ("config", "path", "key"),
    [
        (DEFAULT, "models/smollm2-135m/source", "models.smollm2-135m.source"),
        (PAPER, "models/qwen3-14b/serve/source", "models.qwen3-14b.serve.source"),
    ],
)
def test_the_config_check_names_the_key_of_a_source_that_pins_no_commit(config, path, key):
    for unpinned in ("hf:Qwen/Qwen3-14B", "hf:Qwen/Qwen3-14B@main"):
        with pytest.raises(ConfigError, match="pin a commit") as refused:
            check_cross_keys(changed(config, path, unpinned))
        assert str(refused.value).startswith(f"config key '{key}': bad model source")
    check_cross_keys(changed(config, path, f"hf:Qwen/Qwen3-14B@{REPO.commit}"))


def test_the_paper_config_leaves_every_served_commit_to_fill_in():
    check_cross_keys(PAPER)
    served = {
        name: entry
        for name, entry in PAPER["models"].items()
        if ModelSpec.from_dict(name, entry).is_served
    }
    assert len(served) == 4
    for name, entry in served.items():
        # Each server reads its prepared folder, never a hub id of its own.
        assert entry["serve"]["source"].startswith("FILL-IN: hf:"), name
        assert entry["serve"]["command"][:3] == ["vllm", "serve", "{weights}"], name


def test_a_placeholder_source_stops_its_preparation(tmp_path):
    source = PAPER["models"]["qwen3-14b"]["serve"]["source"]
    with pytest.raises(ValueError, match="is still a placeholder") as refused:
        prepare_model(source, tmp_path / "models" / "qwen3-14b")
    assert repr(source) in str(refused.value)
    assert list(tmp_path.iterdir()) == []


def test_the_preparation_job_of_a_placeholder_names_its_config_key(tmp_path, tiny_config):
    config = dict(tiny_config)
    config["models"] = {
        **tiny_config["models"],
        "lost": {**DEFAULT["models"]["smollm2-135m"], "source": "FILL-IN: hf:lab/lost@<commit>"},
    }
    project = copy_workflow(tmp_path / "project", config)
    result = run(project, "snakemake", "--cores", "1", "resources/models/lost", check=False)
    assert result.returncode != 0
    log = (project / "logs" / "prepare_model" / "lost.log").read_text()
    assert "config key 'models.lost.source': model source" in log, log
    assert "is still a placeholder" in log, log


@pytest.mark.parametrize(
    ("repo_id", "commit"), [(REPO.repo_id, ABSENT), ("tiny-org/no-such-model", REPO.commit)]
)
def test_a_commit_the_hub_does_not_have_fails_naming_the_source(hub, tmp_path, repo_id, commit):
    source = f"hf:{repo_id}@{commit}"
    dest = tmp_path / "models" / "tiny"
    result = _prepare(hub, source, dest)
    assert result.returncode != 0
    assert f"HubDownloadError: model source {source!r}: cannot download" in result.stderr
    assert hub.url in result.stderr
    # Nothing is left behind: no folder, no partial download beside it.
    assert list(dest.parent.iterdir()) == []


def test_a_download_that_differs_from_the_published_files_is_refused(tmp_path):
    dest = tmp_path / "models" / "tiny"
    with HubServer(REPO, tampered=frozenset({"original/consolidated.safetensors"})) as hub:
        result = _prepare(hub, SOURCE, dest)
    assert result.returncode != 0
    assert (
        f"HubDownloadError: model source {SOURCE!r}: original/consolidated.safetensors differs "
        f"from the file the hub lists at commit {REPO.commit}"
    ) in result.stderr
    assert list(dest.parent.iterdir()) == []


def test_a_model_server_starts_with_the_hub_offline(monkeypatch):
    # Whatever the job's own environment says, its server must not reach the hub.
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    command = [sys.executable, "-c", OFFLINE_SERVER, "{port}"]
    with launch(command, key_env="UNUSED_KEY", health="/health", start_timeout_s=60) as endpoint:
        assert endpoint.base_url.startswith("http://127.0.0.1:")
