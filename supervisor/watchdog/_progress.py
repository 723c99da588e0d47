"""Progress-rate tracking: one progress bar's position, when it last advanced and how fast it
goes (medians over a bounded window, so the bounds adapt without memory growing)."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from supervisor.core.progress import BarProgress

# Enough intervals for a stable median without letting a million-step training bar grow
# memory without bound.
_MAX_INTERVALS = 256  # the median of the recent intervals: adapts, and stays cheap to recompute


@dataclass(frozen=True)
class ProgressState:
    """Where one progress probe stands.  ``rate`` is the median seconds per item."""

    probe: str
    done: int
    total: int | None
    rate: float | None
    eta_s: float | None
    last_advance_at: float
    bar: str = ""  # which bar: its description, else the probe, with its process

    def standing(self) -> BarProgress:
        """Where the bar stands, as the attempt's row, a runner's snapshot and ``status`` show it."""
        return BarProgress(self.probe, self.done, self.total, self.rate, self.eta_s, self.bar)


@dataclass
class Track:
    """One progress bar being watched: when it last advanced and how fast it goes."""

    probe: str
    done: int
    total: int | None
    last_advance_at: float
    bar: str = ""  # see ProgressState.bar
    key: str = ""  # the bar across attempts (``_pace.bar_key``): what its history is stored under
    process: str = ""  # the process whose bar it is ("rank=1"), as its lines' prefix said; "" if none
    retired: bool = False  # its phase is over: shown as the last progress, no longer watched
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=_MAX_INTERVALS))
    per_item: deque[float] = field(default_factory=lambda: deque(maxlen=_MAX_INTERVALS))
    # Sorted copies of the two windows: the daemon asks for the bound after every event.
    _intervals_sorted: list[float] = field(default_factory=list)
    _per_item_sorted: list[float] = field(default_factory=list)
    # The count at ``last_advance_at``: advances read in one batch share its time, and the items
    # between two distinct times are what one measured interval covers.
    _done_at_last_time: int = -1

    def __post_init__(self) -> None:
        self._done_at_last_time = self.done

    @property
    def finished(self) -> bool:
        return self.total is not None and self.done >= self.total

    @property
    def watched(self) -> bool:
        """Still expected to advance: neither at its end nor left behind by a later phase."""
        return not (self.finished or self.retired)

    def advance(self, done: int, at: float) -> None:
        """The bar reached ``done`` at ``at``.  Advances that arrive in one read carry the read's
        time: how they were spaced is not known, so they measure nothing apart (a daemon that read
        the first five shards of a load together learned "0.00 s/it" and showed it); the next
        distinct time measures them all as one interval over their items."""
        if at > self.last_advance_at:
            interval = at - self.last_advance_at
            _push(self.intervals, self._intervals_sorted, interval)
            _push(self.per_item, self._per_item_sorted, interval / (abs(done - self._done_at_last_time) or 1))
            self.last_advance_at = at
            self._done_at_last_time = done
        self.done = done

    def median_interval(self) -> float | None:
        return _median(self._intervals_sorted)

    @property
    def measured(self) -> int:
        """How many intervals this attempt has measured (up to the window's size)."""
        return len(self.intervals)

    def rate(self) -> float | None:
        return _median(self._per_item_sorted)

    def state(self) -> ProgressState:
        rate = self.rate()
        eta = None
        if rate is not None and self.total is not None:
            eta = max(0, self.total - self.done) * rate
        return ProgressState(self.probe, self.done, self.total, rate, eta, self.last_advance_at, self.bar)


def _push(window: deque[float], ordered: list[float], value: float) -> None:
    """Append to a bounded window, keeping a sorted copy of it: a fast bar advances hundreds of
    times a second, and the median is asked for after each advance."""
    if len(window) == window.maxlen:
        del ordered[bisect.bisect_left(ordered, window[0])]
    window.append(value)
    bisect.insort(ordered, value)


def _median(ordered: list[float]) -> float | None:
    n = len(ordered)
    if n == 0:
        return None
    middle = n // 2
    return ordered[middle] if n % 2 else (ordered[middle - 1] + ordered[middle]) / 2
