"""The RE2 pattern reader: prefilter literals, first characters, ERE export, renaming."""

from __future__ import annotations

import pytest
import re2

from supervisor.probes._ere import to_posix_ere
from supervisor.probes._literals import first_chars, required_literals
from supervisor.probes._syntax import named_groups, rename_groups


@pytest.mark.parametrize(("pattern", "literals"), [
    (r"Loading weights took (?P<secs>[\d.]+) seconds", [("Loading weights took ", False)]),
    (r"WorkerProc (?:failed to start|hit an exception)\.", [("failed to start", False), ("hit an exception", False)]),
    (r"(?P<service>[A-Za-z0-9][\w.-]*) +\| ", [(" | ", False)]),
    (r"(?i:extract) (?P<n>\d+)", [("extract", True)]),
    (r"\Qa.b\E+", [("a.b", False)]),
    (r"x?y", [("y", False)]),
    (r"\d+", None),
    (r"a|\d", None),
    (r"(?:abc)*", None),
])
def test_required_literals(pattern: str, literals: list[tuple[str, bool]] | None) -> None:
    result = required_literals(pattern)
    assert (None if result is None else list(result)) == literals


def test_required_literals_occur_in_every_match() -> None:
    samples = {
        r"Capturing CUDA graphs \((?P<mode>[^)]*)\):\s+(?P<pct>\d{1,3})%\|": "Capturing CUDA graphs (FULL):  12%|",
        r"(?:torch\.(?:cuda\.)?OutOfMemoryError: )?CUDA out of memory\.": "CUDA out of memory.",
        r"Using '(?P<backend>\w+)' (?P<quant>\w+) MoE backend\.": "Using 'MARLIN' Mxfp4 MoE backend.",
    }
    for pattern, text in samples.items():
        assert re2.search(pattern, text)
        literals = required_literals(pattern)
        assert literals and any(lit in text for lit, _ in literals), pattern


@pytest.mark.parametrize(("pattern", "chars"), [
    (r"\[rank(?P<rank>\d+)\]: ?", {"["}),
    (r"(?:\x1b?\[[\d;]*m)?\((?P<proc>\w+) pid=", {"\x1b", "[", "("}),
    (r"(?:Jan|Feb) \d", {"J", "F"}),
    (r"(?i:ab)", {"a", "A"}),
    (r"[^x]y", None),
    (r"a*", None),
])
def test_first_chars(pattern: str, chars: set[str] | None) -> None:
    result = first_chars(pattern)
    assert (None if result is None else set(result)) == chars


@pytest.mark.parametrize(("pattern", "ere"), [
    (r"took (?P<secs>[\d.]+) s(?:econds)?", r"took ([0-9.]+) s(econds)?"),
    (r"\s+\S*\w\W\D", r"[[:space:]]+[^[:space:]]*[[:alnum:]_][^[:alnum:]_][^0-9]"),
    (r"a.*?b{2,3}?", r"a.*b{2,3}"),
    (r"[^\]\s]+\|", r"[^][:space:]]+\|"),
    (r"(?i:ok) x", r"([oO][kK]) x"),
    (r"\pL+", None),
    (r"(?i)[a-z]", None),
])
def test_posix_ere_export(pattern: str, ere: str | None) -> None:
    assert to_posix_ere(pattern) == ere


def test_group_renaming() -> None:
    renamed = rename_groups(r"(?P<pid>\d+)(?:x)(?<proc>\w+)\(?P<no>", "r0_")
    assert named_groups(renamed) == ["r0_pid", "r0_proc"]
    assert re2.compile(renamed).groupindex.keys() == {"r0_pid", "r0_proc"}
