"""The open streaming answers (`events -f`, `logs -f`, the page's live feed), ended together.

A stream waits on the bus or a log for as long as its client stays; nothing it waits on ends
when the daemon stops, and a client gone quietly (Ctrl-C on `events -f`) is noticed only at the
next write.  aiohttp's shutdown waits for running handlers (60 s by default): one such stream
held `daemon stop` past its 30 s.  So each stream is registered here, and the application's
shutdown cancels them all at once (each handler ends its answer on CancelledError).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

OPEN_STREAMS = web.AppKey("open_streams", set[asyncio.Task[object]])


def track(app: web.Application) -> None:
    """Stream handlers of ``app`` register with ``opened``; its shutdown ends them."""
    app[OPEN_STREAMS] = set()
    app.on_shutdown.append(_end_all)


def opened(request: web.Request) -> None:
    """The handler running now streams its answer: end it when the application shuts down."""
    task = asyncio.current_task()
    streams = request.app.get(OPEN_STREAMS)
    if task is not None and streams is not None:
        streams.add(task)
        task.add_done_callback(streams.discard)


def client_gone(request: web.Request) -> bool:
    """The client closed its end (noticed without writing: a quiet stream writes nothing)."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def _end_all(app: web.Application) -> None:
    open_streams: set[asyncio.Task[object]] = app[OPEN_STREAMS]
    for task in list(open_streams):
        task.cancel()
