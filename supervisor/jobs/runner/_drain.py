"""Reading an ended attempt's log to its end before it is judged.

The traceback is written just before the exit, so the verdict waits for the reader.  A fixed bound
on that wait cut off fast writers: a job that wrote its log faster than the daemon reads it (a tqdm
bar at full speed, 8 jobs on 2 cores) ended long before its log was read, and the end of the log —
where the failure is — was never read.  So the bound is on *no progress*, and progress is the
reader's own: each step of records it takes (matched, judged, stored), not the follower's offset,
which moves once per read of up to a MiB and, with fifty readers taking turns, stood still for
longer than the bound while every reader was busy.  Nor is time the reader had no turn counted:
the wait looks every ``look_s``, and a look that comes late (the daemon had no CPU, or was stopped)
counts as one look, not as the time it missed.  Only a reader that is given its turns and still
takes nothing for ``stall_s`` is given up on; the verdict then says how far the log was read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

DRAIN_STALL_S = 30.0  # a reader that takes nothing for this long is given up on: judged as far as it read
_LOOK_S = 1.0  # how often the wait looks at the reader's progress


async def drain(reader: asyncio.Task[None], progress: Callable[[], int], stall_s: float = DRAIN_STALL_S,
                look_s: float = _LOOK_S) -> bool:
    """Wait until ``reader`` ends, or until ``progress()`` has not moved through ``stall_s`` of
    looks ``look_s`` apart; True if it ended.  The reader is not cancelled here: the caller
    decides what a stuck reader gets."""
    loop = asyncio.get_running_loop()
    last, still = progress(), 0.0
    while True:
        looked = loop.time()
        done, _ = await asyncio.wait({reader}, timeout=look_s)
        if done:
            return True
        now = progress()
        if now != last:
            last, still = now, 0.0
            continue
        still += min(look_s, loop.time() - looked)  # a late look counts its own interval, not the time missed
        if still >= stall_s:
            return False
