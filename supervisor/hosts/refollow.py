"""A log shown to a person, followed through its host's outages.

A host's follower ends with ``ConnectionLost`` (or ``HostRefused``) once its box cannot be reached:
the attempt it reads for is then `unreachable`, not judged, and re-adopted when the box answers.
A reader that only shows the log (`supervise logs -f`) has nothing to judge: it waits, and follows on
from where it got once the box answers, as it did when a follower waited through an outage itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from supervisor.core.errors import ConnectionLost, HostRefused
from supervisor.core.events import Record
from supervisor.hosts.base import Follower, Host

_FOLLOW_AGAIN_S = 2.0  # how long it waits before asking a box that could not be reached again


class FollowThroughOutages:
    """A ``Follower`` of ``path`` on ``host`` from ``offset`` that outlives the host's outages."""

    def __init__(self, host: Host, path: str, offset: int) -> None:
        self._host = host
        self._path = path
        self._follower: Follower = host.follow(path, offset)
        self._finishing = False
        self._closed = False

    @property
    def offset(self) -> int:
        return self._follower.offset

    @property
    def generation(self) -> int:
        return self._follower.generation

    @property
    def buffered(self) -> int:
        return self._follower.buffered

    def partial_text(self, limit: int = 4096) -> str:
        return self._follower.partial_text(limit)

    def finish(self) -> None:
        self._finishing = True
        self._follower.finish()

    async def aclose(self) -> None:
        self._closed = True
        await self._follower.aclose()

    async def records(self) -> AsyncIterator[list[Record]]:
        while True:
            try:
                async for batch in self._follower.records():
                    yield batch
                return
            except (ConnectionLost, HostRefused):
                if self._closed:
                    return
            offset, generation = self._follower.offset, self._follower.generation
            await self._follower.aclose()
            await asyncio.sleep(_FOLLOW_AGAIN_S)
            if self._closed:
                return
            self._follower = self._host.follow(self._path, offset, generation)
            if self._finishing:
                self._follower.finish()
