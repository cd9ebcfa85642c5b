"""The project documents itself: what its files cite is in the repository."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

# Working notes that lived beside the repository, never in it.
OUTSIDE = re.compile(r"DESIGN\.md|\.\./shared|(?<![\w/])reference/")
DOCS = re.compile(r"\bdocs/[\w.-]+\.md")
# A README section named as "(README.md: <heading>)".
README_SECTION = re.compile(r"README\.md: ([^)]+)\)")


def _texts() -> dict[str, str]:
    """Every tracked text file but this one, by its path."""
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    texts = {}
    for path in listed:
        if path == "tests/unit/test_references.py" or not (ROOT / path).is_file():
            continue
        try:
            texts[path] = (ROOT / path).read_text()
        except UnicodeDecodeError:
            continue  # a binary file
    return texts


def test_no_file_cites_a_note_outside_the_repository():
    cited = {path for path, text in _texts().items() if OUTSIDE.search(text)}
    assert not cited


def test_every_cited_doc_and_readme_section_exists():
    headings = {
        line.lstrip("#").strip()
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("#")
    }
    missing = set()
    for path, text in _texts().items():
        missing |= {(path, doc) for doc in DOCS.findall(text) if not (ROOT / doc).is_file()}
        missing |= {(path, name) for name in README_SECTION.findall(text) if name not in headings}
    assert not missing
