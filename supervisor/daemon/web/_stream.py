"""The page's live feed: Server-Sent Events from the event bus.

Each bus event goes out as an SSE message whose `id` is the event's store id.  A browser that
loses the stream (a daemon restart) reconnects by itself and sends the last id it saw as
`Last-Event-ID`; the stream then replays the stored events after it (bounded: the latest ones,
the milestones, and a summary of what it leaves out) before going live.  It
subscribes to the bus before reading that backlog, and sends a live event only if its id is
past the last one sent: nothing falls in between, nothing is sent twice.

Between events, `status` messages (no id, so they never move the resume point) carry what
the page draws that is not an event: runner snapshots, GPU memory, countdowns.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from supervisor.core.events import Event, EventKind
from supervisor.daemon import streams
from supervisor.daemon.web._status import PageStatus
from supervisor.jobs.views import event_info
from supervisor.store.database import EventQuery, Store

if TYPE_CHECKING:
    from supervisor.daemon.api import Service as WebService

HEARTBEAT_S = 2.0  # a status at least this often: ages and countdowns stay true
_MIN_STATUS_GAP_S = 0.3  # a busy log's batches share one status
_RETRY_MS = 1000  # how soon a browser reconnects


# A page is sent the latest events (its list shows 2,000) and the latest milestones (every kind
# but the frequent ones: the timeline draws phases and markers from them), and how many more
# there were, by kind.  Replaying a whole history (152,804 events) held the loop 1.5-3 s a page
# and grew the daemon by 140 MB; this is read in a thread, on a connection of its own, bounded.
REPLAYED = 2000
_FREQUENT = {EventKind.PROGRESS.value, EventKind.INFO.value, EventKind.METRIC.value}
_MILESTONES = [kind.value for kind in EventKind if kind.value not in _FREQUENT]


@dataclass(frozen=True)
class Replay:
    """What a page is sent of the stored history: SSE text, the last id in it, what it leaves out."""

    text: str
    last_id: int
    left_out: dict[str, int]  # kind -> stored events past `after` not sent


def replay(db: Path, job: str | None, after: int, limit: int = REPLAYED) -> Replay:
    """Stored events past ``after`` (one job's, or every job's merged), bounded as above."""
    store = Store.reader(db)
    try:
        names = [job] if job is not None else store.job_names()
        found: dict[int, Event] = {}
        stored: Counter[str] = Counter()
        for name in names:
            query = EventQuery(job=name, after_id=after)
            stored.update(store.count_events(query))
            for kinds in (None, _MILESTONES):
                for event in store.query_events(replace(query, kinds=kinds), limit, latest=True):
                    found[event.id or 0] = event
    finally:
        store.close()
    events = [found[key] for key in sorted(found)][-2 * limit:]
    stored.subtract(Counter(event.kind.value for event in events))
    return Replay(text="".join(_event_text(event) for event in events), last_id=max(found, default=after),
                  left_out={kind: n for kind, n in stored.items() if n > 0})


def _event_text(event: Event) -> str:
    return f"id: {event.id}\nevent: job-event\ndata: {event_info(event).model_dump_json()}\n\n"


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
                history = await asyncio.to_thread(replay, self.service.store.path, self.job, self.after)
                if history.left_out:  # no id: it never moves the resume point
                    left = json.dumps({"left_out": history.left_out, "shown": REPLAYED})
                    await response.write(f"event: summary\ndata: {left}\n\n".encode())
                await response.write(history.text.encode())
                self.last_id = max(self.last_id, history.last_id)
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
        await response.write(_event_text(event).encode())
        self.last_id = event.id or self.last_id

    async def _send_status(self, response: web.StreamResponse) -> None:
        await response.write(f"event: status\ndata: {self.status().model_dump_json()}\n\n".encode())
        self._status_sent = time.monotonic()
