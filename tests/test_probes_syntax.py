"""The RE2 pattern reader: prefilter literals, first characters, ERE export, renaming."""

from __future__ import annotations

import pytest
import re2

from supervisor.probes._ere import to_posix_ere
from supervisor.probes._literals import first_chars, required_literals
from supervisor.probes._syntax import named_groups, rename_groups, without_optional_tail


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


@pytest.mark.parametrize(("pattern", "kept"), [
    (r"\biteration\s+(?P<done>\d+)/\s*(?P<total>\d+) \| consumed samples:(?:.*?\| lm loss: (?P<loss>\d+))?",
     r"\biteration\s+(?P<done>\d+)/\s*(?P<total>\d+) \| consumed samples:"),
    (r"(?P<done>\d+)/(?P<total>\d+)\s*(?: \[(?P<elapsed>[\d:]+))?", r"(?P<done>\d+)/(?P<total>\d+)"),
    (r"step (?P<done>\d+)(?:/(?P<total>\d+))?", r"step (?P<done>\d+)(?:/(?P<total>\d+))?"),  # holds a kept group
    (r"a|b(?:c)?", r"a|b(?:c)?"),  # the tail of one alternative only
    (r"x(?:y)?$", r"x(?:y)?$"),  # an assertion ends it
    (r"(?:y)?", r"(?:y)?"),  # nothing would be left
])
def test_without_optional_tail(pattern: str, kept: str) -> None:
    assert without_optional_tail(pattern, frozenset(("done", "total", "desc"))) == kept


def test_without_optional_tail_keeps_the_match_and_its_groups() -> None:
    """Where the pattern matches, the rest matches from the same start and its groups take the
    same spans (RE2's leftmost-first rule): on every built-in probe and every corpus line."""
    from probe_golden import corpus_logs

    from supervisor.probes import load_packs

    keep = frozenset(("done", "total", "desc"))
    lines = [line for path in corpus_logs() for line in path.read_text("utf-8", "replace").splitlines()]
    checked = 0
    for pack in load_packs():
        for probe in pack.probes:
            kept = without_optional_tail(probe.regex, keep)
            if kept == probe.regex:
                continue
            full, short = re2.compile(probe.regex), re2.compile(kept)
            names = [n for n in short.groupindex if n in keep]
            for line in lines:
                a, b = full.search(line), short.search(line)
                assert (a is None) == (b is None), (probe.name, line)
                if a is not None and b is not None:
                    assert a.start() == b.start() and all(a.span(full.groupindex[n]) == b.span(short.groupindex[n]) for n in names), (probe.name, line)
                    checked += 1
    assert checked > 1000
