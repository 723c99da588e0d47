"""A real daemon served inside the test's own event loop: for tests that must reach into it (patch
a method, set a hook) where a daemon process cannot be reached."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from supervisor.cli.client import Client
from supervisor.daemon.service import Service


@contextlib.asynccontextmanager
async def serving(service: Service) -> AsyncIterator[Client]:
    """Serve ``service`` until the block ends, with a client of it once it answers; then stop it
    (its jobs keep running, as a stopped daemon leaves them), wait for it to end, and release its
    home's lock."""
    task = asyncio.create_task(service.serve())
    client = Client(service.paths)
    try:
        for _ in range(500):
            if service.paths.pid_file.exists():
                break
            await asyncio.sleep(0.02)
        yield client
    finally:
        client.close()
        service.request_stop()
        await asyncio.wait_for(task, 30)
        # A daemon process lets go of its home's lock when it exits; one served here lets go of it
        # now (left to the garbage collector, the open file warns in whichever test comes next).
        lock = getattr(service, "_lock_file", None)
        if lock is not None:
            lock.close()
