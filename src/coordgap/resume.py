"""Resume state beside a job's outputs, tied to the settings that wrote it.

Snakemake deletes a failed job's declared outputs, so what a killed job had finished must live
outside them. Every job that can be killed halfway keeps it in a ``ResumeFolder``:

* an episode cell's journal (``coordgap.agents.runner``): one part per finished episode;
* a training run's work folder (``coordgap.training.loop``): one commit per finished step,
  and inside it each step's rollouts journalled exactly as a cell's episodes are.

The folder carries a fingerprint of the settings that wrote it: state written under other
settings is discarded, never mixed in. Files in it are written through a temporary name and
renamed into place, so a kill at any moment leaves the old file or the new one, never half of
one.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

logger = logging.getLogger(__name__)


class ResumeFolder:
    """A folder of resume state for one set of settings.

    Opening it keeps what an earlier run with the same fingerprint left, and discards what a
    run with other settings left.

    Args:
        root: The folder; created if missing.
        fingerprint: A canonical rendering of every setting that decides what the state holds.
    """

    def __init__(self, root: Path, fingerprint: str) -> None:
        stamp = root / "fingerprint.json"
        if root.exists() and (not stamp.exists() or stamp.read_text() != fingerprint):
            logger.warning("discarding resume state written with other settings: %s", root)
            shutil.rmtree(root)
        root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(stamp, fingerprint)
        self.root = root

    def remove(self) -> None:
        """Delete the folder once its state is in the job's outputs."""
        shutil.rmtree(self.root)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary name in the same folder."""
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(text)
    os.replace(staged, path)


def share_as_umask(root: Path) -> None:
    """Give ``root`` and all under it the permissions the umask gives a new file or folder.

    Some writers make files private to their owner (``mkdtemp``'s folders, the adapter
    weights safetensors writes); outputs are shared data (a group's results and caches), so
    they get the permissions of every other output.
    """
    umask = os.umask(0)
    os.umask(umask)
    for path in (root, *root.rglob("*")):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def replace_path(source: Path, dest: Path) -> None:
    """Move the file or folder ``source`` to ``dest``, replacing whatever is there."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_dir():
        shutil.rmtree(dest)
    os.replace(source, dest)
