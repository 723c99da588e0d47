"""Ending asyncio tasks the daemon started for itself (readers, watchers, channels)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` if it still runs and wait until it has ended, whatever it ended with: its
    owner is done with it, and an error it raised on the way out has nobody left to tell."""
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def set_within(event: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``event``: True if it was set by then (a stop came during a
    backoff or a poll's pause), False if the time ran out first."""
    try:
        await asyncio.wait_for(event.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True
