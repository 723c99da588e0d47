"""google-re2's private names, bounded: the probe engine calls a compiled pattern's ``._regexp.Match``
with an ``re2._Anchor`` (a match at a byte offset of a ``bytes`` buffer with no copy, which the public
``re2`` API does not offer), and pyproject.toml caps the dependency below the next minor release.  These
tests say first, in one line, when an upgrade moves one of those names, instead of a probe failing with an
AttributeError deep in a watched attempt; and they find every private name the package reaches, so a new
one cannot be used unchecked."""

from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import re2

from supervisor.probes import re2_options

REPO = Path(__file__).resolve().parents[1]
# Each private name the package reaches, and how the engine uses it.
CHECKED = {"_Anchor", "_regexp"}


def private_re2_uses() -> dict[str, list[str]]:
    """Each ``re2._name`` or ``<pattern>._regexp`` in supervisor/, with where it is."""
    found: dict[str, list[str]] = {}
    for path in sorted((REPO / "supervisor").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(isinstance(n, ast.Import) and any(a.name == "re2" for a in n.names) for n in ast.walk(tree)):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            on_module = isinstance(node.value, ast.Name) and node.value.id == "re2"
            if on_module or node.attr == "_regexp":
                found.setdefault(node.attr, []).append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def missing_private_names(module: Any) -> list[str]:
    """What of the private API the engine relies on this ``re2`` lacks, one line each."""
    missing: list[str] = []
    anchor = getattr(module, "_Anchor", None)
    for name in ("ANCHOR_START", "UNANCHORED"):
        if anchor is None or not hasattr(anchor, name):
            missing.append(f"re2._Anchor.{name}")
    if missing:
        return missing  # the matches below need the anchors
    try:
        compiled = module.compile(r"(?P<n>x+)y", re2_options())
        regexp = compiled._regexp
        spans = regexp.Match(anchor.UNANCHORED, b"zzxxy", 0, 5)
        anchored = regexp.Match(anchor.ANCHOR_START, b"zzxxy", 0, 5)
        if [tuple(s) for s in spans] != [(2, 5), (2, 4)] or anchored[0][0] != -1:
            missing.append(f"a compiled pattern's ._regexp.Match: spans {spans!r}, anchored {anchored!r}")
    except (AttributeError, TypeError) as exc:
        missing.append(f"a compiled pattern's ._regexp.Match(anchor, data, pos, endpos): {exc}")
    return missing


def _cap() -> str:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'"google-re2>=[\d.]+,<([\d.]+)"', text)
    assert found, "pyproject.toml no longer caps google-re2: the probe engine uses its private names (see this file)"
    return found.group(1)


def test_the_package_reaches_only_the_private_names_checked_here() -> None:
    uses = private_re2_uses()
    assert set(uses) <= CHECKED, (f"new private re2 names {sorted(set(uses) - CHECKED)} at "
                                  f"{[w for n in set(uses) - CHECKED for w in uses[n]]}: check them here")
    assert set(uses) == CHECKED, f"no longer used: {sorted(CHECKED - set(uses))}; drop them here and the cap's reason"


def test_the_installed_re2_has_the_private_names_the_engine_uses() -> None:
    version = importlib.metadata.version("google-re2")
    missing = missing_private_names(re2)
    where = sorted({w.split(":")[0] for ws in private_re2_uses().values() for w in ws})
    assert not missing, (f"google-re2 {version} moved {', '.join(missing)}, which {', '.join(where)} use: port them to "
                         f"what it offers now before raising the cap (<{_cap()}) in pyproject.toml")


def test_the_installed_re2_is_within_the_cap() -> None:
    version = importlib.metadata.version("google-re2")
    cap = tuple(int(p) for p in _cap().split("."))
    assert tuple(int(p) for p in version.split(".")[:len(cap)]) < cap, (
        f"google-re2 {version} is past the cap <{_cap()} in pyproject.toml: the private names are checked by "
        "this file; raise the cap only with it passing")


def test_a_moved_name_is_told_in_one_line() -> None:
    without_anchor = SimpleNamespace(compile=re2.compile)
    assert missing_private_names(without_anchor) == ["re2._Anchor.ANCHOR_START", "re2._Anchor.UNANCHORED"]
    no_regexp = SimpleNamespace(_Anchor=re2._Anchor, compile=lambda *a: SimpleNamespace())
    assert [m.split(":")[0] for m in missing_private_names(no_regexp)] == [
        "a compiled pattern's ._regexp.Match(anchor, data, pos, endpos)"]
