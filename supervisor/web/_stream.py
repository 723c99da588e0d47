"""The page's live feed: Server-Sent Events from the event bus.

Each bus event goes out as an SSE message whose `id` is the event's store id.  A browser that
loses the stream (a daemon restart) reconnects by itself and sends the last id it saw as
`Last-Event-ID`; the stream then replays the stored events after it before going live.  It
subscribes to the bus before reading that backlog, and sends a live event only if its id is
past the last one sent: nothing falls in between, nothing is sent twice.

Between events, `status` messages (no id, so they never move the resume point) carry what
the page draws that is not an event: runner snapshots, GPU memory, countdowns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from aiohttp import web

from .. import streams
from ..store import EventQuery
from ..views import event_info
from ._status import PageStatus

if TYPE_CHECKING:
    from ..events import Event
    from ..store import Store
    from ..api import Service as WebService

HEARTBEAT_S = 2.0  # a status at least this often: ages and countdowns stay true
_MIN_STATUS_GAP_S = 0.3  # a busy log's batches share one status
_RETRY_MS = 1000  # how soon a browser reconnects


def backlog(store: Store, job: str | None, after: int) -> Iterator[Event]:
    """Stored events past ``after`` in id order: one job's, or every job's merged."""
    names = [job] if job is not None else [row.name for row in store.jobs()]
    merged: list[Event] = []
    for name in names:
        query = EventQuery(job=name, after_id=after)
        while batch := store.query_events(query):
            merged.extend(batch)
            query = EventQuery(job=name, after_id=batch[-1].id or 0)
    return iter(sorted(merged, key=lambda e: e.id or 0))


class EventStream:
    def __init__(self, service: WebService, job: str | None, after: int | None,
                 status: Callable[[], PageStatus]) -> None:
        self.service = service
        self.job = job
        self.after = after  # None: live events only (a fresh overview has no use for history)
        self.status = status
        self.last_id = after or 0
        self._status_sent = 0.0

    async def serve(self, request: web.Request) -> web.StreamResponse:
        sub = self.service.bus.stream()  # before the backlog: nothing falls in between
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        await response.prepare(request)
        streams.opened(request)
        try:
            await response.write(f"retry: {_RETRY_MS}\n\n".encode())
            if self.after is not None:
                for event in backlog(self.service.store, self.job, self.after):
                    await self._send_event(response, event)
            await self._send_status(response)
            await self._live(response, sub.queue)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            sub.close()
        return response

    async def _live(self, response: web.StreamResponse, queue: asyncio.Queue[list[Event] | None]) -> None:
        dirty = False
        while True:
            wait = HEARTBEAT_S if not dirty else max(0.0, self._status_sent + _MIN_STATUS_GAP_S - time.monotonic())
            try:
                batch = await asyncio.wait_for(queue.get(), timeout=wait)
            except TimeoutError:
                await self._send_status(response)
                dirty = False
                continue
            if batch is None:  # too slow a reader: end; the browser resumes from its last id
                return
            for event in batch:
                if (self.job is None or event.job == self.job) and (event.id or 0) > self.last_id:
                    await self._send_event(response, event)
                    dirty = True

    async def _send_event(self, response: web.StreamResponse, event: Event) -> None:
        data = event_info(event).model_dump_json()
        await response.write(f"id: {event.id}\nevent: job-event\ndata: {data}\n\n".encode())
        self.last_id = event.id or self.last_id

    async def _send_status(self, response: web.StreamResponse) -> None:
        await response.write(f"event: status\ndata: {self.status().model_dump_json()}\n\n".encode())
        self._status_sent = time.monotonic()
