"""When each stretch of an attempt's log arrived, for `supervise logs --timestamps`.

A log line carries no time of its own; the daemon knows when it read each batch of lines. The
runner notes, per batch, the log position it reached and when (``ArrivalWriter.arrived``), at
most one mark per second of arrival: a later batch within the same second moves that second's
mark forward (one ``pwrite`` over it) instead of adding one.  A line's time is the time of the
first mark at or past the end of its text (its terminator may come later: tqdm writes a redraw's
``\r`` with the next redraw): when it had arrived, to within a second (journalctl's default
resolution), and never before it was written.  Lines read back after a daemon restart carry the
times the backlog estimate gives them (the follower's file times), as their events do.

Marks live in the daemon's state directory (``arrivals/JOB/N.bin``, 20 bytes each: an 18-hour
attempt writing every second keeps ~1.3 MB), for local and remote attempts alike, and are
deleted with the attempt's log (retention) or the job (``rm``); a mark file over ``MAX_BYTES`` is
read no further.  Writing never raises into the runner: a disk that refuses is logged once and
the log simply has no times from then on.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import shutil
import struct
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import structlog

from supervisor.core.filemodes import PRIVATE_UMASK

log = structlog.get_logger("supervise.arrivals")

_MARK = struct.Struct("<iqd")  # log generation, offset reached, wall-clock time
BUCKET_S = 1.0
MAX_BYTES = 64 * 1024 * 1024


def marks_path(root: Path, job: str, attempt: int) -> Path:
    return root / job / f"{attempt}.bin"


class ArrivalWriter:
    """One attempt's marks, appended as its batches are read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._size = 0
        self._last: tuple[int, int, float] | None = None
        self._failed = False

    def arrived(self, generation: int, offset: int, ts: float) -> None:
        """The log had reached ``offset`` (in ``generation``) by ``ts``."""
        if self._failed:
            return
        try:
            if self._fd is None:
                self._open()
            assert self._fd is not None
            last = self._last
            if last is not None and last[0] == generation and offset <= last[1]:
                return  # nothing new arrived: the earlier mark already covers it, with the earlier time
            same_second = (last is not None and last[0] == generation and offset >= last[1]
                           and int(ts // BUCKET_S) == int(last[2] // BUCKET_S))
            at = self._size - _MARK.size if same_second else self._size
            os.pwrite(self._fd, _MARK.pack(generation, offset, ts), at)
            self._size = at + _MARK.size
            self._last = (generation, offset, ts)
        except OSError as exc:
            self._failed = True
            log.warning("cannot note when log lines arrived; `logs --timestamps` shows none from here",
                        path=str(self.path), error=exc.strerror or str(exc))
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> None:
        previous = os.umask(PRIVATE_UMASK)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        finally:
            os.umask(previous)
        # A re-adopted attempt goes on after the marks its earlier daemon wrote (a torn last one dropped).
        self._size = os.fstat(self._fd).st_size // _MARK.size * _MARK.size
        if self._size:
            self._last = _MARK.unpack(os.pread(self._fd, _MARK.size, self._size - _MARK.size))


class Arrivals:
    """An attempt's marks, read back: the time each position of the log as it is now had arrived by
    (the marks of its latest generation: an earlier one's lines are no longer in the file)."""

    def __init__(self, marks: list[tuple[int, int, float]]) -> None:
        latest = max((g for g, _, _ in marks), default=0)
        current = [(o, t) for g, o, t in marks if g == latest]
        self._offsets = [o for o, _ in current]
        self._times = [t for _, t in current]

    @classmethod
    def read(cls, path: Path) -> Arrivals:
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_BYTES)
        except OSError:
            return cls([])
        usable = len(data) // _MARK.size * _MARK.size
        return cls(list(_MARK.iter_unpack(data[:usable])))

    def time_of(self, end: int) -> float | None:
        """When the record ending at ``end`` had arrived; None past the last mark (not noted yet)."""
        i = bisect.bisect_left(self._offsets, end)
        return self._times[i] if i < len(self._times) else None


async def stamper(root: Path, row: Any) -> Callable[[int], float | None]:
    """For the log route: the arrival time of the record ending at an offset of ``row``'s log (an
    AttemptRow).  A record past the last mark of a running attempt is arriving now (the runner
    notes it a moment after the reader sees it); of an ended one, unknown."""
    found = await asyncio.to_thread(Arrivals.read, marks_path(root, row.job, row.n))
    active = row.state.active

    def stamp(end: int) -> float | None:
        at = found.time_of(end)
        return at if at is not None or not active else time.time()
    return stamp


def forget(root: Path, attempts: Iterable[tuple[str, int]]) -> None:
    """Delete the marks of these (job, attempt)s (their logs were pruned)."""
    for job, n in attempts:
        try:
            marks_path(root, job, n).unlink()
        except OSError:
            pass


def forget_job(root: Path, job: str) -> None:
    shutil.rmtree(root / job, ignore_errors=True)
