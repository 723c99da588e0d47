"""Which records of a batch some probe might match: the engine's prefilter.

Two scanners may share the work.  Hyperscan (``_hsfilter``) scans for the probe regexes
themselves when the package is there and not turned off; RE2 scans for the required
literals (``_literals``) of the probes Hyperscan does not take (all of them without
Hyperscan).  A record either names is read by the engine, whose RE2 set decides exactly;
the rest are skipped unread.  ``build_prefilter`` says which engine reads (``engine``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from typing import Any

import re2

from supervisor.core.events import Record
from supervisor.probes import _hsfilter
from supervisor.probes._literals import required_literals
from supervisor.probes._pack import re2_options
from supervisor.probes._prefix import ANSI_BYTES_RE
from supervisor.probes._syntax import Literal
from supervisor.probes._traceback import TB_START

_UNANCHORED = re2._Anchor.UNANCHORED
# Literals that may start a traceback; the prefilter must let such lines through.
TRACEBACK_LITERALS: tuple[Literal, ...] = ((TB_START[:-1], False), ('File "', False))


# A batch of at most this many records is scanned by RE2's literal scan of every probe when
# there is one, even beside Hyperscan: a Hyperscan scan call costs a few microseconds whatever
# the batch (its scratch, the callback), which a daemon's batch of 20 worker lines no probe
# matches paid at every read (0.78 against 0.68 us a line); on a long batch where lines worth
# reading are common, one Hyperscan scan beats RE2's scan restarted after each of them.
SMALL_BATCH = 64


class Prefilter:
    """RE2's literal scan (``rx``) and Hyperscan's database (``db``): either may be None, not both.
    ``small``: RE2's literal scan of every probe (None if some probe has no required literal),
    for single records and batches of at most ``SMALL_BATCH``."""

    def __init__(self, rx: Any, db: Any, small: Any = None) -> None:
        self.rx = rx
        self.db = db
        self._small = None if small is None or db is None else Prefilter(small, None)

    def hit(self, data: bytes) -> bool:
        """Whether some probe might match the one record ``data`` (ANSI-stripped)."""
        if self._small is not None:
            return self._small.hit(data)
        if self.rx is not None and self.rx.Match(_UNANCHORED, data, 0, len(data))[0][0] >= 0:
            return True
        return self.db is not None and _hsfilter.HsScanner(self.db, data).first_hit(0) >= 0

    def marks(self, text: bytes, lines: Callable[[], int]) -> list[int] | None:
        """An offset inside each match in ``text`` (raw log bytes, valid UTF-8, ANSI codes and all,
        ``lines()`` newlines: counted only if the scan needs the count), unordered; None when Hyperscan
        stopped counting (see ``HsScanner``).  For ``_quiet`` (a count is a third of a scan's time)."""
        out: list[int] = []
        if self.db is not None:
            scan = _hsfilter.HsScanner(self.db, text, lambda: lines() + 1)
            if scan.everything:
                return None
            out = scan.last_bytes()
        rx = self.rx
        if rx is not None:
            pos, size = 0, len(text)
            while pos < size:
                found = rx.Match(_UNANCHORED, text, pos, size)[0][0]
                if found < 0:
                    break
                out.append(found)
                pos = found + 1  # (every record hit counts: a line may hold several, split by \r)
        return out

    def scanner(self, texts: list[str]) -> Scanner:
        if self._small is not None and len(texts) <= SMALL_BATCH:
            return Scanner(self._small, texts)
        return Scanner(self, texts)


class Scanner:
    """Finds, in one batch of records, the next record where some probe might match."""

    def __init__(self, prefilter: Prefilter, texts: list[str]) -> None:
        buf = "\n".join(texts).encode("utf-8", "replace")
        if b"\x1b" in buf:
            buf = ANSI_BYTES_RE.sub(b"", buf)
        self.ok = buf.count(b"\n") == len(texts) - 1  # a text with its own newline: no scanning
        self._buf = buf
        self._rx = prefilter.rx
        self._hs = _hsfilter.HsScanner(prefilter.db, buf, len(texts)) if prefilter.db is not None else None
        self._idx = 0
        self._pos = 0

    def next_candidate(self, start: int) -> int | None:
        buf = self._buf
        while self._idx < start:
            self._pos = buf.index(b"\n", self._pos) + 1
            self._idx += 1
        pos = self._pos
        hit = self._hs.first_hit(pos) if self._hs is not None else -1
        if self._rx is not None:
            found = self._rx.Match(_UNANCHORED, buf, pos, hit + 1 if hit >= 0 else len(buf))[0][0]
            if found >= 0:
                hit = found
        if hit < 0:
            return None
        skipped = buf.count(b"\n", pos, hit)
        if skipped:
            self._idx += skipped
            self._pos = buf.rindex(b"\n", pos, hit) + 1
        return self._idx


class KnownHits:
    """A batch's candidates from the prefilter's hits found beforehand in the log's raw bytes
    (``_quiet``): ``hits``, sorted, are offsets in the log of a byte inside each match, found in
    the bytes from log offset ``scanned_from`` on.  A record is a candidate when one lies within its
    bytes (a record's text is its bytes, so none is missed), or when it holds an ESC (at
    ``escapes``) and its text without colours is a hit: colour codes may hide a match from a scan
    of the raw bytes.  A record before ``scanned_from`` (the last redraw of a bar, held back by
    the coalescer until a later chunk ends its run) is scanned here, on its own."""

    ok = True

    def __init__(self, prefilter: Prefilter, records: Sequence[Record], hits: Sequence[int],
                 escapes: Sequence[int], scanned_from: int) -> None:
        self._prefilter = prefilter
        self._records = records
        self._hits = hits
        self._escapes = escapes
        self._ends = [record.end for record in records]
        unscanned = 0  # (held records come first, and seldom: a loop, not a list of every offset)
        while unscanned < len(records) and records[unscanned].offset < scanned_from:
            unscanned += 1
        self._unscanned = unscanned

    def next_candidate(self, start: int) -> int | None:
        while start < self._unscanned:
            if self._scanned_alone(start):
                return start
            start += 1
        hit = self._next(self._hits, start)
        while True:
            coloured = self._next(self._escapes, start)
            if coloured is None or (hit is not None and hit <= coloured):
                return hit
            if self._scanned_alone(coloured):
                return coloured
            start = coloured + 1

    def _scanned_alone(self, index: int) -> bool:
        """Whether the prefilter hits record ``index``'s text, scanned on its own without colours."""
        return self._prefilter.hit(ANSI_BYTES_RE.sub(b"", self._records[index].text.encode("utf-8", "replace")))

    def _next(self, offsets: Sequence[int], start: int) -> int | None:
        """The first record from ``start`` whose bytes hold one of ``offsets``."""
        if start >= len(self._records):
            return None
        k = bisect_left(offsets, self._records[start].offset)
        if k == len(offsets):
            return None
        found = bisect_right(self._ends, offsets[k], start)
        return found if found < len(self._records) else None


def build_prefilter(patterns: Sequence[str], tracebacks: bool) -> tuple[Prefilter | None, bool, str]:
    """The prefilter for probe regexes ``patterns`` (plus the traceback markers when
    ``tracebacks``), whether every record must be read instead, and which engine reads."""
    literals: set[Literal] = set(TRACEBACK_LITERALS) if tracebacks else set()
    reason = _hsfilter.disabled_reason()
    plan: _hsfilter.Plan | None = None
    if reason is None and (patterns or literals):
        built = _hsfilter.build(tuple(patterns), tuple(sorted(text for text, _ in literals)))
        if isinstance(built, str):
            reason = built
        else:
            plan = built
    alone = set(range(len(patterns)) if plan is None else plan.alone)
    re2_literals: set[Literal] = literals if plan is None else set()
    every: set[Literal] | None = set(literals)  # the literal scan of every probe, for small batches
    for index, pattern in enumerate(patterns):
        if index not in alone and every is None:
            continue
        found = required_literals(pattern)
        if found is None and index in alone:  # this probe could match anything: read every line
            return None, True, f"re2 (prefilter off: a probe regex needs every line read: {pattern!r})"
        if index in alone:
            re2_literals.update(found or ())
        if every is not None:
            every = None if found is None else every | set(found)
    rx = _literal_scan(re2_literals)
    engine = plan.describe() if plan is not None else f"re2 (prefilter off: {reason or 'no probes'})"
    if rx is None and plan is None:
        return None, False, engine  # no probes and no tracebacks: nothing to look for
    if plan is None:
        return Prefilter(rx, None), False, engine
    return Prefilter(rx, plan.db, _literal_scan(every or set())), False, engine


def _literal_scan(literals: set[Literal]) -> Any:
    """One RE2 alternation of ``literals``; None if there are none."""
    if not literals:
        return None
    parts = [re2.escape(t) if not ci else f"(?i:{re2.escape(t)})" for t, ci in sorted(literals)]
    return re2.compile("|".join(parts), re2_options(capture=False))._regexp
