"""A cap on the events one attempt stores: never an unbounded history, never a silent gap.

Milestones (jobs/milestones.py) keep a bar to about a hundred rows, but a log can hold any
number of bars, metric lines (a loss per step) and info lines, each a stored event.  Once an
attempt has stored ``limit`` events read from its log, its further progress, metric and info
lines are no longer stored; its phases and failures always are (few, and what the verdict and
the root cause are read from), and each bar's latest count still is, in place (the bar's
stand-in row).  The attempt says so once, with an ``action`` event naming the cap and the
setting, so that a gap in its history is never silent.  Pure: the runner stores what it admits.
"""

from __future__ import annotations

from supervisor.core.events import Event, EventKind

DEFAULT_LIMIT = 10_000  # about 4 MB of rows per attempt; 8 long attempts stay well within 50 MB
# What goes past the cap: the bulk kinds.  Phases and failures are never dropped.
_BULK = frozenset({EventKind.PROGRESS, EventKind.METRIC, EventKind.INFO})


class EventCap:
    """One attempt's log events counted against its cap (module docstring)."""

    def __init__(self, limit: int = DEFAULT_LIMIT, stored: int = 0) -> None:
        self.limit = limit
        self.stored = stored  # events of the attempt already stored (a re-adopted one's, counted)
        self.dropped = 0
        self._said = stored >= limit  # a daemon before this one reached it and said so

    @property
    def reached(self) -> bool:
        return self.stored >= self.limit

    def admit(self, events: list[Event]) -> list[Event]:
        """The events of ``events`` to store, in their order; the rest are counted as dropped."""
        return [event for event in events if self.admits(event)]

    def admits(self, event: Event, *, kept: bool = True) -> bool:
        """Whether ``event`` is stored (counted if so); ``kept``: whether the milestones keep it.
        Past the cap every bulk line counts as dropped: none is stored as its own row."""
        if event.kind in _BULK and self.reached:
            self.dropped += 1
            return False
        self.stored += kept
        return kept

    def drop(self) -> None:
        """A bulk line past the cap, counted without an event made of it (``admits`` says False
        for every such line)."""
        self.dropped += 1

    def notice(self) -> str | None:
        """The one message saying the cap was reached, the first time it is asked after it was."""
        if self._said or not self.dropped:
            return None
        self._said = True
        return (f"this attempt stored {self.limit} events read from its log (events_per_attempt): its further "
                "progress, metric and info lines are not stored; each bar's latest count still is, "
                "and its phases and failures are")
