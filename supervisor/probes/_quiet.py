"""Offline only: the lines of a chunk of log bytes that no probe can read, skipped unsplit.

``supervise probe`` reads a log a chunk at a time.  On a long log most lines match no probe
and start no traceback, yet each was split into a record, decoded, joined back into the
prefilter's batch and walked past by the engine: on a log of such lines that was nearly all
the time.  Here the prefilter scans the chunk's raw bytes once, and only the stretches of
lines it names (``plan_chunk``) are split into records and given to the engine:

- each line holding a hit, and the line before it: a prefix alone on a line lends its
  fields to the next (``_engine.ProbeEngine._lent_fields``);
- each line holding an ESC (the probes read a line with its ANSI codes stripped, so the raw
  bytes may hide a match) or a lone ``\\r`` (a bar's redraws: ``RedrawCoalescer`` sees
  them all, and a line's run of redraws always ends with the line, at its last record);
- the chunk's last line (the record the engine keeps as the one before the next chunk's);
- and everything from the end of a stretch to the start of the next while a traceback is
  open (the replay's loop sees to that: every line of a traceback is read).

A line left out is one the engine would have passed over: the prefilter never misses a line
a probe matches, nor one that may start a traceback (its markers are in the database); the
engine neither reads nor folds such a line (a bar's run of lines goes on past a line between).
So the events, and the report, are those of reading every record (tests/test_probes_quiet.py).

A chunk is read whole, as before, when it holds text that is not UTF-8 (Hyperscan's UTF-8
mode reads valid UTF-8 only), no newline near its end (a bar redrawn with ``\\r`` alone for
hours), or when most of its lines would be read anyway (matches in its first 256 KiB, or
redraws and colours, in more than one line in eight: there the engine's own scan is as quick,
and picking stretches costs a Python step a line): ``plan_chunk`` says None.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Bytes that make a line one to read whatever the prefilter says (see above): a NUL (a run of
# NULs ends a record: ``records._split_at_nul_runs``) and a carriage return not followed by a
# newline; and ESC, which also makes its record a candidate for the probes.
_MUST_READ = (b"\x00", b"\r")
_ESC = b"\x1b"
# A chunk's unterminated tail longer than this: the chunk is read whole (records.split_records
# cuts an over-long line, and holding it back for a newline could hold megabytes).
MAX_TAIL = 64 << 10
# A chunk whose first ``_SAMPLE`` bytes hold more prefilter matches than one in ``_DENSE`` lines is
# read whole (so is one where more lines than that must be read).
_DENSE = 8
_SAMPLE = 256 << 10


@dataclass(frozen=True)
class ChunkPlan:
    """What to read of a chunk of the log (``plan_chunk``)."""

    spans: list[tuple[int, int]]  # the stretches to split and feed, in order, whole lines (offsets in the chunk)
    base: int  # the chunk's log offset: records before it (a redraw held over from the chunk before) were not scanned
    stop: int  # where the lines taken end, in the chunk: the rest waits for the next one
    hits: list[int]  # sorted log offsets of a byte inside each prefilter match (``KnownHits``)
    escapes: list[int]  # sorted log offsets of each ESC: a record holding one is scanned again, uncoloured


def plan_chunk(data: bytes, base: int, final: bool,
               scan: Callable[[bytes, Callable[[], int]], list[int] | None]) -> ChunkPlan | None:
    """What to read of ``data``, the chunk at log offset ``base``; None: read all of it.

    ``scan(text, lines)`` gives an offset inside each match the prefilter finds in ``text``, which
    holds ``lines()`` newlines (None: too many to list, read it all).  The newlines after the sample
    are counted only when a decision needs them, and once (a count of a chunk is a third of its scan):
    a quiet chunk's sample alone already holds more lines than its marks ask for."""
    stop = len(data) if final else data.rfind(b"\n") + 1
    if len(data) - stop > MAX_TAIL:
        return None
    text = data[:stop] if stop < len(data) else data
    if not text.isascii():
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            return None
    # Its first lines first: where most lines would be read, the engine's own scan of the whole
    # chunk is as quick, and scanning it here as well would cost a scan more.
    cut = text.rfind(b"\n", 0, _SAMPLE) + 1 if len(text) > 2 * _SAMPLE else len(text)
    sampled = text.count(b"\n", 0, cut)
    found = scan(text[:cut], lambda: sampled)
    if found is None or len(found) * _DENSE > sampled:
        return None
    counted: list[int] = []

    def rest_lines() -> int:
        if not counted:
            counted.append(text.count(b"\n", cut))
        return counted[0]

    if cut < len(text):
        rest = scan(text[cut:], rest_lines)
        if rest is None:
            return None
        found += [cut + hit for hit in rest]
    found.sort()
    escapes = _every(text, _ESC)
    hits = [base + hit for hit in found]
    escaped = [base + at for at in escapes]
    marks = found + escapes + _must_read(text)
    # More lines than that in the sample alone: not dense, whatever the rest holds (nothing counted).
    if len(marks) * _DENSE > sampled and len(marks) * _DENSE > sampled + (rest_lines() if cut < len(text) else 0):
        return None  # most lines must be read anyway (redraws, colours): read it whole
    if stop:
        marks.append(stop - 1)
    marks.sort()
    spans: list[tuple[int, int]] = []
    end = -1
    for mark in marks:
        if mark < end:
            continue  # inside the stretch already taken
        line = text.rfind(b"\n", 0, mark) + 1
        start = text.rfind(b"\n", 0, line - 1) + 1 if line else 0  # the line before it too
        end = text.find(b"\n", mark) + 1 or stop
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return ChunkPlan(spans, base, stop, hits, escaped)


def _every(text: bytes, byte: bytes) -> list[int]:
    out: list[int] = []
    pos = text.find(byte)
    while pos >= 0:
        out.append(pos)
        pos = text.find(byte, pos + 1)
    return out


def _must_read(text: bytes) -> list[int]:
    """An offset in each line holding one of ``_MUST_READ`` (by ``bytes.find``: a regex
    alternation scans a chunk several times slower)."""
    out: list[int] = []
    for byte in _MUST_READ:
        pos = text.find(byte)
        while pos >= 0:
            if byte == b"\r" and text[pos + 1 : pos + 2] == b"\n":
                pos = text.find(byte, pos + 1)  # a CRLF line's end: nothing to read for it
                continue
            out.append(pos)
            pos = text.find(b"\n", pos)  # the line is taken: on to the next one
            pos = text.find(byte, pos) if pos >= 0 else -1
    return out
