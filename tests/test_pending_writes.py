"""The ordered write queue: a write that must happen now (the log's events with their offset)
is refused while earlier writes wait for the store, never stored ahead of them."""

from __future__ import annotations

import asyncio

import pytest

from supervisor.core.errors import StoreError
from supervisor.jobs.pending import PendingWrites


def test_a_write_now_waits_its_turn_behind_kept_writes() -> None:
    async def scenario() -> list[str]:
        stored: list[str] = []
        full = True

        def attempt_ended() -> None:  # the store refuses it while the disk is full
            if full:
                raise StoreError("database or disk is full")
            stored.append("attempt ended")

        writes = PendingWrites("job", retry_s=0.01)
        writes.submit(attempt_ended)
        full = False  # room again, but the kept write is retried later: the log's events wait for it
        with pytest.raises(StoreError):
            writes.now(stored.append, "events of the log")
        assert stored == []
        await asyncio.wait_for(writes.drained(), timeout=10)
        writes.now(stored.append, "events of the log")
        return stored

    assert asyncio.run(scenario()) == ["attempt ended", "events of the log"]
