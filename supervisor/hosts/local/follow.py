"""Following a growing log file: records as they are written, event-driven.

``LogFollower`` wakes on inotify events (through ``loop.add_reader``, no thread), reads
what was appended, feeds it to a ``records.RecordBuffer`` (the same splitting as the SSH
follower's) and yields the records in batches.  It survives the situations a job's log goes through:

- the file does not exist yet: it waits for it (a watch on the parent directory);
- a partial last line is held back until completed, but never more than about
  ``chunk_size + MAX_RECORD_BYTES`` bytes of it (over-long lines are cut by the splitter);
- truncation under it (``> log``): restart from 0, count it, warn once per truncation;
- rotation (the path now names another file): finish the old file to its end, then follow
  the new one from 0;
- resume at a stored byte offset: no record lost, none doubled;
- ``finish()`` when the writer has exited: drain to EOF, emit the trailing partial line,
  end the iterator.

Truncation is recognised by the size dropping below the read position, or by the last bytes
read no longer being there: each read starts ``_CHECK_BYTES`` before the read position, so a
truncation followed by more output than was there before, all between two looks (a job's
``ftruncate(1, 0)``, logrotate's ``copytruncate`` of a busy log), is not taken for growth.

Where inotify is unavailable (or ``use_inotify=False``) it polls every ``poll_interval``.
With inotify it still re-checks every ``safety_interval`` in case an event was never
delivered (network file systems report only local writes).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator
from pathlib import Path

import structlog

from supervisor.core.errors import HostError
from supervisor.core.events import Record
from supervisor.core.records import RecordBuffer
from supervisor.hosts import _inotify
from supervisor.hosts._busy import BUSY_LINES_PER_S, BUSY_READ_INTERVAL_S, BusyPacer
from supervisor.hosts._iterated import IteratedOnce

log = structlog.get_logger()

_FILE_MASK = (
    _inotify.IN_MODIFY
    | _inotify.IN_CLOSE_WRITE
    | _inotify.IN_MOVE_SELF
    | _inotify.IN_DELETE_SELF
    | _inotify.IN_ATTRIB
)
_DATA_MASK = _inotify.IN_MODIFY | _inotify.IN_CLOSE_WRITE
# Only name events: IN_MODIFY on a directory watch would report every sibling log's writes.
_DIR_MASK = _inotify.IN_CREATE | _inotify.IN_MOVED_TO | _inotify.IN_ONLYDIR


# Bytes re-read before the read position to tell growth from a rewrite: the same read, 64
# bytes longer (no extra system call).
_CHECK_BYTES = 64


class LogFollower(IteratedOnce):
    """Follow ``path`` from byte ``offset``; iterate ``records()`` for batches of records."""

    def __init__(
        self,
        path: Path,
        offset: int = 0,
        generation: int = 0,
        *,
        poll_interval: float = 1.0,
        chunk_size: int = 1 << 20,
        use_inotify: bool | None = None,
        safety_interval: float = 30.0,
        busy_lines_per_s: float = BUSY_LINES_PER_S,
        busy_read_interval: float = BUSY_READ_INTERVAL_S,
    ) -> None:
        if offset < 0 or chunk_size <= 0 or poll_interval <= 0 or safety_interval <= 0:
            raise ValueError("offset must be >= 0; chunk_size and intervals must be > 0")
        self.path = Path(path)
        self.poll_interval = poll_interval
        self.safety_interval = safety_interval
        self.chunk_size = chunk_size
        self.truncations = 0
        self.rotations = 0
        self._buffer = RecordBuffer(offset, generation)  # what was read but not yet yielded, and where
        self._seen_tail = b""  # the last bytes read, up to _CHECK_BYTES, ending at the read position
        self._fd = -1
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._want_inotify = use_inotify
        self._hub: _inotify.WatchHub | None = None
        self._file_watch: _inotify.Watch | None = None
        self._dir_watch: _inotify.Watch | None = None
        self._dir_target: tuple[Path, str] | None = None  # (watched ancestor, name awaited in it)
        self._timer: asyncio.TimerHandle | None = None
        self._interval = poll_interval
        self._wakeup = asyncio.Event()
        self._check_path = True  # re-stat the path before trusting the open file
        self._more = False  # the last read filled a whole chunk: more is probably waiting
        self._finishing = False
        self._closed = False
        self._waiting = False
        self._inotify_active = False
        self._pacer = BusyPacer(busy_lines_per_s, busy_read_interval)  # many lines a read when busy

    # -- public surface -------------------------------------------------------------------

    @property
    def offset(self) -> int:
        """Byte offset just past the last record yielded: where a restarted follower resumes."""
        return self._buffer.offset

    @property
    def generation(self) -> int:
        """How many times the log restarted from 0, counted on from the generation resumed at."""
        return self._buffer.generation

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete last line currently held back."""
        return self._buffer.buffered

    def partial_text(self, limit: int = 4096) -> str:
        """The unterminated tail held back after the last record, decoded ('' if none): a
        progress bar's latest redraw, which tqdm leaves unterminated until the next one.
        For display and progress only; it is yielded as a record once its terminator is written."""
        return self._buffer.partial_text(limit)

    @property
    def peak_buffer(self) -> int:
        """The most bytes this follower has held at once (pending line plus one read)."""
        return self._buffer.peak

    @property
    def using_inotify(self) -> bool:
        """Whether this follower is driven by inotify (False: polling), once iteration began."""
        return self._inotify_active

    def finish(self) -> None:
        """The writer has exited: read to EOF, emit the trailing partial line, then end."""
        self._finishing = True
        self._check_path = True
        self._wakeup.set()

    async def aclose(self) -> None:
        """Stop following and release the file and watches; the iterator ends."""
        self._closed = True
        self._wakeup.set()
        self._stop()
        # A generator parked in its wait ends by itself on the wakeup; one suspended at a
        # yield (or never started) must be closed here so its cleanup runs.
        await self._close_iterator(parked=self._waiting)

    # -- the loop -------------------------------------------------------------------------

    async def _iterate(self) -> AsyncGenerator[list[Record], None]:
        self._start()
        try:
            while not self._closed:
                await self._gather()
                self._wakeup.clear()  # before reading, so a write during the read re-wakes us
                batch = self._pump_or_raise()
                if batch:
                    self._pacer.read(len(batch))
                    yield batch
                    if self._more:
                        await asyncio.sleep(0)  # catching up on a large backlog: stay fair
                    continue
                if self._finishing:
                    tail = self._buffer.flush()
                    if tail:
                        yield tail
                    return
                await self._wait()
        finally:
            self._stop()

    def _pump_or_raise(self) -> list[Record]:
        try:
            batch = self._pump()
        except OSError as exc:
            raise HostError(f"cannot follow {self.path}: {exc}") from exc
        self._retime()  # a watch may have appeared or vanished
        return batch

    async def _wait(self) -> None:
        self._waiting = True
        try:
            await self._wakeup.wait()
        finally:
            self._waiting = False

    async def _gather(self) -> None:
        # Before every read, not only after a wait: a daemon slower than a busy log finds new
        # lines after each batch and would otherwise read a few lines at a time, forever.
        delay = 0.0 if self._finishing or self._closed else self._pacer.delay()
        if delay <= 0:
            return
        self._waiting = True
        try:
            await asyncio.sleep(delay)
        finally:
            self._waiting = False

    def _start(self) -> None:
        if self._want_inotify is not False:
            try:
                self._hub = _inotify.hub_for(asyncio.get_running_loop())
                self._inotify_active = True
            except OSError as exc:
                if self._want_inotify:
                    raise HostError(f"cannot watch {self.path} with inotify: {exc}") from exc
                log.info("inotify unavailable, polling", path=str(self.path), error=str(exc))
        self._ensure_dir_watch()
        self._schedule_tick()

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._close_file()
        self._unwatch_dir()
        if self._hub is not None:
            self._hub.release_if_idle()
            self._hub = None

    # -- timers and wake-ups --------------------------------------------------------------

    def _tick_interval(self) -> float:
        """Poll fast when no watch covers what happens next (polling mode, a watch that
        could not be added or was dropped); otherwise only the slow safety check."""
        if self._hub is None:
            return self.poll_interval
        watched = self._file_watch if self._fd >= 0 else self._dir_watch
        return self.safety_interval if watched is not None else self.poll_interval

    def _schedule_tick(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._closed:
            return
        self._interval = self._tick_interval()
        self._timer = asyncio.get_running_loop().call_later(self._interval, self._tick)

    def _retime(self) -> None:
        if self._timer is not None and self._tick_interval() != self._interval:
            self._schedule_tick()

    def _tick(self) -> None:
        self._check_path = True
        self._wakeup.set()
        self._schedule_tick()

    def _on_file_event(self, event: _inotify.InotifyEvent) -> None:
        if event.mask & _inotify.IN_IGNORED:
            self._file_watch = None  # the kernel dropped it (file deleted)
        if event.mask & ~_DATA_MASK:  # moved, deleted, attributes, overflow: look again
            self._check_path = True
        self._wakeup.set()

    def _on_dir_event(self, event: _inotify.InotifyEvent) -> None:
        if event.mask & _inotify.IN_IGNORED:
            self._dir_watch = None  # the directory went away; _open() watches an ancestor
        target = self._dir_target
        if event.mask & (_inotify.IN_Q_OVERFLOW | _inotify.IN_IGNORED) or (
            target is not None and os.fsdecode(event.name) == target[1]
        ):
            self._check_path = True
            self._wakeup.set()

    # -- reading --------------------------------------------------------------------------

    def _pump(self) -> list[Record]:
        """Read until a batch of records is ready or EOF; [] means nothing new right now."""
        while not self._closed:
            if self._fd < 0 and not self._open():
                return []
            end, back = self._buffer.end, len(self._seen_tail)
            data = os.pread(self._fd, self.chunk_size + back, end - back)
            if back and data[:back] != self._seen_tail:  # rewritten from an earlier place
                flushed = self._truncated(os.fstat(self._fd).st_size)
                if flushed:
                    return flushed
                continue
            chunk = data[back:]
            self._more = len(chunk) == self.chunk_size
            if chunk:
                self._seen_tail = (self._seen_tail + chunk[-_CHECK_BYTES:])[-_CHECK_BYTES:]
                batch = self._buffer.feed(chunk)
                if batch:
                    return batch
                continue
            after_eof = self._on_eof()
            if after_eof is None:
                return []
            if after_eof:
                return after_eof
        return []

    def _on_eof(self) -> list[Record] | None:
        """At EOF of the open file: handle truncation and rotation.

        The path is re-checked only here, once the open file is drained, so a rotated file
        is finished to its end before its successor is opened.

        Returns records to yield ([] to keep reading at once), or None when there is
        nothing more to read until the next wake-up.
        """
        size = os.fstat(self._fd).st_size
        if size < self._buffer.end:
            return self._truncated(size)
        if self._check_path:
            return self._switch_if_rotated()
        return None

    def _truncated(self, size: int) -> list[Record]:
        self.truncations += 1
        log.warning(
            "log truncated, following from the start",
            path=str(self.path),
            offset=self._buffer.end,
            size=size,
            truncations=self.truncations,
        )
        batch = self._buffer.flush()  # the held-back bytes were real output before the truncation
        self._buffer.restart()
        self._seen_tail = b""
        return batch

    def _switch_if_rotated(self) -> list[Record] | None:
        self._check_path = False
        ident = self._stat_ident()
        if ident is None or ident == self._ident:
            return None  # unchanged, or moved away with no successor yet: keep the old one
        self.rotations += 1
        log.info("log rotated, following the new file", path=str(self.path), old_end=self._buffer.offset)
        batch = self._buffer.flush()
        self._close_file()
        self._buffer.restart()
        self._seen_tail = b""
        return batch

    def _stat_ident(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return (st.st_dev, st.st_ino)

    # -- opening and watching -------------------------------------------------------------

    def _open(self) -> bool:
        self._ensure_dir_watch()
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return False
        st = os.fstat(fd)
        self._fd = fd
        self._ident = (st.st_dev, st.st_ino)
        self._watch_file()
        if st.st_size < self._buffer.offset:
            self._truncated(st.st_size)  # a stored offset past the end: the file was replaced
        return True

    def _close_file(self) -> None:
        self._unwatch_file()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._ident = None

    def _watch_file(self) -> None:
        if self._hub is None:
            return
        self._unwatch_file()
        try:
            self._file_watch = self._hub.add(self.path, _FILE_MASK, self._on_file_event)
        except OSError:
            return  # gone again already; the next check notices
        # The watch is by path: if the path was replaced between open and watch, re-check.
        self._check_path = True

    def _unwatch_file(self) -> None:
        if self._hub is not None and self._file_watch is not None:
            self._hub.remove(self._file_watch)
        self._file_watch = None

    def _ensure_dir_watch(self) -> None:
        """Watch the parent directory for the file's name, or, while the parent does not
        exist yet, the nearest existing ancestor for the next missing component."""
        if self._hub is None:
            return
        target = self._nearest_ancestor()
        if target == self._dir_target and self._dir_watch is not None:
            return
        # Add before removing so the shared hub does not close and reopen in between.
        old = self._dir_watch
        try:
            self._dir_watch = self._hub.add(target[0], _DIR_MASK, self._on_dir_event)
            self._dir_target = target
        except OSError:
            self._dir_watch, self._dir_target = None, None
        if old is not None:
            self._hub.remove(old)

    def _nearest_ancestor(self) -> tuple[Path, str]:
        child = self.path.absolute()
        for parent in child.parents:
            if parent.is_dir():
                return parent, child.name
            child = parent
        return Path("/"), child.name

    def _unwatch_dir(self) -> None:
        if self._hub is not None and self._dir_watch is not None:
            self._hub.remove(self._dir_watch)
        self._dir_watch = None
        self._dir_target = None
