"""The peak memory of a local attempt where its cgroup does not count it (cgroup v2 without the
memory controller delegated, or no cgroup at all): the resident memory of its processes, sampled.

A sample sums the RSS of every live process of the attempt (pages shared between them counted in
each: an upper bound), taken when the attempt starts being waited for and then each
``SAMPLE_EVERY_S``: a peak shorter than that may be missed.  Hence the figure is marked as
sampled wherever it is shown.  One owner: the local host keeps one ``RssPeaks`` for its attempts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import psutil

SAMPLE_EVERY_S = 1.0


class RssPeaks:
    """The highest sample of each attempt's processes' resident memory, by tag, until asked."""

    def __init__(self) -> None:
        self._peaks: dict[str, int] = {}  # tag -> bytes

    async def sample_until_cancelled(self, tag: str, processes: Callable[[], list[psutil.Process]]) -> None:
        """Sample ``processes()`` each ``SAMPLE_EVERY_S`` until the task is cancelled (its attempt ended)."""
        while True:
            total = await asyncio.to_thread(_resident, processes)
            if total:
                self._peaks[tag] = max(total, self._peaks.get(tag, 0))
            await asyncio.sleep(SAMPLE_EVERY_S)

    def take_mib(self, tag: str) -> int | None:
        """The attempt's sampled peak in MiB (rounded up), forgotten once taken; None: never sampled."""
        peak = self._peaks.pop(tag, None)
        return None if peak is None else -(-peak // (1024 * 1024))


def _resident(processes: Callable[[], list[psutil.Process]]) -> int:
    total = 0
    for proc in processes():
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total
