"""Following a log on a remote host: a ``tail -F`` channel, restarted after a drop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable
from typing import TypeVar

import asyncssh
import structlog

from supervisor.core.errors import HostError
from supervisor.core.events import Record
from supervisor.core.records import RecordBuffer
from supervisor.core.tasks import cancel_and_wait
from supervisor.hosts import _remote
from supervisor.hosts._iterated import IteratedOnce
from supervisor.hosts.ssh.agent import _close_process
from supervisor.hosts.ssh.connection import _CHANNEL, _DROPS, SshConnection

log = structlog.get_logger("supervise.ssh")
T = TypeVar("T")

_NOTICES = (b"file truncated", b"has been replaced", b"has appeared")
_DRAIN_ERRORS: tuple[type[BaseException], ...] = (*_DROPS, TimeoutError)


class SshFollower(IteratedOnce):
    """Follow a remote log from a byte offset: the same interface and the same records as
    ``LogFollower`` (both feed the bytes they read to a ``records.RecordBuffer``).

    One channel runs ``tail -c +OFFSET+1 -F`` on the remote box (inotify there).  The byte
    offset is counted here; after a dropped connection the follower starts again exactly at
    the end of the last complete record it yielded (the partial line it held is read
    again), so nothing is lost or doubled.  ``finish()`` switches to one plain read from
    that offset to the end, then emits the trailing partial line.

    Truncation and replacement of the file are seen through tail's notices ("file
    truncated", "has been replaced"): what was held is emitted and following restarts at
    0.  Those notices travel on stderr, beside the data, so output written in the very same
    instant may be attributed to the old file; the supervisor's own logs are append-only.
    """

    def __init__(self, host: SshConnection, path: str, offset: int = 0, generation: int = 0, *,
                 chunk_size: int = 1 << 20) -> None:
        if offset < 0 or chunk_size <= 0:
            raise ValueError("offset must be >= 0 and chunk_size > 0")
        self._host = host
        self.path = path
        self.chunk_size = chunk_size
        self.truncations = 0
        self.restarts = 0  # channels started again after a drop
        self._buffer = RecordBuffer(offset, generation)  # what was received but not yet yielded, and where
        self._finishing = False
        self._closed = False
        self._waiting = False
        self._reset = False  # tail reported truncation or replacement
        self._wakeup = asyncio.Event()
        self._closed_event = asyncio.Event()
        self._proc: asyncssh.SSHClientProcess[bytes] | None = None
        self._notices: asyncio.Task[None] | None = None
        self._last_error = ""

    @property
    def offset(self) -> int:
        """Byte offset just past the last record yielded: where a restarted follower resumes."""
        return self._buffer.offset

    @property
    def buffered(self) -> int:
        return self._buffer.buffered

    @property
    def generation(self) -> int:
        """How many times the log restarted from 0, counted on from the generation resumed at."""
        return self._buffer.generation

    def partial_text(self, limit: int = 4096) -> str:
        """The unterminated tail received after the last record (see ``LogFollower.partial_text``)."""
        return self._buffer.partial_text(limit)

    def finish(self) -> None:
        """The writer has exited: read to EOF, emit the trailing partial line, then end."""
        self._finishing = True
        self._wakeup.set()

    async def aclose(self) -> None:
        """Stop following and close the channel; the iterator ends."""
        self._closed = True
        self._closed_event.set()
        self._wakeup.set()
        proc, self._proc = self._proc, None
        await _close_process(proc)
        await self._close_iterator(parked=self._waiting)

    # -- the loop -------------------------------------------------------------------------

    async def _iterate(self) -> AsyncGenerator[list[Record], None]:
        drops = 0
        dead_ends = 0  # the remote tail ended although the connection is fine
        while not self._closed:
            if self._finishing:
                async for batch in self._drain():
                    yield batch
                return
            proc = None
            try:
                proc = await self._guard(self._start(_remote.FOLLOW))
                while not self._closed and not self._finishing:
                    chunk = await self._read(proc)
                    if self._reset:
                        tail = self._restart_at_zero()
                        if tail:
                            yield tail
                        break
                    if chunk is None:
                        continue  # woken by finish() or aclose()
                    if not chunk:
                        raise EOFError("the remote tail ended")
                    drops = dead_ends = 0
                    batch = self._buffer.feed(chunk)
                    if batch:
                        yield batch
            except _Closed:
                return
            except _DROPS as exc:
                if self._closed:
                    return
                if isinstance(exc, EOFError) and self._host.connected():
                    dead_ends += 1
                    if dead_ends >= 5:
                        raise HostError(f"cannot follow {self.path} on {self._host.target.display}: the remote "
                                        f"`tail -F` keeps ending ({self._last_error or 'no message'})") from exc
                self._host.note_drop(exc)
                drops += 1
                self.restarts += 1
                log.info("following again after a dropped channel", host=self._host.name, path=self.path,
                         offset=self._buffer.offset, error=str(exc) or type(exc).__name__)
                if drops > 1 or dead_ends:
                    try:
                        await self._guard(asyncio.sleep(_CHANNEL.wait(drops + dead_ends)))
                    except _Closed:
                        return
            finally:
                await self._stop(proc)

    async def _drain(self) -> AsyncGenerator[list[Record], None]:
        failures = 0
        while not self._closed:
            proc = None
            try:
                proc = await self._guard(self._start(_remote.DRAIN))
                while True:
                    chunk = await self._guard(proc.stdout.read(self.chunk_size))
                    if not chunk:
                        break
                    batch = self._buffer.feed(chunk)
                    if batch:
                        yield batch
                await self._guard(asyncio.wait_for(proc.wait_closed(), timeout=10))
                if proc.exit_status is None and proc.exit_signal is None:
                    raise EOFError("the channel closed before the log's end")
                tail = self._buffer.flush()
                if tail:
                    yield tail
                return
            except _Closed:
                return
            except _DRAIN_ERRORS as exc:
                if self._closed:
                    return
                self._host.note_drop(exc)
                failures += 1
                self.restarts += 1
                try:
                    await self._guard(asyncio.sleep(_CHANNEL.wait(failures)))
                except _Closed:
                    return
            finally:
                await self._stop(proc)

    async def _guard(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` unless the follower is closed first (then ``_Closed``)."""
        task = asyncio.ensure_future(awaitable)
        closed = asyncio.ensure_future(self._closed_event.wait())
        try:
            await asyncio.wait({task, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            await cancel_and_wait(task)
        if task.cancelled():
            raise _Closed
        return task.result()

    async def _start(self, body: str) -> asyncssh.SSHClientProcess[bytes]:
        self._buffer.reset(self._buffer.offset)  # re-read from the end of the last yielded record
        self._reset = False
        proc = await self._host.stream(body, self.path, str(self._buffer.offset))
        self._proc = proc
        try:
            start = await _header(proc)
        except BaseException:
            await _close_process(proc)
            raise
        if start != self._buffer.offset:
            self.truncations += 1
            log.warning("stored offset past the end of the remote log: following from the start",
                        host=self._host.name, path=self.path, offset=self._buffer.offset)
            self._buffer.restart()  # the file is not the one the offset was in: a new generation
            self._buffer.reset(start)
        self._notices = asyncio.create_task(self._watch_notices(proc))
        return proc

    async def _stop(self, proc: asyncssh.SSHClientProcess[bytes] | None) -> None:
        notices, self._notices = self._notices, None
        if notices is not None:
            await cancel_and_wait(notices)
        if proc is not None and self._proc is proc:
            self._proc = None
        await _close_process(proc)

    async def _read(self, proc: asyncssh.SSHClientProcess[bytes]) -> bytes | None:
        """The next chunk; None when woken instead (finish, close, or a reset notice)."""
        self._wakeup.clear()
        if self._finishing or self._closed or self._reset:
            return None
        reader = asyncio.ensure_future(proc.stdout.read(self.chunk_size))
        woken = asyncio.ensure_future(self._wakeup.wait())
        self._waiting = True
        try:
            await asyncio.wait({reader, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiting = False
            woken.cancel()
            if not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
        if reader.cancelled():
            return None
        return reader.result()

    async def _watch_notices(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        with contextlib.suppress(Exception):
            while True:
                line = await proc.stderr.readline()
                if not line:
                    return
                self._last_error = line.decode(errors="replace").strip()[:300]
                if any(n in line for n in _NOTICES):
                    if b"has appeared" in line and self._buffer.end == 0:
                        continue  # the file we waited for: tail reads it from its start already
                    self._reset = True
                    self._wakeup.set()

    def _restart_at_zero(self) -> list[Record]:
        self.truncations += 1
        log.warning("remote log truncated or replaced: following from the start", host=self._host.name,
                    path=self.path, offset=self._buffer.end)
        tail = self._buffer.flush()
        self._buffer.restart()
        return tail


class _Closed(Exception):
    """The follower was closed while it waited."""



async def _header(proc: asyncssh.SSHClientProcess[bytes]) -> int:
    """Skip to the script's header line '@@supervise@@ N' and return N."""
    prefix = _remote.MARK + b" "
    while True:
        line = await proc.stdout.readline()
        if not line:
            raise EOFError("the remote script ended before its header")
        if line.startswith(prefix):
            return int(line[len(prefix):].strip() or 0)
