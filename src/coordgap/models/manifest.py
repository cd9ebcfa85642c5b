"""The manifest of prepared models: where each one's weights came from, in one file.

Each entry is the model folder's ``provenance.json``: for a hub source its repo, the commit its
files were downloaded at and each file's SHA-256; for a converted source the source file's
digest, the dtype and the software that converted it.
"""

from __future__ import annotations

import json
from pathlib import Path

from coordgap.models.prepare import PROVENANCE


def write_manifest(folders: list[str | Path], out: str | Path) -> None:
    """Collect the provenance of every prepared model folder into one JSON file.

    The file exists even when no model is local, so the prepared-models folder is always a
    complete output (DVC tracks it as one).

    Args:
        folders: Prepared model folders, named after their models.
        out: The manifest to write.
    """
    manifest = {
        Path(folder).name: json.loads((Path(folder) / PROVENANCE).read_text()) for folder in folders
    }
    Path(out).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
