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
    (its jobs keep running, as a stopped daemon leaves them) and wait for it to end."""
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
