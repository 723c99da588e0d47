"""Taking a log line apart: ANSI codes, stacked prefixes, and the log header.

    (APIServer pid=1) (Worker_TP0 pid=7) ERROR 04-19 16:21:20 [executor.py:857] KeyError: 'x'
    └──────── prefixes (stripped, become fields) ┘└───────── header ─────────────┘└ message ┘

Prefixes come from the packs (vLLM's process tag, torchrun's ``[rank0]:``, docker
compose, journald, ...); they are stripped repeatedly because wrappers stack.  What is
left is the record's ``line``.  A header (level, timestamp, source) is only split off
where the engine needs it: to read a failure's log level and to tell whose traceback a
line belongs to, since ``logger.exception`` repeats the whole header on every line.

Most lines have no prefix, so RE2 (about a microsecond a call) is only asked after a
cheap gate: a rule can only match a line that starts with one of its possible first
characters and contains one of its required literals (both worked out by ``_syntax``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import re2

from supervisor.probes._literals import first_chars, required_literals
from supervisor.probes._pack import Rule, re2_options

# ANSI escape sequences (CSI such as colours and cursor moves, OSC, two-byte escapes).
# A fixed pattern of ours, so Python's engine is safe here, and faster.  It never spans
# a newline, so it can also clean a whole joined batch without merging records.
ANSI_PATTERN = r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b\n]*(?:\x07|\x1b\\)|[@-Z\\-_])"
ANSI_RE = re.compile(ANSI_PATTERN)
ANSI_BYTES_RE = re.compile(ANSI_PATTERN.encode())
# A colour code whose ESC byte was lost on the way (pasted logs): "[1;36m(Worker pid=1) ".
_BARE_SGR = re.compile(r"\[\d{1,3}(?:;\d{1,3})*m")
_LEVELS = {
    "I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL", "D": "DEBUG",
    "WARN": "WARNING", "FATAL": "CRITICAL", "ERR": "ERROR",
}
_INT_FIELDS = frozenset({"pid", "rank", "local_rank"})
_ANCHOR_START = re2._Anchor.ANCHOR_START


class Header(NamedTuple):
    """A line's log header (a tuple: cheaper to make than a frozen dataclass, and made for
    every line a traceback reads)."""

    level: str | None
    ts: str | None
    src: str | None
    message: str  # the line after the header


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text) if "\x1b" in text else text


def normalize_level(level: str | None) -> str | None:
    if level is None:
        return None
    upper = level.upper()
    return _LEVELS.get(upper, upper)


def _contains_any(text: str, literals: tuple[str, ...]) -> bool:
    for literal in literals:  # noqa: SIM110 (a loop, not any() over a generator: called for most lines read)
        if literal in text:
            return True
    return False


class _Rules:
    """Start-anchored rules (prefixes or headers), each behind its gate."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self._compiled: list[tuple[Any, list[tuple[int, str]]]] = []
        # first character -> (rule index, literals one of which must occur, or None)
        self._gate: dict[str, list[tuple[int, tuple[str, ...] | None]]] = {}
        self._ungated: list[tuple[int, tuple[str, ...] | None]] = []  # any first character
        for index, rule in enumerate(rules):
            compiled = re2.compile(rule.regex, re2_options())
            self._compiled.append((compiled._regexp, sorted((i, n) for n, i in compiled.groupindex.items())))
            lits = required_literals(rule.regex)
            needed = None if lits is None or any(ci for _, ci in lits) else tuple(t for t, _ in lits)
            firsts = first_chars(rule.regex)
            if firsts is None:
                self._ungated.append((index, needed))
            else:
                for ch in firsts:
                    self._gate.setdefault(ch, []).append((index, needed))
        if self._ungated:  # merged once here, in rule order, not at every line
            self._gate = {ch: sorted(gated + self._ungated) for ch, gated in self._gate.items()}
        # first character -> the literals one of which some rule needs, or None when a rule
        # needs none (it may match whatever follows): ``may_match``'s whole work on most lines.
        self._any_of: dict[str, tuple[str, ...] | None] = {ch: _any_of(gated) for ch, gated in self._gate.items()}
        self._any_of_ungated = _any_of(self._ungated)

    def may_match(self, text: str) -> bool:
        """False when no rule can match at the start of ``text`` (no RE2 call needed)."""
        if not text:
            return False
        needed = self._any_of.get(text[0], self._any_of_ungated)
        return needed is None or _contains_any(text, needed)

    def match(self, text: str) -> tuple[int, dict[str, str]] | None:
        """(characters matched, named groups) of the first rule matching at the start."""
        if not text:
            return None
        data: bytes | None = None
        for index, needed in self._candidates(text):
            if needed is not None and not _contains_any(text, needed):
                continue
            if data is None:
                data = text.encode("utf-8", "surrogatepass")
            regex, groups = self._compiled[index]
            spans = regex.Match(_ANCHOR_START, data, 0, len(data))
            if spans[0][0] < 0:
                continue
            values: dict[str, str] = {}
            for i, name in groups:
                start, end = spans[i]
                if start >= 0:
                    values[name] = data[start:end].decode("utf-8", "replace")
            end = spans[0][1]
            return (end if text.isascii() else len(data[:end].decode("utf-8", "replace"))), values
        return None

    def _candidates(self, text: str) -> list[tuple[int, tuple[str, ...] | None]]:
        return self._gate.get(text[0], self._ungated)  # in rule order: it decides between several matches


def _any_of(rules: list[tuple[int, tuple[str, ...] | None]]) -> tuple[str, ...] | None:
    """The literals one of which some of ``rules`` needs; None if one needs none."""
    if any(needed is None for _, needed in rules):
        return None
    return tuple(dict.fromkeys(literal for _, needed in rules for literal in needed or ()))


_MAX_GLUED_PREFIX = 80  # characters of prefixes looked for before a marker found mid-line


class LineSplitter:
    def __init__(self, prefixes: Sequence[Rule], headers: Sequence[Rule]) -> None:
        self._prefixes = _Rules(prefixes)
        self._headers = _Rules(headers)

    def may_strip(self, text: str) -> bool:
        """False when ``strip`` would return ``text`` unchanged with no fields."""
        return "\x1b" in text or text[:1] == "[" or self._prefixes.may_match(text)

    def strip(self, text: str) -> tuple[str, dict[str, Any]]:
        """The line without ANSI codes and prefixes, and the prefixes' fields."""
        if "\x1b" in text:
            text = ANSI_RE.sub("", text)
        fields: dict[str, Any] = {}
        while text:
            if text[0] == "[" and (bare := _BARE_SGR.match(text)):
                text = text[bare.end() :]
                continue
            hit = self._prefixes.match(text)
            if hit is None or hit[0] == 0:
                break
            text = text[hit[0] :]
            for name, value in hit[1].items():
                fields[name] = int(value) if name in _INT_FIELDS and value.isdigit() else value
        return text, fields

    def unglue(self, line: str, marker: str) -> tuple[str, dict[str, Any]] | None:
        """The line from a prefix that stands right before ``marker`` mid-line, and its fields.

        A progress bar drawn without a newline (tqdm's last ``\\r`` frame) runs into the next
        write: ``Processed prompts: 0%|...| 0/4 [...][rank0]: Traceback (most recent call
        last):``.  The prefix in front of the marker, not the bar, says whose line it is.
        """
        idx = line.find(marker)
        for start in range(max(0, idx - _MAX_GLUED_PREFIX), idx):
            rest, fields = self.strip(line[start:])
            if fields and rest.startswith(marker):
                return rest, fields
        return None

    def header(self, line: str) -> Header:
        """Split a (prefix-stripped) line into its log header and message."""
        hit = self._headers.match(line)
        if hit is None:
            return Header(None, None, None, line)
        end, groups = hit
        return Header(normalize_level(groups.get("level")), groups.get("ts"), groups.get("src"), line[end:])
