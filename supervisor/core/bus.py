"""The event bus: the daemon's log, metrics and `events -f` streams subscribe to it.

Events are published once stored: the runner writes each batch to the store in the same
transaction as the log offset it reaches (that pairing is what makes a restart lose and
double nothing), so every published event already has its id.  Publishing is synchronous
and ordered.  Streaming subscribers get a bounded queue; a reader too slow to keep up is
dropped (its stream ends) rather than allowed to grow the daemon's memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from supervisor.core.events import Event

log = structlog.get_logger("supervise.bus")

Subscriber = Callable[[list[Event]], None]


class Subscription:
    """A queue of event batches for one streaming reader."""

    def __init__(self, bus: EventBus, maxsize: int) -> None:
        self._bus = bus
        self.queue: asyncio.Queue[list[Event] | None] = asyncio.Queue(maxsize)
        self.overflowed = False

    def _offer(self, batch: list[Event]) -> None:
        try:
            self.queue.put_nowait(batch)
        except asyncio.QueueFull:
            self.overflowed = True
            self._bus.unsubscribe_stream(self)
            self.queue.get_nowait()  # make room for the end-of-stream marker
            self.queue.put_nowait(None)

    def close(self) -> None:
        self._bus.unsubscribe_stream(self)


class EventBus:
    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self._streams: list[Subscription] = []

    def subscribe(self, callback: Subscriber) -> None:
        self._subscribers.append(callback)

    def stream(self, maxsize: int = 10_000) -> Subscription:
        sub = Subscription(self, maxsize)
        self._streams.append(sub)
        return sub

    def unsubscribe_stream(self, sub: Subscription) -> None:
        if sub in self._streams:
            self._streams.remove(sub)

    def publish(self, events: list[Event]) -> None:
        if not events:
            return
        for callback in self._subscribers:
            try:
                callback(events)
            except Exception:  # one faulty subscriber must not silence the others
                log.exception("event subscriber failed", subscriber=getattr(callback, "__qualname__", repr(callback)))
        for sub in list(self._streams):
            sub._offer(events)
