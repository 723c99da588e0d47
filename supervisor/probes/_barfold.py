"""Offline only: a run of lines of one progress bar read as its first and its last line.

A log piped to a file holds every draw of a tqdm bar as its own ``\\n``-ended line, and a
Megatron run one ``iteration N/ M`` line per step: most of the lines any probe matches in a
long log are such runs.  The offline report (``_replay``) keeps of a run of one probe's
progress only its first and last event and each bar's final count, so the lines between say
nothing the report shows, yet reading each costs a full pass through the engine and the
summary.  ``RunFold`` lets the engine skip them, but only where skipping cannot change the
report: a line joins the run of the line before only if

- it starts with the same text up to its first digit (the bar's ``_BAR_KEY``, as ``\\r``
  redraws are coalesced), carries no prefix, lends or borrows no prefix fields, no ANSI code,
  nothing that may start a traceback, and no traceback is open;
- the first probe matching it is the run's probe (so no other probe's event is lost), a
  progress probe whose phase is not ``done`` (entering ``done`` depends on the advances
  before it);
- its fields keep the bar: the same description and total, no process field, and no
  ``serving``/``attempt_over`` field (which the report reads from every event).

The last line of a run is held and read in full (as every line was before) when the run
ends; the counts of the lines folded before it are kept in ``folded`` under its offset, for
the report to place each on its bars as it would have placed their events (which bar a count
continues depends on every count before it, ``_identity.BarBook``) and to count them.  The live path never folds: the daemon stores every event (``ProbeEngine(fold_runs=False)``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from supervisor.core.events import Phase, Record
from supervisor.probes._identity import PROCESS_FIELDS

# Fields the report reads from every event, and those that tell bars apart.
_READ_EVERY = ("serving", "attempt_over", *PROCESS_FIELDS)
_BAR_KEY = re.compile(r"[^\d]*")  # a bar's redraws share the text before their first digit
_MIN_KEY = 3  # a shorter key ("[", a date's nothing) is shared by unrelated lines
_MAX_FOLDED = 4096  # counts held for one event: a longer run is read a line in this many, memory bounded


class RunFold:
    """The run being folded: its probe, key and bar, and its held last line."""

    __slots__ = ("counts", "desc", "folded", "held", "index", "key", "last", "total")
    NAMES = frozenset(("done", "total", "desc"))  # the fields a folded line is read for

    def __init__(self) -> None:
        self.index = -1  # the run's probe; -1: no run
        self.key = ""
        self.desc: Any = None
        self.total: Any = None
        self.counts: list[float] = []  # of the run's lines folded so far, the held one's last
        # Offset of a run's last line -> the counts of the lines folded before it.
        self.folded: dict[int, list[float]] = {}
        # The run's latest line, not read yet, with the record before it (for lent fields).
        self.held: tuple[Record, Record] | None = None
        self.last: Record | None = None  # the run's latest line (read, or held)

    def start(self, index: int, layout: Sequence[tuple[int, str, Any]], phase: Phase | None, record: Record,
              fields: dict[str, Any]) -> None:
        """A line just read gave one progress event of probe ``index`` (its groups ``layout``)
        with ``fields``; a run may start.  A probe that may capture a field the report reads
        from every event never folds: a folded line is read for ``NAMES`` only."""
        self.stop()
        if phase is Phase.DONE or any(f in fields for f in _READ_EVERY) or any(
                name in _READ_EVERY for _, name, _ in layout):
            return
        done = fields.get("done")
        if not isinstance(done, (int, float)) or isinstance(done, bool):
            return
        key = _bar_key(record.text)
        if len(key) < _MIN_KEY or key.isspace():
            return
        self.index, self.key, self.last = index, key, record
        self.desc, self.total = fields.get("desc"), fields.get("total")

    def stop(self) -> None:
        self.index = -1
        if self.counts:
            self.counts.clear()  # (release copied what it keeps; no new list a line read)

    def hold(self, prev: Record, record: Record, done: float) -> None:
        self.held = (prev, record)
        self.last = record
        self.counts.append(done)

    def release(self) -> tuple[Record, Record] | None:
        """The held last line, to be read now; the counts folded before it go to ``folded``."""
        held, self.held = self.held, None
        if held is not None and len(self.counts) > 1:
            self.folded[held[1].offset] = self.counts[:-1]
        self.stop()
        return held

    def same_key(self, text: str) -> bool:
        key = self.key
        return (self.index >= 0 and len(self.counts) < _MAX_FOLDED and len(text) > len(key)
                and _continues_key(text, key))

    def keeps_bar(self, fields: dict[str, Any]) -> bool:
        """Whether a line of the run's probe with these fields continues the run."""
        done = fields.get("done")
        return (isinstance(done, (int, float)) and not isinstance(done, bool) and fields.get("desc") == self.desc
                and fields.get("total") == self.total)




class RedrawCoalescer:
    """Of a run of redraws of one bar (records ended by a carriage return, alike up to their
    first digit), passes on the first and the last: the redraws between say nothing the last
    does not, and there may be millions of them."""

    def __init__(self) -> None:
        self._key: str | None = None
        self._held: Record | None = None  # the latest redraw of the run, not passed on yet

    def feed(self, records: Iterable[Record]) -> list[Record]:
        out: list[Record] = []
        for record in records:
            if record.redraw and self._key is not None and _continues_key(record.text, self._key):
                self._held = record  # checked without a regex: an hour of tqdm is tens of thousands
                continue
            out += self.flush()
            self._key = _bar_key(record.text) if record.redraw else None
            out.append(record)
        return out

    def flush(self) -> list[Record]:
        held, self._held = self._held, None
        return [] if held is None else [held]


# A run of redraws alike up to their first digit, in raw bytes: each an ASCII piece
# (no NUL, newline or byte over 0x7f, not over-long: what ``records.split_records`` makes one plain
# record of, whose text is its bytes) ended by a lone \r; the first starts a record; each starts
# with the first's text before its first digit (group 1, the key), then a digit or its end (a piece
# with no digit is its own key: ``\r`` alone, redrawn blank, is a run of empty texts).
_REST = rb"(?:[0-9][^\r\n\x00\x80-\xff]{0,4000})?\r(?=[^\n])"
# (At least 8 more: a shorter run is not worth a Python step.  Possessive: nothing follows the run
# in the pattern, so it never gives a piece back, and the regex engine keeps no backtracking state a
# piece, which for a run of three million cost 650 MiB.)
_REDRAW_RUN = re.compile(rb"(?:(?<=[\r\n])|^)([^0-9\r\n\x00\x80-\xff]{0,4000})" + _REST
                         + rb"(?:\1" + _REST + rb"){8,}+")
_RUNS_WORTH_LOOKING = 256  # bytes a lone \r at least: fewer, and looking costs more than it saves
# A stretch of middle redraws shorter than this is split with the rest: each stretch skipped costs a
# split and a feed more, which short runs (``\r1\r2\r3``) do not repay.
_MIN_SKIP = 2048
_SAMPLE = 64 << 10  # where a chunk is looked at first


def middle_redraws(data: bytes) -> list[tuple[int, int]]:
    """The stretches of ``data`` (which starts at a record's start) that hold only the middle
    redraws of runs ``RedrawCoalescer`` would fold: every record there is a redraw whose records
    before and after are redraws of its run, so the coalescer passes none of them, and a reader may
    skip their bytes unsplit (the first and last of each run are kept).  Found by one regex over
    the bytes: a tqdm bar written to a file for hours is millions of them."""
    lone = data.count(b"\r") - data.count(b"\r\n")
    if lone * _RUNS_WORTH_LOOKING < len(data):
        return []
    if len(data) > 2 * _SAMPLE and not _runs(data, _SAMPLE):
        return []  # \r everywhere, but no long run where it starts: not a bar redrawn for long
    return _runs(data, len(data))


def _runs(data: bytes, stop: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for run in _REDRAW_RUN.finditer(data, 0, stop):
        first_end = data.index(b"\r", run.end(1)) + 1
        last_start = data.rindex(b"\r", run.start(), run.end() - 1) + 1
        if last_start - first_end >= _MIN_SKIP:
            out.append((first_end, last_start))
    return out


def _continues_key(text: str, key: str) -> bool:
    """Whether ``text``'s own key (the text before its first digit) is ``key``: it starts with the
    key, and a digit or nothing follows (``\\d`` is what ``isdecimal`` says: Unicode's Nd)."""
    return text.startswith(key) and (len(text) == len(key) or text[len(key)].isdecimal())


def _bar_key(text: str) -> str:
    found = _BAR_KEY.match(text)
    return found.group() if found else ""
