"""Store writes a runner must not lose, kept in order while the store cannot take them.

A full disk when a job exits used to end its supervision for good: the exit, the verdict and
the job's end were never stored, even after space returned, and a job that exited 0 read
`failed`.  A runner's writes go through ``PendingWrites``: each is tried at once; while the
store refuses (``StoreError``), it and every later one are kept, in order, and tried again
until the store takes them.  Each write is one transaction, rolled back when it fails, so
trying it again never doubles it.  Kept writes live in memory only: a daemon stopped before
they are stored leaves the attempt `running` in the store, and the next daemon's recovery
finishes it from its exit-status file.

The store never makes the loop wait: another process holding its lock (a `sqlite3` shell, a
backup) refuses a write at once (``StoreBusy``), and the write is kept like any other.  A caller
that needs its write stored before it goes on (a launch, a verb's answer) awaits ``when_free``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from supervisor.core.errors import StoreBusy, StoreError

log = structlog.get_logger("supervise.runner")

_RETRY_S = 1.0
_BUSY_RETRY_S = 0.05  # a held lock is usually let go of soon: a verb waiting on it answers soon after

T = TypeVar("T")


async def when_free(write: Callable[[], T], *, within_s: float | None = None) -> T:
    """``write()``, tried again while another process holds the store's lock, on the loop's timer
    (never blocking it).  ``within_s``: StoreBusy past that long (a verb answers "store busy"
    rather than hang); None: until it is free.  Any other StoreError is raised at once."""
    deadline = None if within_s is None else asyncio.get_running_loop().time() + within_s
    while True:
        try:
            return write()
        except StoreBusy:
            if deadline is not None and asyncio.get_running_loop().time() >= deadline:
                raise
        await asyncio.sleep(_BUSY_RETRY_S)


class PendingWrites:
    def __init__(self, job: str, retry_s: float = _RETRY_S) -> None:
        self.job = job
        self.retry_s = retry_s
        self._kept: deque[Callable[[], object]] = deque()
        self._drained = asyncio.Event()
        self._drained.set()
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._kept)

    def now(self, write: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``write(*args, **kwargs)`` now, in its turn: refused (StoreError, nothing written) while earlier writes
        wait to be stored, so that a caller keeping its own pending writes (the log's events and
        offset, kept for the next batch) never stores them ahead of those."""
        if self._kept:
            raise StoreError(f"{len(self._kept)} earlier writes are not stored yet")
        return write(*args, **kwargs)

    def submit(self, write: Callable[[], object]) -> None:
        """Write now if nothing is kept, else (or if the store refuses) keep it for later."""
        if not self._kept:
            try:
                write()
                return
            except StoreError as exc:
                log.error("cannot store; will try again until there is room", job=self.job, error=str(exc))
        self._kept.append(write)
        self._drained.clear()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name=f"writes:{self.job}")

    async def drained(self) -> None:
        """Wait until every kept write is stored."""
        await self._drained.wait()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _drain(self) -> None:
        while self._kept:
            await asyncio.sleep(self.retry_s)
            while self._kept:
                try:
                    self._kept[0]()
                except StoreError:
                    break
                except Exception:  # a write that can never succeed must not hold up the rest
                    log.exception("a kept store write failed; dropped", job=self.job)
                self._kept.popleft()
        log.info("kept store writes stored", job=self.job)
        self._drained.set()
