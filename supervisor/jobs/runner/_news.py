"""What a runner's start comes to, told by the runner as it happens (never read back from the
store): its first attempt running, or a wait that `start` says at once rather than after a
silent minute (for the jobs it runs after, for GPU memory other processes hold).  Its end is
the runner's task ending.  A sharded job's shards share their coordinator's news: the first
shard's attempt is the start's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from supervisor.core.events import JobState
from supervisor.store.database import AttemptRow


class StartNews:
    def __init__(self) -> None:
        self.launched = asyncio.Event()
        self.held = asyncio.Event()
        self.attempt: AttemptRow | None = None  # the first attempt of this start, once it runs

    def running(self, row: AttemptRow) -> None:
        if self.attempt is None:
            self.attempt = row
            self.launched.set()

    def said(self, state: JobState) -> None:
        """The runner set the job's state: `waiting` is news for `start`."""
        if state is JobState.WAITING:
            self.held.set()

    async def first(self, ended: Awaitable[object] | None, timeout_s: float) -> None:
        """Until the attempt runs, the start is held, the runner ends (``ended``), or ``timeout_s``."""
        waits: set[asyncio.Future[object]] = {asyncio.ensure_future(self.launched.wait()),
                                              asyncio.ensure_future(self.held.wait())}
        ender = asyncio.ensure_future(ended) if ended is not None else None
        try:
            await asyncio.wait(waits | ({ender} if ender else set()), timeout=timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
