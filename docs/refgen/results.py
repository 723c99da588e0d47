"""Pages copied from Markdown files elsewhere in the repository: results/benchmarks.md from
tests/perf/RESULTS.md, reference/job-programs.md from jobs/README.md.  A link to another file of the
repository becomes a link to its page when that file is a page of the site (under docs/), else that
file's path from the repository's root, in code, so it reads the same and never breaks."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"\[([^\]]*)\]\(\s*([^)\s]+)\s*\)")
_EXTERNAL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^#")


def _relinker(source: str, page: str):  # type: ignore[no-untyped-def]
    def relink(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if _EXTERNAL.match(target):
            return match.group(0)
        file, _, anchor = target.partition("#")
        path = posixpath.normpath(posixpath.join(posixpath.dirname(source), file))
        if path.startswith("docs/"):  # a page of the site: link to it from where the copy lives
            rel = posixpath.relpath(path.removeprefix("docs/"), posixpath.dirname(page))
            return f"[{text}]({rel}{'#' + anchor if anchor else ''})"
        path += "/" if file.endswith("/") else ""
        if text.strip("`").rstrip("/") in (file.rstrip("/"), posixpath.basename(file.rstrip("/"))):
            return f"`{path}`"
        return f"{text} (`{path}`)"
    return relink


_ITEM = re.compile(r"^(?:[-*+]|\d+\.) ")


def _blank_before_lists(text: str) -> str:
    """A blank line before a list that follows a paragraph line: GitHub starts a list there, Python-Markdown
    (MkDocs) only after a blank line."""
    out: list[str] = []
    fenced = False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        previous = out[-1] if out else ""
        if (not fenced and _ITEM.match(line) and previous.strip() and not _ITEM.match(previous)
                and not previous.startswith((" ", "|", "#"))):
            out.append("")
        out.append(line)
    return "\n".join(out)


def copy(source: str, page: str) -> str:
    text = _blank_before_lists((REPO / source).read_text(encoding="utf-8"))
    body = _LINK.sub(_relinker(source, page), text)
    first, _, rest = body.partition("\n")
    return (f"{first}\n\n<!-- Generated from {source} by `python docs/gen_reference.py`: edit that file, not this"
            f" one. -->\n\n*Copied from `{source}`; paths in code are from the repository's root.*\n{rest}")


def benchmarks() -> str:
    return copy("tests/perf/RESULTS.md", "results/benchmarks.md")


def job_programs() -> str:
    return copy("jobs/README.md", "reference/job-programs.md")
