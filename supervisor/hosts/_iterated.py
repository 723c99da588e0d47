"""What every log follower shares: ``records()`` iterated once, an async context manager that
closes it, and the closing of its iterator (local, SSH channel, SSH agent)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from types import TracebackType
from typing import Self

from supervisor.core.events import Record


class IteratedOnce:
    """A follower's lifecycle; subclasses give ``_iterate`` and ``aclose``."""

    _iterator: AsyncGenerator[list[Record], None] | None = None

    def records(self) -> AsyncIterator[list[Record]]:
        """Batches of complete records, in file order, as they are written (one iteration only)."""
        if self._iterator is not None:
            raise RuntimeError(f"{type(self).__name__}.records() can be iterated only once")
        self._iterator = self._iterate()
        return self._iterator

    def _iterate(self) -> AsyncGenerator[list[Record], None]:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def _close_iterator(self, *, parked: bool = False) -> None:
        """End the iterator now, so its cleanup runs.  ``parked``: it waits in its own wait and
        ends by itself on the wake-up the caller gave it."""
        iterator = self._iterator
        if iterator is None or parked:
            return
        try:
            await iterator.aclose()
        except RuntimeError:
            pass  # it is running in another task right now; it sees the follower closed and ends

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
