"""Adaptive batching of a busy log: read many lines per wake-up, whatever the consumer's speed.

The cost of following is per read (a wake-up, a read, a match call, a store transaction), not per
line, so a log written faster than ``busy_lines_per_s`` is read at most every
``busy_read_interval``.  A daemon slower than the log (busy with other jobs) finds new lines after
every batch; it must still gather them, not read the few that came during its last batch.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from pathlib import Path

from supervisor.hosts.local.follow import LogFollower


def _write(path: Path, lines: int, rate: float, started: threading.Event) -> None:
    with path.open("a") as out:
        started.set()
        t0 = time.monotonic()
        for n in range(1, lines + 1):
            out.write(f"worker line {n}\n")
            out.flush()  # one write per line, as a training script's print does
            delay = t0 + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)


async def _batch_sizes(path: Path, lines: int, rate: float, work_s: float) -> list[int]:
    """Follow ``path`` while ``lines`` are written at ``rate``; ``work_s`` of blocking work per batch."""
    follower = LogFollower(path, use_inotify=True, safety_interval=60.0)
    started = threading.Event()
    writer = threading.Thread(target=_write, args=(path, lines, rate, started))
    sizes: list[int] = []
    writer.start()
    started.wait()
    try:
        async with follower:
            async for batch in follower.records():
                sizes.append(len(batch))
                time.sleep(work_s)  # noqa: ASYNC251 - the loop busy with this batch (and other jobs), on purpose
                if sum(sizes) >= lines:
                    break
    finally:
        writer.join()
    return sizes


def test_a_busy_log_is_read_in_batches_even_when_its_reader_is_slower(tmp_path: Path) -> None:
    path = tmp_path / "busy.log"
    path.touch()
    sizes = asyncio.run(asyncio.wait_for(_batch_sizes(path, 1500, 1000.0, 0.003), 30))
    assert sum(sizes) == 1500
    # 1000 lines/s read every 20 ms: ~20 lines a batch.  Reading again right after each batch
    # (the old loop) gave the 3 or 4 lines written during the 3 ms of work.
    assert statistics.mean(sizes) >= 8, f"{len(sizes)} batches, mean {statistics.mean(sizes):.1f} lines"


def test_a_quiet_log_is_read_line_by_line(tmp_path: Path) -> None:
    path = tmp_path / "quiet.log"
    path.touch()
    sizes = asyncio.run(asyncio.wait_for(_batch_sizes(path, 20, 40.0, 0.003), 30))
    assert sum(sizes) == 20
    assert max(sizes) <= 2, sizes  # each line read as it comes, not held back to gather more
