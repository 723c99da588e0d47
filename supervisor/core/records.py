"""Splitting raw log bytes into records.

``split_records`` is a pure function, so the followers, the offline replay and the tests
share one definition of where a record ends; ``RecordBuffer`` wraps it sans-IO (bytes in,
records out, the partial tail held), so the local and the SSH follower are byte transports
around one buffer.  Terminators are ``\n``, ``\r\n`` (one newline) and a lone ``\r``
(a progress-bar redraw); a run of NUL bytes inside a line is a boundary too (see
``_nul_pieces``).  Nothing is ever dropped: every byte consumed belongs to exactly
one record, so ``Record.end`` of one record is ``Record.offset`` of the next and a reader
can resume at any record's end.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from supervisor.core.events import Record

# A record never carries more than this many bytes of text: an over-long line (a progress
# bar without newlines for hours, a binary blob) is cut into pieces so memory stays bounded.
MAX_RECORD_BYTES = 1 << 20

_TERMINATOR = re.compile(rb"[\r\n]")
_LF = 0x0A

# One record per log line: made by tuple.__new__ directly, which skips the named tuple's
# Python-level __new__ (it handles defaults and keywords) and costs a third as much.
_new = tuple.__new__


def _record(text: str, offset: int, end: int, redraw: bool = False) -> Record:
    """``Record(text, offset, end, redraw)``, made faster (see above)."""
    return _new(Record, (text, offset, end, redraw, False, 0))


def unterminated_text(pending: bytes | bytearray, limit: int = 4096) -> str:
    """The text of a follower's bytes that are not a record yet, decoded as records are ('' if
    none): a progress bar's latest redraw, which tqdm leaves unterminated until the next one.
    For display and progress only: it becomes a record once its terminator is written."""
    return bytes(pending[:limit]).rstrip(b"\r").decode("utf-8", "replace")


class RecordBuffer:
    """Bytes in, records out: the state a follower keeps between reads, and no I/O.

    ``feed`` takes the next bytes of the log (in any chunking) and returns the records they
    complete; the unterminated tail is held until its terminator arrives (or ``flush`` at the
    end emits it).  ``offset`` is the log position just past the last record returned: where
    a restarted reader resumes with nothing lost or doubled.  ``end`` is where the next byte
    fed belongs.  ``generation`` counts the restarts from 0 (``restart``); every record
    returned carries it.
    """

    def __init__(self, offset: int = 0, generation: int = 0) -> None:
        if offset < 0 or generation < 0:
            raise ValueError("offset and generation must be >= 0")
        self._offset = offset
        self.generation = generation
        self._pending = bytearray()
        self._peak = 0

    @property
    def offset(self) -> int:
        """Byte offset just past the last record returned (the start of the held bytes)."""
        return self._offset

    @property
    def end(self) -> int:
        """Byte offset of the next byte to feed: ``offset`` plus the held bytes."""
        return self._offset + len(self._pending)

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete last line currently held back."""
        return len(self._pending)

    @property
    def peak(self) -> int:
        """The most bytes held at once (the held line plus one fed chunk)."""
        return self._peak

    def partial_text(self, limit: int = 4096) -> str:
        """The held unterminated tail, decoded (see ``unterminated_text``)."""
        return unterminated_text(self._pending, limit)

    def feed(self, data: bytes) -> list[Record]:
        """The records that ``data``, appended to the held bytes, completes."""
        if self._pending:
            self._pending += data
            self._peak = max(self._peak, len(self._pending))
            if not self._may_complete(data):
                return []
            whole = bytes(self._pending)
        else:
            whole = data  # the common case: no copy
            self._peak = max(self._peak, len(whole))
        batch, used = split_records(whole, self._offset, final=False)
        self._pending = bytearray(whole[used:])
        self._offset += used
        return self._stamped(batch)

    def flush(self) -> list[Record]:
        """The end of the stream: the held partial line (if any) as its final record."""
        batch, used = split_records(bytes(self._pending), self._offset, final=True)
        self._pending = bytearray()
        self._offset += used
        return self._stamped(batch)

    def restart(self) -> None:
        """The log started again from 0 (truncated, or replaced by a new file), after a ``flush``:
        its offsets repeat, so what follows is a new generation."""
        self.reset(0)
        self.generation += 1

    def _stamped(self, batch: list[Record]) -> list[Record]:
        # Generation 0 is the splitter's default: copies are made only after a restart (rare).
        if not self.generation:
            return batch
        return [r._replace(generation=self.generation) for r in batch]

    def reset(self, offset: int) -> None:
        """Drop the held bytes and continue at ``offset`` (``self.offset`` to read them again
        after a broken stream; 0 for a truncated or replaced file, after a ``flush``)."""
        if offset < 0:
            raise ValueError("offset must be >= 0")
        self._pending = bytearray()
        self._offset = offset

    def _may_complete(self, data: bytes) -> bool:
        """Whether splitting could yield a record now.

        The splitter rescans every held byte, so calling it on each small write to a long
        open line would be quadratic; held bytes never contain a terminator except a
        trailing ``\\r`` (it may be half of ``\\r\\n``).
        """
        held_cr = len(self._pending) > len(data) and self._pending[-len(data) - 1] == 0x0D
        return len(self._pending) > MAX_RECORD_BYTES or b"\n" in data or b"\r" in data or held_cr


def split_records(data: bytes, base_offset: int, final: bool = False) -> tuple[list[Record], int]:
    """Split ``data`` (which starts at byte ``base_offset`` of the log) into records.

    Returns the complete records and the number of bytes they consume; the caller keeps
    ``data[consumed:]`` and passes it again, followed by more bytes, on the next call.  The
    result does not depend on how the stream is chunked across calls.

    - ``\n`` and ``\r\n`` end a record; a lone ``\r`` ends one with ``redraw=True``.  A ``\r``
      that is the last byte is held back (it may be the first half of ``\r\n``) unless
      ``final``.
    - A record whose text would exceed ``MAX_RECORD_BYTES`` is cut at that size (moved back
      to a UTF-8 character boundary); each piece that ends at a cut rather than at a
      terminator has ``cut=True``, and the next record continues it.
    - Text is decoded as UTF-8 with ``errors="replace"``.  A run of NUL bytes ends a record and
      is no text of any: ``cmd > log`` truncated by logrotate's ``copytruncate`` (or the job's
      own ``ftruncate``) goes on writing at its old offset, and the gap reads back as NULs; the
      next line, a traceback's first among them, must start a record of its own.
    - With ``final=True`` the trailing partial line (if any) is emitted too, so everything
      is consumed.
    """
    if b"\x00" in data:  # rare (a log truncated under a writer that does not append): the careful way
        return _split_at_nul_runs(data, base_offset, final)
    lines = data.split(b"\n")
    tail = lines.pop()  # what follows the last newline: a partial line
    if ((lines and max(map(len, lines)) > MAX_RECORD_BYTES) or len(tail) > MAX_RECORD_BYTES) and _over_long(lines, tail):
        return _split_general(data, base_offset, final)  # over-long lines: cut them the slow way
    # The common case, done in bulk: C-level split, then one record per piece.
    records: list[Record] = []
    append = records.append
    pos = base_offset
    for line in lines:
        if b"\r" in line:
            pos = _carriage_returns(line, pos, records)
        else:
            end = pos + len(line) + 1
            append(_new(Record, (line.decode("utf-8", "replace"), pos, end, False, False, 0)))
            pos = end
    if tail:
        pos = _partial_tail(tail, pos, records, final)
    return records, pos - base_offset


def _over_long(lines: list[bytes], tail: bytes) -> bool:
    """Whether a record of these lines would be over-long.  A long line is most often a tqdm bar
    written to a file: every redraw starts with ``\r`` and only the bar's end writes a newline, so
    hours of redraws are one "line" of short records (a million redraws read record by record
    by ``_split_general`` took 6 s, three quarters of ``supervise probe`` on such a log)."""
    return any(len(line) > MAX_RECORD_BYTES and max(map(len, line.split(b"\r"))) > MAX_RECORD_BYTES
               for line in (*lines, tail))


def _carriage_returns(line: bytes, pos: int, records: list[Record]) -> int:
    """Records of one newline-terminated ``line`` (given without its ``\\n``) that holds
    ``\\r`` bytes: each lone ``\\r`` ends a redraw, and a last ``\\r`` is half of ``\\r\\n``."""
    parts = line.split(b"\r")
    crlf = not parts[-1]
    if crlf:
        parts.pop()  # the empty piece between the \r and the \n
    last = parts.pop()
    for part in parts:
        end = pos + len(part) + 1
        records.append(_record(part.decode("utf-8", "replace"), pos, end, True))
        pos = end
    end = pos + len(last) + (2 if crlf else 1)
    records.append(_record(last.decode("utf-8", "replace"), pos, end))
    return end


def _partial_tail(tail: bytes, pos: int, records: list[Record], final: bool) -> int:
    """Records of the bytes after the last newline; returns the position consumed."""
    parts = tail.split(b"\r")
    rest = parts.pop()  # after the last \r: b"" when the tail ends with one
    if not final and not rest and parts:
        parts.pop()  # that \r may be the first half of a \r\n still to come: held back
    for part in parts:
        end = pos + len(part) + 1
        records.append(_record(part.decode("utf-8", "replace"), pos, end, True))
        pos = end
    if final and rest:
        records.append(_record(rest.decode("utf-8", "replace"), pos, pos + len(rest)))
        pos += len(rest)
    return pos


def _split_general(data: bytes, base_offset: int, final: bool) -> tuple[list[Record], int]:
    """The record-by-record splitter, which also cuts over-long lines."""
    records: list[Record] = []
    pos = 0
    size = len(data)
    while pos < size:
        found = _TERMINATOR.search(data, pos, min(size, pos + MAX_RECORD_BYTES + 1))
        if found is None:
            if size - pos <= MAX_RECORD_BYTES:
                break  # a partial line: wait for its end
            cut = _cut_point(data, pos)
            records.append(_make(data, pos, cut, cut, base_offset, cut=True))
            pos = cut
            continue
        end, redraw = _terminator_end(data, found.start(), final)
        if end < 0:
            break
        records.append(_make(data, pos, found.start(), end, base_offset, redraw=redraw))
        pos = end
    if final and pos < size:
        records.append(_make(data, pos, size, size, base_offset))
        pos = size
    return records, pos


def _terminator_end(data: bytes, term: int, final: bool) -> tuple[int, bool]:
    """Where the terminator at ``term`` ends and whether it is a redraw; -1 if undecidable yet."""
    if data[term] == _LF:
        return term + 1, False
    if term + 1 < len(data):
        if data[term + 1] == _LF:
            return term + 2, False
        return term + 1, True
    # A trailing \r: the next chunk may start with the \n of a \r\n.
    return (term + 1, True) if final else (-1, False)


def _cut_point(data: bytes, pos: int) -> int:
    """Where to cut an over-long line starting at ``pos``: ``MAX_RECORD_BYTES`` on, moved
    back to the start of a UTF-8 sequence so a character is not turned into two U+FFFD."""
    cut = pos + MAX_RECORD_BYTES
    for lead in range(cut, max(pos, cut - 4), -1):
        byte = data[lead]
        if byte & 0xC0 != 0x80:  # not a continuation byte
            return lead if byte >= 0xC0 else cut
    return cut


def _make(
    data: bytes,
    start: int,
    stop: int,
    end: int,
    base: int,
    *,
    redraw: bool = False,
    cut: bool = False,
) -> Record:
    text = data[start:stop].decode("utf-8", "replace")
    return Record(text=text, offset=base + start, end=base + end, redraw=redraw, cut=cut)


_NUL_RUN = re.compile(rb"\x00+")


def _split_at_nul_runs(data: bytes, base_offset: int, final: bool) -> tuple[list[Record], int]:
    """``split_records`` of data holding NUL bytes: each run of NULs ends the record before it
    (as a terminator would) and is no text: its bytes open the record after it.  A run at the
    end of ``data`` is held back unless ``final`` (the next bytes may continue it), except one
    longer than ``MAX_RECORD_BYTES``: a hole of gigabytes is consumed as it comes, as an empty
    record, never held in memory."""
    records: list[Record] = []
    seg_start = 0  # where the bytes after the last run begin, in ``data``
    open_at: int | None = None  # where the last run began (log offset): the next record starts there
    for run in _nul_runs(data):
        if run.start() > seg_start:  # the bytes before this run end there, whatever they are
            pieces, _ = split_records(data[seg_start:run.start()], base_offset + seg_start, final=True)
            _open_at(pieces, open_at)
            records += pieces
            open_at = None
        if open_at is None:
            open_at = base_offset + run.start()
        seg_start = run.end()
    assert open_at is not None  # data holds a NUL
    if seg_start < len(data):
        pieces, used = split_records(data[seg_start:], base_offset + seg_start, final)
        if not pieces:  # nothing after the run is a record yet: hold from the run on
            return records, open_at - base_offset
        _open_at(pieces, open_at)
        return records + pieces, seg_start + used
    if final or len(data) - (open_at - base_offset) > MAX_RECORD_BYTES:
        records.append(_record("", open_at, base_offset + len(data)))
        return records, len(data)
    return records, open_at - base_offset  # the data ends in a run: held, as a partial line


def _nul_runs(data: bytes) -> Iterator[re.Match[bytes]]:
    """``_NUL_RUN.finditer(data)``, each run found by ``bytes.find`` first: the regex engine looks
    for a run's start a byte at a time, 40 ms a 4 MiB chunk that holds a few (the corpus)."""
    pos = data.find(b"\x00")
    while pos >= 0:
        run = _NUL_RUN.match(data, pos)
        assert run is not None
        yield run
        pos = data.find(b"\x00", run.end())


def _open_at(pieces: list[Record], prefix_at: int | None) -> None:
    """The first record after a NUL run starts at the run: its bytes belong to it."""
    if pieces and prefix_at is not None:
        pieces[0] = pieces[0]._replace(offset=prefix_at)
