"""A read's redraws that change nothing, taken from their counts: no ``Event`` made of them, and
the watchdog handed each run of them as one summary.

A busy bar redraws a thousand times a second, and all but about a hundred of its lines are no
milestone (jobs/milestones.py): they are not stored, and to the watchdog they only move the bar's
count.  ``RedrawRuns`` takes such a line, in the read's order, when the stored milestones can
decide from its count that it is no milestone of the bar it continues (``ProgressMilestones.redraw``;
the bar's latest line is then made an event only if it is still the latest when the attempt is
next written).  The lines it took since the last line it did not take reach the watchdog as one
``Redraws`` (``Watchdog.redrawn``), which folds them in as the lines one by one would, or refuses;
the lines of a refused run are fed one by one (``feed``).  Past the event cap, each line taken
is counted as dropped, as ``EventCap.admits`` counts a progress line that is not stored.

Only lines read as they come (not a backlog dated line by line) are taken, and only while no
alert reads each step (``eta_every_s``, ``eta_at_percent``, a phase still to announce).
"""

from __future__ import annotations

from collections.abc import Callable

from supervisor.core.events import Phase, ProbeEvent, ProbeKind
from supervisor.core.payloads import ProbeFields, jsonable
from supervisor.core.progress import Progress
from supervisor.jobs.event_cap import EventCap
from supervisor.jobs.milestones import ProgressMilestones, Redraw, redraw_counts
from supervisor.probes import Bar, bar_of
from supervisor.watchdog import Redraws, Watchdog, inert

# A Redraw made by tuple.__new__ directly, skipping the named tuple's Python-level __new__ (one a line).
_new = tuple.__new__


class RedrawRuns:
    """One read's redraws between milestones (module docstring).  ``take`` each probe event in
    order; one it did not take is the caller's, after the run before it has been handed over
    (``take`` does that); ``close`` hands over the last run."""

    def __init__(self, watchdog: Watchdog, sieve: ProgressMilestones, cap: EventCap, *, job: str, attempt: int,
                 generation: int, ts: float, at: float, feed: Callable[[list[ProbeEvent]], None]) -> None:
        """``ts``: when the read was made (wall clock: a bar's latest line is stored with it);
        ``at``: the same on the watchdog's clock; ``feed``: the lines of a run the watchdog refused."""
        self._watchdog, self._sieve, self._cap = watchdog, sieve, cap
        self._job, self._attempt, self._generation = job, attempt, generation
        self._ts, self._at, self._feed = ts, at, feed
        self._lines: list[ProbeEvent] = []  # the run not handed over yet
        self._dones: list[int] = []
        self._run: tuple[str, Bar, Phase | None, int] | None = None  # its probe, bar, phase and total

    def take(self, pe: ProbeEvent) -> bool:
        """Whether ``pe`` was taken (no event is to be made of it); False: it is the caller's."""
        fields = pe.fields
        progress = counts = None
        if pe.kind is ProbeKind.PROGRESS and pe.failure is None and inert(fields) and jsonable(fields) is fields:
            progress = Progress.read(fields)
            counts = None if progress is None else redraw_counts(progress)
        if progress is None or counts is None:
            if self._run is not None:
                self.close()
            return False
        probe, phase, total = pe.probe, pe.phase, int(counts[1])
        if phase is None and "phase" in fields:
            phase = ProbeFields(fields).phase  # the phase the watchdog reads of the line
        bar = bar_of(probe, fields)  # the same object while the bar's fields are (``bar_of`` keeps them)
        run = self._run
        if run is None or bar is not run[1] or phase is not run[2] or total != run[3] or probe != run[0]:
            self.close()
            run = (probe, bar, phase, total)
        sieve, cap = self._sieve, self._cap
        sieve.latest_only = cap.reached
        if not sieve.redraw(probe, bar, counts, _new(Redraw, (self._job, self._attempt, pe, self._generation, self._ts))):
            self.close()
            return False
        if cap.reached:
            cap.drop()
        self._run = run
        self._lines.append(pe)
        self._dones.append(int(progress.done))
        return True

    def close(self) -> None:
        """Hand the run taken so far to the watchdog."""
        run, lines = self._run, self._lines
        if run is None:
            return
        probe, _, phase, total = run
        self._run = None
        self._lines, self._dones, dones = [], [], tuple(self._dones)
        try:
            taken = self._watchdog.redrawn(Redraws(probe, lines[0].fields, phase, total, dones), self._at)
        except Exception:  # noqa: BLE001 - fed one by one, a fault in judging is contained and said (runner's note)
            taken = False
        if not taken:
            self._feed(lines)

