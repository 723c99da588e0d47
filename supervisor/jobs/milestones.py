"""Which progress events are stored: a bar's milestones, not each redraw.

A tqdm bar redraws for every step it counts: a 20,000-step bar is 20,001 progress lines, and an
18-hour attempt hundreds of thousands.  The watchdog sees every one of them (in memory: its
stall bounds need each step); the store keeps, per attempt and per bar, only:

* the bar's first line;
* for a bar with a total, each change of its whole percent (at most about 100 per bar);
* for a bar without one, at most one line per ``interval_s`` (30 s);
* its last: the line that reaches the bar's total, and otherwise its latest line, stored with
  each write in place of the latest line stored before it, so that a bar's history always ends
  with the count it really reached (a stall at 4/8 reads 4/8, not the 3/8 of an earlier percent),
  however the attempt ends and whenever the daemon stops.

Bars are told apart as the watchdog and the replay tell them (probes' ``BarBook``: the probe,
the bar's description and the process drawing it).  Pure: the caller passes the time in.

Bounded however many bars a log draws (100,000 one-step bars: tqdm over files): a bar is held
only while the book may still continue it, or until its latest line is stored; and past the
attempt's event cap, where a new bar's only row is the one standing for its end, the stand-ins
of at most ``PAST_CAP_BARS`` such bars are kept: a newer one's replaces the oldest's.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from supervisor.core.events import Event, EventKind, ProbeEvent
from supervisor.core.payloads import ProbeFields, jsonable
from supervisor.core.progress import Progress
from supervisor.probes import Bar, BarBook

INTERVAL_S = 30.0  # a bar without a total: at most one stored line per this long
PAST_CAP_BARS = 64  # bars first drawn past the event cap whose stand-in rows are kept


class Redraw(NamedTuple):
    """A bar's latest line taken from its count, with no ``Event`` made of it yet (``redraw``): most
    are replaced by the next redraw before any write, and ``to_save`` makes events of the others.
    A named tuple: one is made for each such line."""

    job: str
    attempt: int
    line: ProbeEvent
    generation: int  # of the log it was read from
    ts: float  # when it was read (wall clock)

    def event(self) -> Event:
        """The line's event, as it would have been made when read."""
        pe = self.line
        return Event(job=self.job, attempt=self.attempt, kind=EventKind.PROGRESS, message=pe.line, ts=self.ts,
                     probe=pe.probe, phase=pe.phase, offset=pe.offset, generation=self.generation,
                     data=ProbeFields(jsonable(pe.fields)).to_json())


@dataclass
class _Kept:
    """One bar's stored history: its last milestone, its latest line, and the row standing for it."""

    done: float  # the last milestone's count
    percent: int | None
    at: float
    seen: float  # the latest line's count (a milestone or not)
    latest: Event | Redraw | None = None  # the latest line, when it is no milestone and not stored yet
    row: int | None = None  # the stored row of an earlier such line (goes when a later line comes)


class ProgressMilestones:
    """One attempt's progress events, sieved (module docstring).

    ``keep`` decides once per event whether it is a milestone.  A bar's latest line that is no
    milestone is stored too, standing in for the bar's end until a later line replaces it
    (``to_save`` gives those lines and the rows they replace, ``saved`` takes the rows' ids once
    stored), so that the store always ends each bar with its true latest count: what a daemon
    started again rebuilds the stall clock from, and what ``events`` shows as the last step."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._book = BarBook()
        self._bars: dict[int, _Kept] = {}
        self._replaced: list[int] = []  # rows of lines a later line of their bar replaces
        # Past the attempt's event cap (event_cap.py): a known bar's lines are no milestones, its latest is kept in place.
        self.latest_only = False
        self._past_cap: deque[int] = deque()  # bars first drawn past the cap, oldest first

    def keep(self, event: Event, now: float) -> bool:
        """Whether ``event`` is a milestone; anything but a progress line with a count always is."""
        if event.kind is not EventKind.PROGRESS:
            return True
        payload = ProbeFields.of(event)
        progress = payload.progress
        counts = None if progress is None else _counts(progress)
        if progress is None or counts is None:
            return True  # not a count this sieve can read: kept as it came
        done, total = counts
        run, new = self._book.place(event.probe or "progress", payload.fields, done, total)
        kept = self._bars.get(run.id)
        percent = progress.percent
        if new or kept is None:
            self._bars[run.id] = _Kept(done, percent, now, done)
            self._forget_finished()
            if self.latest_only:  # past the cap, a new bar too is its latest line, in place
                self._bars[run.id].latest = event
                self._past_cap.append(run.id)
                if len(self._past_cap) > PAST_CAP_BARS:
                    self._drop(self._past_cap.popleft())
                return False
            return True
        if done == kept.seen:
            return False  # the same step drawn again: nothing new
        kept.seen = done
        if kept.row is not None:  # a later line of the bar: the row standing for its end goes
            self._replaced.append(kept.row)
            kept.row = None
        if total is not None and total > 0:
            due = percent != kept.percent or done >= total
        else:
            due = now - kept.at >= self.interval_s
        if due and not self.latest_only:
            kept.done, kept.percent, kept.at, kept.latest = done, percent, now, None
            return True
        kept.latest = event
        return False

    def redraw(self, probe: str, seen: Bar, counts: tuple[float, float, int], line: Redraw) -> bool:
        """``keep`` decided from a progress line's probe, bar (``bar_of`` its fields) and ``counts``
        (``redraw_counts``), before an ``Event`` is made of it: True when it is no milestone of the
        bar it continues (``line`` then stands for the bar's latest line); False, with nothing
        changed, when ``keep`` must decide from its event (a new bar, a milestone, one that is not
        the most recent bar it may continue)."""
        recent = self._book.recent
        if not recent:
            return False
        done, total, percent = counts
        run = recent[-1]  # the bar ``BarBook.place`` gives a line that fits the most recent one
        bar = run.bar
        if bar.probe != probe or bar.desc != seen.desc or (seen.process and bar.process != seen.process):
            return False
        if done < run.done or run.total != total:
            return False
        kept = self._bars.get(run.id)
        if kept is None:
            return False
        if done == kept.seen:
            return True  # the same step drawn again: nothing new
        if percent != kept.percent or done >= total:
            return False  # a milestone (or, past the cap, the bar's latest): ``keep`` takes it
        run.done = kept.seen = done
        if kept.row is not None:  # a later line of the bar: the row standing for its end goes
            self._replaced.append(kept.row)
            kept.row = None
        kept.latest = line
        return True

    def resume(self, stored: list[Event]) -> None:
        """Take up the bars of an attempt a daemon before this one stored (re-adoption):
        ``stored``, its progress rows in the order stored.  A bar whose last row is a stand-in
        for its end (no milestone: the same whole percent, or the same ``interval_s`` slot, as
        the row before it) gets that row back as the one its next line replaces; otherwise the
        restarted daemon would store a second first line beside it and leave it orphaned."""
        rows: dict[int, list[tuple[Event, Progress]]] = {}
        for event in stored:
            payload = ProbeFields.of(event)
            progress = payload.progress if event.kind is EventKind.PROGRESS else None
            counts = None if progress is None else _counts(progress)
            if progress is None or counts is None or event.id is None:
                continue
            run, new = self._book.place(event.probe or "progress", payload.fields, *counts)
            if new:
                rows[run.id] = []
            rows.setdefault(run.id, []).append((event, progress))
        for bar, events in rows.items():
            last, last_progress = events[-1]
            done, total = float(last_progress.done), _total(last_progress)
            percent = last_progress.percent
            kept = _Kept(done, percent, last.ts, done)
            if len(events) > 1:
                before, before_progress = events[-2]
                before_done = float(before_progress.done)
                before_percent = before_progress.percent
                if percent is not None:
                    stand_in = percent == before_percent and total is not None and done < total
                else:
                    stand_in = last.ts - before.ts < self.interval_s
                if stand_in:
                    kept = _Kept(before_done, before_percent, before.ts, done, row=last.id)
            self._bars[bar] = kept
        self._forget_finished()

    @property
    def bars_held(self) -> int:
        """How many bars this sieve holds state for (bounded: module docstring)."""
        return len(self._bars)

    def _drop(self, bar: int) -> None:
        """A bar drawn past the cap gives way to a newer one: its stand-in row goes too."""
        kept = self._bars.pop(bar, None)
        if kept is not None and kept.row is not None:
            self._replaced.append(kept.row)

    def _forget_finished(self) -> None:
        """Bars the book can no longer continue, their latest line stored: nothing left to do
        for them (those drawn past the cap are held until ``_drop``, their row with them)."""
        open_bars = {run.id for run in self._book.recent} | set(self._past_cap)
        for bar in [bar for bar, kept in self._bars.items() if bar not in open_bars and kept.latest is None]:
            del self._bars[bar]

    def sieve(self, events: list[Event], now: float) -> list[Event]:
        """The milestones among ``events``, in their order."""
        return [event for event in events if self.keep(event, now)]

    def pending(self) -> bool:
        """A bar's latest line is not stored yet."""
        return any(kept.latest is not None for kept in self._bars.values())

    def to_save(self) -> tuple[list[Event], list[int]]:
        """What completes the stored history now: each bar's latest line not stored yet (in log
        order; the event of a line ``redraw`` took is made now), and the stored rows of the
        earlier lines they replace."""
        latest = []
        for kept in self._bars.values():
            if isinstance(kept.latest, Redraw):
                kept.latest = kept.latest.event()
            if kept.latest is not None:
                latest.append(kept.latest)
        return sorted(latest, key=lambda e: (e.generation, e.offset or 0)), list(self._replaced)

    def saved(self) -> None:
        """``to_save``'s lines are stored (their ids assigned) and the rows they replace deleted."""
        for kept in self._bars.values():
            if isinstance(kept.latest, Event):
                kept.row, kept.latest = kept.latest.id, None
        self._replaced.clear()
        self._forget_finished()


def redraw_counts(progress: Progress) -> tuple[float, float, int] | None:
    """A line's count, total and whole percent as ``keep`` compares them; None when ``redraw``
    cannot decide from them (no finite count, no positive finite total)."""
    counts = _counts(progress)
    percent = progress.percent
    if counts is None or percent is None or counts[1] is None:
        return None
    return counts[0], counts[1], percent


def _counts(progress: Progress) -> tuple[float, float | None] | None:
    """A line's count and total as the sieve compares them: None for a count that is no finite
    number (such a line is kept as it came), and an infinite total is none."""
    done = float(progress.done)
    return None if not _isfinite(done) else (done, _total(progress))


def _total(progress: Progress) -> float | None:
    total = progress.total
    return None if total is None or not _isfinite(total) else float(total)


_isfinite = math.isfinite
