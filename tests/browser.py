"""A real headless browser reads a page: what it parsed and decoded, for the report's tests.

Debian's ``chromium-headless-shell`` loads a probe page that frames the page under test and,
once it has loaded, writes what the browser made of it (tables, images, decoded images,
second-level headings) into its own DOM, which ``--dump-dom`` prints. Without the browser the
test skips, unless ``COORDGAP_REQUIRE_BROWSER`` is set (CI installs it and sets it).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pathlib import Path

BROWSER = "chromium-headless-shell"

_PROBE = """<!DOCTYPE html>
<html><body><pre id="facts">not loaded</pre>
<iframe id="page" src="{page}"></iframe>
<script>
document.getElementById("page").addEventListener("load", () => {{
  const doc = document.getElementById("page").contentDocument;
  const images = [...doc.images];
  document.getElementById("facts").textContent = JSON.stringify({{
    tables: doc.querySelectorAll("table").length,
    images: images.length,
    decoded: images.filter((image) => image.complete && image.naturalWidth > 0).length,
    headings: [...doc.querySelectorAll("h2")].map((heading) => heading.textContent),
  }});
}});
</script></body></html>
"""


def page_facts(page: Path) -> dict[str, Any]:
    """Load ``page`` in the headless browser and return what it parsed and decoded.

    Returns:
        ``tables``, ``images`` and ``decoded`` (images with pixels) counts, and the
        ``headings`` (h2) in order.
    """
    browser = shutil.which(BROWSER)
    if browser is None:
        if os.environ.get("COORDGAP_REQUIRE_BROWSER"):
            pytest.fail(f"{BROWSER} is not installed, and COORDGAP_REQUIRE_BROWSER is set")
        pytest.skip(f"{BROWSER} is not installed (apt-get install {BROWSER})")
    probe = page.with_name(f"probe-{page.name}")
    probe.write_text(_PROBE.format(page=page.name), encoding="utf-8")
    # Root needs --no-sandbox; file pages may read each other only with the last flag.
    dom = subprocess.run(
        [
            browser,
            "--no-sandbox",
            "--allow-file-access-from-files",
            "--virtual-time-budget=10000",
            "--dump-dom",
            probe.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    facts = re.search(r'<pre id="facts">(.*?)</pre>', dom, re.S)
    assert facts is not None, dom[:2000]
    text = html.unescape(facts.group(1))
    assert text != "not loaded", f"{BROWSER} did not load {page}"
    return json.loads(text)
