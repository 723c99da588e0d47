"""An ended attempt's log is read to its end while reading moves on, however long that takes; only a
reader that stops moving is given up on (and then the attempt is judged as far as it was read)."""

from __future__ import annotations

import asyncio
import time

from supervisor.jobs.runner._watching import drain


def test_a_slow_reader_that_keeps_moving_is_waited_for_past_the_stall_bound() -> None:
    async def run() -> tuple[bool, int]:
        offset = [0]

        async def reader() -> None:  # 12 steps of 0.05 s: 0.6 s in all, twelve times the bound
            for _ in range(12):
                await asyncio.sleep(0.05)
                offset[0] += 100

        task = asyncio.create_task(reader())
        ended = await drain(task, lambda: offset[0], stall_s=0.08)
        return ended, offset[0]

    ended, offset = asyncio.run(run())
    assert ended and offset == 1200  # the whole log read: the failure at its end is seen


def test_a_reader_that_stops_moving_is_given_up_on_and_left_to_the_caller() -> None:
    async def run() -> tuple[bool, bool, int]:
        offset = [0]
        stuck = asyncio.Event()

        async def reader() -> None:
            offset[0] = 500
            await stuck.wait()  # a log that cannot be read any further

        task = asyncio.create_task(reader())
        await asyncio.sleep(0)
        ended = await drain(task, lambda: offset[0], stall_s=0.05)
        still_running = not task.done()
        task.cancel()
        return ended, still_running, offset[0]

    ended, still_running, offset = asyncio.run(run())
    assert not ended and still_running and offset == 500


def test_a_reader_already_done_returns_at_once() -> None:
    async def run() -> bool:
        async def reader() -> None:
            return None

        task = asyncio.create_task(reader())
        await task
        return await drain(task, lambda: 0, stall_s=60)

    assert asyncio.run(run())


def test_time_the_reader_had_no_turn_is_not_counted_as_a_reader_that_stopped() -> None:
    """The loop is held for longer than the bound (a daemon with no CPU, stopped, or behind fifty
    other readers) while the reader waits its turn: a late look counts once, not as the time it
    missed, and the reader, moving again, is waited for to its end."""
    async def run() -> tuple[bool, int]:
        offset = [0]

        async def reader() -> None:
            await asyncio.sleep(0.1)
            time.sleep(4.0)  # noqa: ASYNC251 - on purpose: the whole loop holds still, no reader and no look gets a turn
            for _ in range(3):
                await asyncio.sleep(0.2)
                offset[0] += 100

        task = asyncio.create_task(reader())
        ended = await drain(task, lambda: offset[0], 3.0)
        return ended, offset[0]

    ended, offset = asyncio.run(run())
    assert ended and offset == 300
