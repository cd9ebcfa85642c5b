"""The report as one self-contained HTML page: ``report.md`` rendered, its figures inline.

A reader opens ``results/report.html`` in a browser (or in Snakemake's HTML report, which
shows it in its Report category) and reads the findings, tables and figures in one page. Every
figure the markdown shows is embedded as a base64 ``data:`` URI, so the page can be mailed or
archived alone; the links to the CSV files beside each figure stay relative, as in the
markdown. Like the markdown, the page carries no timestamp: the same report gives the same
bytes.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from markdown_it import MarkdownIt

_MEDIA_TYPES = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg"}

# Readable without any external resource: no fonts, scripts or stylesheets to fetch.
_STYLE = """
body { font-family: sans-serif; max-width: 76em; margin: 2em auto; padding: 0 1em;
       line-height: 1.45; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: left; }
th { background: #f0f0f0; }
img { max-width: 100%; height: auto; }
code { background: #f4f4f4; padding: 0 0.2em; }
"""


def _inline_figures(tokens: list, folder: Path) -> None:
    """Replace each image's relative source with its file as a data URI."""
    for token in tokens:
        for child in token.children or []:
            if child.type != "image":
                continue
            source = folder / str(child.attrGet("src"))
            media = _MEDIA_TYPES.get(source.suffix.lower())
            if media is None or not source.is_file():
                raise FileNotFoundError(f"the report shows {source}, which is not an image file")
            data = base64.b64encode(source.read_bytes()).decode("ascii")
            child.attrSet("src", f"data:{media};base64,{data}")


def render_html(markdown: str, folder: Path, title: str) -> str:
    """Render a report's markdown as a self-contained page.

    Args:
        markdown: The report's text.
        folder: The folder its relative image links start from (the markdown file's).
        title: The page's title.

    Returns:
        The HTML page.

    Raises:
        FileNotFoundError: An image the markdown shows is missing.
    """
    parser = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = parser.parse(markdown)
    _inline_figures(tokens, folder)
    body = parser.renderer.render(tokens, parser.options, {})
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n"
        f"<body>\n{body}</body>\n</html>\n"
    )


def write_report_html(report_md: str | Path, out_html: str | Path) -> None:
    """Write ``report_md`` as a self-contained HTML page (figures embedded).

    Args:
        report_md: The markdown report.
        out_html: The page; its CSV links are relative, so it belongs beside the markdown.
    """
    report_md = Path(report_md)
    text = report_md.read_text(encoding="utf-8")
    title = text.splitlines()[0].lstrip("# ").strip() if text else "coordgap report"
    Path(out_html).write_text(render_html(text, report_md.parent, title), encoding="utf-8")
