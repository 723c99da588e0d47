"""Reading an ended attempt's log to its end before it is judged.

The traceback is written just before the exit, so the verdict waits for the reader.  A fixed bound
on that wait cut off fast writers: a job that wrote its log faster than the daemon reads it (a tqdm
bar at full speed, 8 jobs on 2 cores) ended long before its log was read, and the end of the log —
where the failure is — was never read.  So the bound is on *no progress*: the wait goes on as long
as the reader's offset keeps moving, and gives up only after ``stall_s`` without a byte read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

DRAIN_STALL_S = 30.0  # a log not read any further for this long is judged as far as it was read


async def drain(reader: asyncio.Task[None], offset: Callable[[], int], stall_s: float = DRAIN_STALL_S) -> bool:
    """Wait until ``reader`` ends, or until ``offset()`` has not moved for ``stall_s``; True if it ended.
    The reader is not cancelled here: the caller decides what a stuck reader gets."""
    last = offset()
    while True:
        done, _ = await asyncio.wait({reader}, timeout=stall_s)
        if done:
            return True
        now = offset()
        if now == last:
            return False
        last = now
