"""The straggler: one rank of an attempt well behind the others, now.

Each process's bar is its own ``Track`` (``BarBook`` tells them apart by the process prefix a
line carries: ``[rank1]:``, torchrun's ``[default1]:``); they are compared here, with no history
needed.  At each step of a process's bar, the step's time per item is compared with the median
of its peers' rates (the same bar of every other process, those already at their end too: a rank
still going when the others are done is the straggler it is); a bar slower than
``factor`` x that median for ``steps`` steps in a row is a straggler, reported once per such
streak.  A straggler is a warning, never a verdict: a rank on a slower GPU is still working,
and the stall rules judge one that stops.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from supervisor.watchdog._progress import Track


@dataclass(frozen=True, slots=True)
class Straggler:
    """One process's bar found behind its peers: what the warning says."""

    probe: str
    bar: str  # its label: the bar's description or probe, with its process
    process: str  # "rank=1", "default1", "rank=1 pid=4242": which process, as its lines said
    done: int
    total: int | None
    step_s: float  # the latest step's time per item
    rate_s: float | None  # its own median time per item
    peers_rate_s: float  # the median of its peers' rates (s per item)
    peers: int
    factor: float
    steps: int  # the streak that made it one


@dataclass
class StragglerWatch:
    """Streaks of slow steps by track; found stragglers until taken."""

    factor: float | None = 2.0  # None: off
    steps: int = 5
    _streaks: dict[int, int] = field(default_factory=dict)  # by the track's bar id, while in a streak
    found: list[Straggler] = field(default_factory=list)

    def stepped(self, key: int, track: Track, tracks: Iterable[Track]) -> None:
        """``track`` (bar id ``key``) advanced; ``tracks``: every bar of the attempt."""
        factor = self.factor
        if factor is None or not track.process or not track.per_item:
            return
        rates = [rate for t in tracks if t is not track and t.key == track.key and t.process
                 and t.process != track.process and not t.retired and (rate := t.rate()) is not None]
        if not rates:
            return
        peers = statistics.median(rates)
        step = track.per_item[-1]
        if step <= factor * peers:
            self._streaks.pop(key, None)
            return
        streak = self._streaks[key] = self._streaks.get(key, 0) + 1
        if streak == self.steps:  # once per streak: a rank slow for hours is one warning, not thousands
            self.found.append(Straggler(track.probe, track.bar, track.process, track.done, track.total, step,
                                        track.rate(), peers, len(rates), factor, streak))

    def forget(self, key: int) -> None:
        self._streaks.pop(key, None)

    def take(self) -> list[Straggler]:
        found, self.found = self.found, []
        return found
