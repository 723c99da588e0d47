"""Re-adopting an attempt after a daemon restart.

The watchdog is rebuilt from the stored events *at their own times*: the attempt's start, each
phase and progress step, as they were stored.  Replayed at the restart's time instead, every
interval would read zero (a rate of 0.00 s/it, then one far too fast) and every deadline
(stall, silence, phase) would start again from the restart.  The log written while no daemon
watched is dated by its place in the log (``_context.Backlog``), a remote log's too (its host says its
size and age).  A ``daemon_restarted`` event says how long the attempt went unwatched.
``Readoption.live`` makes the attempt's ``Live`` from its stored row, ``catch_up`` asks its host
what was written meanwhile; the runner watches it as it would one it launched (``AttemptWatch``),
judging it only once that is read.
"""

from __future__ import annotations

import time

from supervisor.core.events import Event, EventKind, JobState
from supervisor.core.payloads import ActionData, RestartData
from supervisor.hosts.base import LogStatReader, ProcessHandle
from supervisor.jobs.event_cap import EventCap
from supervisor.jobs.runner import _heartbeat as heartbeat
from supervisor.jobs.runner._alerts import Alerts
from supervisor.jobs.runner._context import CATCH_UP_STILL_S, CatchUp, Live, RunnerContext, backlog_of
from supervisor.jobs.runner._journal import Journal
from supervisor.jobs.runner._launch import Paces
from supervisor.jobs.runner._watching import clock_at, output_read_to, replay
from supervisor.notify import notices
from supervisor.spec.model import JobSpec
from supervisor.store.database import AttemptRow, EventQuery
from supervisor.watchdog import format_duration

# What the watchdog folds: every phase and failure (few, and each one counts), and the latest
# steps, metrics and heartbeats (a long run stores millions; a rate is the median of the last
# 256 steps, a deadline runs from the last one).
_RARE_KINDS = [EventKind.PHASE.value, EventKind.FAILURE.value]
_FREQUENT_KINDS = [[EventKind.PROGRESS.value], [EventKind.METRIC.value, EventKind.INFO.value]]  # each its own window
_FREQUENT_REPLAYED = 4096
_PAGE = 10_000
# The kinds read from the log: what the event cap counts (event_cap.py).
_LOG_KINDS = (EventKind.PHASE, EventKind.PROGRESS, EventKind.FAILURE, EventKind.METRIC, EventKind.INFO)
Anchor = tuple[int, float]  # (offset, wall time) of a record known read


class Readoption:
    """What re-adopting one attempt needs: the runner's context, journal, alerts and paces."""

    def __init__(self, spec: JobSpec, ctx: RunnerContext, journal: Journal, alerts: Alerts, paces: Paces) -> None:
        self._job = spec.name
        self._health = spec.health
        self._ctx = ctx
        self._journal = journal
        self._alerts = alerts
        self._paces = paces

    def live(self, row: AttemptRow, unreachable_since: float | None,
             gpu_baseline: dict[int, int]) -> tuple[Live, Anchor]:
        """The attempt of ``row`` watched again: after a daemon restart, or (``unreachable_since``:
        since when) once its host answers again; and the latest record of its log known read
        (``catch_up`` reads the log from there).  ``gpu_baseline``: the GPU memory in use now."""
        ctx, clock = self._ctx, self._ctx.clock
        handle = ProcessHandle(pid=row.pid or 0, start_time=row.start_time, pgid=row.pgid or row.pid or 0,
                               tag=row.tag, log_path=row.log_path, status_path=row.status_path,
                               scheduler_id=row.scheduler_id)
        watchdog = self._paces.new_watchdog(row.n, started_at=clock_at(clock, row.started))
        stored = ctx.store.count_events(EventQuery(self._job, attempt=row.n))
        logged = sum(stored.get(kind.value, 0) for kind in _LOG_KINDS)
        live = Live.of(row, handle, watchdog, event_cap=EventCap(ctx.events_per_attempt, logged),
                       gpu_baseline=gpu_baseline, notify=heartbeat.bind(ctx, row.tag))
        # Replay what was already stored, each at its own time, so that phase, progress, rate,
        # failure and every deadline are what they were, not reset by the restart.
        probe_events = self._replayed(row.n)
        replay(self._journal, live, probe_events, clock)
        if live.notify is not None:
            # Pings sent while no daemon listened are lost, not missed.  An attempt known to ping (its
            # first ping stored, or a spec that asks for pings) is taken as just pinged: it may print
            # nothing for hours, and its next ping is due within its own period.  Any other counts
            # `watchdog_s` from now, and silence from its log's own past.
            if self._health.watchdog_s is not None or heartbeat.pings(probe_events):
                watchdog.pinged(clock())
            else:
                watchdog.listening(clock())
        if unreachable_since is not None:
            self._say_reachable(live, unreachable_since)
        else:
            self._say_restarted(live, ctx.store.events(self._job, attempt=row.n, limit=1, latest=True))
        return live, _anchor(row, probe_events)

    async def catch_up(self, live: Live, anchor: Anchor) -> CatchUp:
        """What the watch of ``live`` must read before it judges: the log written while nobody
        watched (a remote one too: its size and age are asked of its host), and whether its
        command has ended meanwhile.  Asked of the host, so a host that cannot be reached raises
        here (``ConnectionLost``, ``HostRefused``): the attempt waits for it, unjudged."""
        host, row = self._ctx.host, live.row
        exited = await host.exit_status(live.handle) is not None  # asked first: written after the log's last line
        log_stat = await host.log_stat(row.log_path) if isinstance(host, LogStatReader) else None
        backlog = None if log_stat is None else backlog_of(row.log_generation, row.log_offset, anchor, log_stat.size,
                                                           log_stat.modified_at, time.time())
        if backlog is None:
            # The old daemon read the log to its end, lines no probe matched included: its last line
            # was written at the log's last change.  Where that is not known (a host that cannot say),
            # the silence clock starts again from now, rather than from an older event that would make
            # it look silent.
            wall = time.time() if log_stat is None else min(log_stat.modified_at, time.time())
            output_read_to(live, wall, self._ctx.clock)
        until = None if backlog is None else self._ctx.clock() + CATCH_UP_STILL_S
        return CatchUp(backlog, until, exited=exited)

    def _replayed(self, n: int) -> list[Event]:
        """The stored events of attempt ``n`` the watchdog is fed again, in the order they came."""
        store, job = self._ctx.store, self._job
        rare: list[Event] = []
        while True:
            after = rare[-1].id or 0 if rare else 0
            page = store.events(job, attempt=n, kinds=_RARE_KINDS, after_id=after, limit=_PAGE)
            rare += page
            if len(page) < _PAGE:
                break
        recent = [e for kinds in _FREQUENT_KINDS
                  for e in store.events(job, attempt=n, kinds=kinds, limit=_FREQUENT_REPLAYED, latest=True)]
        return sorted(rare + recent, key=lambda e: e.id or 0)

    def _say_reachable(self, live: Live, unreachable_since: float) -> None:
        """The host answers again (this daemon never stopped): one event, the job's reason, an alert."""
        n = live.row.n
        down_s = max(0.0, time.time() - unreachable_since)
        where = self._ctx.host.name
        self._journal.action(n, f"{where} reachable again: attempt {n} ({_what(live)}) re-adopted after "
                                f"{format_duration(down_s)} unreachable", ActionData(down_s=down_s))
        self._journal.set_job(JobState.RUNNING, f"attempt {n} (re-adopted; {where} was unreachable for {format_duration(down_s)})")
        self._alerts.send_soon(live, notices.reachable(self._alerts.about(live), where, down_s))

    def _say_restarted(self, live: Live, last: list[Event]) -> None:
        """One event and the job's reason: the attempt is watched again, and for how long it was not.
        The previous daemon was last known alive at its last heartbeat or at the last event it
        stored of this attempt, whichever came later."""
        n = live.row.n
        known = [t for t in (self._ctx.down_since, last[-1].ts if last else None) if t is not None]
        gone_since = max(known) if known else None
        gone_s = None if gone_since is None else max(0.0, time.time() - gone_since)
        for_how_long = "for an unknown time" if gone_s is None else f"for {format_duration(gone_s)}"
        self._journal.record(n, EventKind.DAEMON_RESTARTED,
                             f"daemon restarted: attempt {n} ({_what(live)}) went unwatched {for_how_long}",
                             RestartData(gone_s, gone_since, live.row.pid))
        self._journal.set_job(JobState.RUNNING, f"attempt {n} (re-adopted; the daemon was down {for_how_long})")


def _what(live: Live) -> str:
    return f"pid {live.row.pid}" if live.row.scheduler_id is None else f"scheduler job {live.row.scheduler_id}"


def _anchor(row: AttemptRow, probe_events: list[Event]) -> Anchor:
    """The (offset, wall time) of the latest record of the log known read: the last stored event
    of its generation, else the start of the log at the attempt's start."""
    known = [e for e in probe_events if e.generation == row.log_generation and e.offset is not None]
    return (known[-1].offset or 0, known[-1].ts) if known else (0, row.started)
