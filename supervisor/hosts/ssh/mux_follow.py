"""Following a remote log through the host's multiplexed agent channel (``mux``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable
from typing import TypeVar

import structlog

from supervisor.core.events import Record
from supervisor.core.records import RecordBuffer
from supervisor.core.tasks import cancel_and_wait
from supervisor.hosts._iterated import IteratedOnce
from supervisor.hosts.ssh.connection import _CHANNEL, SshConnection
from supervisor.hosts.ssh.mux import Dropped, FollowEvent, SshMux
from supervisor.hosts.ssh.mux_agent import Data, Ended, Reset, Started

log = structlog.get_logger("supervise.ssh")
T = TypeVar("T")
_END = object()  # a drain reached the end of the file


class MuxFollower(IteratedOnce):
    """Follow a remote log from a byte offset: the same interface and the same records as
    ``LogFollower`` (both feed the bytes they read to a ``records.RecordBuffer``), as one
    subscription on the host's agent channel.

    The byte offset is counted here; after a dropped channel the follower asks again from the
    end of the last complete record it yielded, so nothing is lost or doubled.  ``finish()``
    turns the subscription into one read to the end of the file, then the trailing partial
    line is emitted.  Where the box cannot run the agent, the follower raises the host's
    ``HostError`` saying what to do.
    """

    def __init__(self, host: SshConnection, mux: SshMux, path: str, offset: int = 0, generation: int = 0) -> None:
        if offset < 0:
            raise ValueError("offset must be >= 0")
        self._host = host
        self._mux = mux
        self.path = path
        self.truncations = 0
        self.restarts = 0
        self._buffer = RecordBuffer(offset, generation)
        self._finishing = False
        self._closed = False
        self._wakeup = asyncio.Event()

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
        """Stop following; the iterator ends."""
        self._closed = True
        self._wakeup.set()
        await self._close_iterator()  # its subscription ends now, not when the generator is collected

    # -- the loop -------------------------------------------------------------------------

    async def _iterate(self) -> AsyncGenerator[list[Record], None]:
        drops = 0
        while not self._closed:
            drain = self._finishing
            self._buffer.reset(self._buffer.offset)  # re-read from the end of the last yielded record
            subscribed = await self._woken_or(self._mux.subscribe(self.path, self._buffer.offset, drain=drain),
                                               by_finish=not drain)
            if subscribed is None:
                if self._closed:
                    return
                continue  # finish() came first: ask for a drain instead
            sub_id, queue = subscribed
            try:
                while not self._closed:
                    event = await self._woken_or(queue.get(), by_finish=not drain)
                    if event is None:
                        if self._finishing and not drain:
                            break
                        continue
                    # Everything queued meanwhile is taken at once: one batch, however far behind.
                    events = [event]
                    while not queue.empty():
                        events.append(queue.get_nowait())
                    batch, stop = self._take_all(events)
                    if batch:
                        drops = 0
                        yield batch
                    if stop is _END:
                        return
                    if isinstance(stop, Dropped):
                        if stop.fatal is not None:
                            raise stop.fatal
                        drops += 1
                        self.restarts += 1
                        break
                    drops = 0
            finally:
                self._mux.unsubscribe(sub_id)
            if drops > 1 and await self._woken_or(asyncio.sleep(_CHANNEL.wait(drops), True)) is None and self._closed:
                return

    def _take_all(self, events: list[FollowEvent]) -> tuple[list[Record], Dropped | object | None]:
        """The records of ``events`` in order, and what stopped them: a ``Dropped``, ``_END``
        (the drain's end, its tail flushed), or None."""
        batch: list[Record] = []
        for event in events:
            if isinstance(event, Dropped):
                return batch, event
            batch += self._take(event)
            if isinstance(event, Ended):
                return batch, _END
        return batch, None

    def _take(self, event: FollowEvent) -> list[Record]:
        if isinstance(event, Started):
            if event.offset != self._buffer.offset:
                self.truncations += 1
                log.warning("stored offset past the end of the remote log: following from the start",
                            host=self._host.name, path=self.path, offset=self._buffer.offset)
                self._buffer.restart()  # the file is not the one the offset was in: a new generation
                self._buffer.reset(event.offset)
            return []
        if isinstance(event, Data):
            return self._buffer.feed(event.data)
        if isinstance(event, Reset):
            self.truncations += 1
            log.warning("remote log truncated or replaced: following from the start", host=self._host.name,
                        path=self.path, offset=self._buffer.end)
            tail = self._buffer.flush()
            self._buffer.restart()
            return tail
        if isinstance(event, Ended):
            return self._buffer.flush()
        return []

    async def _woken_or(self, awaitable: Awaitable[T], *, by_finish: bool = False) -> T | None:
        """``awaitable``'s result, or None when aclose() (or with ``by_finish``, finish()) came
        first: it is then cancelled."""
        task = asyncio.ensure_future(awaitable)
        try:
            while not task.done():
                self._wakeup.clear()
                if self._closed or (by_finish and self._finishing):
                    break
                woken = asyncio.ensure_future(self._wakeup.wait())
                try:
                    await asyncio.wait({task, woken}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
        finally:
            await cancel_and_wait(task)
        if task.cancelled():
            return None
        return task.result()
