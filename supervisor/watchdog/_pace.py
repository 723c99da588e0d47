"""What earlier attempts of the same job showed of each bar's pace: the history a stall bound
and a ``slow`` report start from before this attempt has measured intervals of its own.

The runner reads it from the store (``jobs.paces``) and hands it to the ``Watchdog`` as a
value: the watchdog never reads the store.  A bar is known across attempts by its probe and
description (``BarPace.key``), never by its process (pids change with every launch).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from supervisor.core.events import BoundKind

# A bound from history is _DAY_MARGIN x k x this percentile of the intervals seen, at least
# _MIN_BOUND_S and at least _MAX_MARGIN x the longest interval seen: a pause that happened before (a
# checkpoint written every N steps) is no stall when it happens again, and one step three times the
# 95th percentile (one slow shard on a shared filesystem) is not a stall either: the history only
# says how the bar went on the days measured, and today may be slower.
_HIGH_PERCENTILE = 0.95
_MAX_MARGIN = 1.5
_DAY_MARGIN = 1.5
_MIN_BOUND_S = 1.0
# Intervals of its own an attempt needs before its median says more than the history of how slow
# a step is (``slow`` reports).
OWN_WINDOW = 3
# A step taking this many times the history's high percentile is reported as slow.
SLOW_FACTOR = 2.0


def bar_key(probe: str, desc: str) -> str:
    """A bar as known across attempts: its probe and its description."""
    return f"{probe}|{desc}" if desc else probe


@dataclass(frozen=True)
class BoundSource:
    """Where a stall bound came from, with the history's size when it came from history."""

    kind: BoundKind
    intervals: int = 0
    runs: int = 0
    setting: str = ""  # the spec's field that set a floor (`HealthSpec.stall_floor_setting`); "": its default

    def __str__(self) -> str:
        if self.kind is BoundKind.HISTORY:
            n, runs = self.intervals, self.runs
            return f"history ({n} interval{'s' * (n != 1)} from {runs} run{'s' * (runs != 1)})"
        if self.kind is BoundKind.LEARNED_MIN:
            return "learned_min_s"  # the field that set it
        if self.kind is BoundKind.DEFAULT_FLOOR and self.setting:
            return self.setting  # a floor the spec set is not the default one: named by its field
        return self.kind.value.replace("_", " ")


@dataclass(frozen=True)
class BarPace:
    """The intervals earlier attempts saw between one bar's advances."""

    key: str
    intervals: tuple[float, ...]  # seconds, every stored interval of every run (sorted)
    runs: int  # how many attempts they come from

    @classmethod
    def of(cls, key: str, runs: Iterable[Iterable[float]]) -> BarPace:
        kept = [list(r) for r in runs]
        return cls(key, tuple(sorted(v for r in kept for v in r if v >= 0 and math.isfinite(v))),
                   sum(1 for r in kept if r))

    @property
    def high(self) -> float:
        """The ``_HIGH_PERCENTILE`` interval (nearest rank)."""
        n = len(self.intervals)
        return self.intervals[min(n - 1, max(0, math.ceil(_HIGH_PERCENTILE * n) - 1))]

    def bound(self, k: float) -> float:
        """How long a step may take before it is a stall, by this history alone."""
        return max(_DAY_MARGIN * k * self.high, _MAX_MARGIN * self.intervals[-1], _MIN_BOUND_S)

    def slow_after(self) -> float:
        """How long a step may take before it is reported as slow."""
        return max(SLOW_FACTOR * self.high, _MIN_BOUND_S / 2)

    def source(self) -> BoundSource:
        return BoundSource(BoundKind.HISTORY, len(self.intervals), self.runs)


@dataclass(frozen=True)
class PaceHistory:
    """Each bar's ``BarPace``, by key; empty for a job never run before (or run elsewhere)."""

    bars: Mapping[str, BarPace] = field(default_factory=dict)

    def get(self, key: str) -> BarPace | None:
        pace = self.bars.get(key)
        return pace if pace is not None and pace.intervals else None

    def __len__(self) -> int:
        return len(self.bars)
