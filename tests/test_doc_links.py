"""Every relative link in the documentation points at a file or directory of the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted({REPO / "README.md", REPO / "jobs" / "README.md", REPO / "tests" / "perf" / "RESULTS.md",
               *(REPO / "docs").rglob("*.md")})  # the documentation site's pages, generated ones included
# [text](target) and ![alt](target "title"); the target ends at whitespace or ')'.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # https:, mailto:, ...


def relative_links(text: str) -> list[str]:
    """The link targets that name a path (no URL, no bare #anchor), without their #anchor."""
    targets = (m.group(1) for m in _LINK.finditer(text))
    return [t.split("#", 1)[0] for t in targets if not _EXTERNAL.match(t) and not t.startswith("#")]


def test_the_link_pattern_finds_what_markdown_links() -> None:
    text = ('see [a](jobs/README.md), ![pic](docs/x.png "title"), [sec](#usage), [web](https://x.org/a),\n'
            '[b](<tests/perf/RESULTS.md#5-tp>) and [c](../README.md#two-python-environments).')
    assert relative_links(text) == ["jobs/README.md", "docs/x.png", "tests/perf/RESULTS.md", "../README.md"]


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_relative_links_resolve_inside_the_repository(doc: Path) -> None:
    broken = []
    for target in relative_links(doc.read_text(encoding="utf-8")):
        path = (doc.parent / target).resolve()
        if not path.is_relative_to(REPO) or not path.exists():
            broken.append(target)
    assert broken == [], f"{doc.relative_to(REPO)} links to what the repository does not have"
